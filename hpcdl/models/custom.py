"""A user's model: model.target='package.module:factory', called with the data's shape."""

from __future__ import annotations

import importlib

from torch import nn

from hpcdl.config.schema import MISSING, CustomModelConfig
from hpcdl.errors import ConfigError

EXPECTED_FORM = "expected 'package.module:factory', e.g. model.target=mypkg.models:build"


def build_custom(
    cfg: CustomModelConfig, input_shape: tuple[int, ...], num_classes: int
) -> nn.Module:
    key = f"model.target={cfg.target!r}"
    module_name, sep, attr_path = cfg.target.partition(":")
    if cfg.target == MISSING or not sep or not module_name or not attr_path:
        raise ConfigError(f"{key}: {EXPECTED_FORM}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{key}: cannot import {module_name!r} ({exc}); install it or put its folder on "
            f"PYTHONPATH; {EXPECTED_FORM}"
        ) from exc
    factory: object = module
    for attr in attr_path.split("."):
        if not hasattr(factory, attr):
            raise ConfigError(f"{key}: module {module_name!r} has no attribute {attr_path!r}")
        factory = getattr(factory, attr)
    if not callable(factory):
        raise ConfigError(f"{key}: {attr_path!r} is a {type(factory).__name__}, not callable")
    try:
        model = factory(input_shape=input_shape, num_classes=num_classes, **cfg.kwargs)
    except TypeError as exc:
        raise ConfigError(
            f"{key}: calling it with input_shape, num_classes and model.kwargs="
            f"{dict(cfg.kwargs)} failed ({exc}); it must accept those keyword arguments"
        ) from exc
    if not isinstance(model, nn.Module):
        raise ConfigError(f"{key}: returned a {type(model).__name__}, not a torch.nn.Module")
    return model
