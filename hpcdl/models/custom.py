"""A user's model: model.target='package.module:factory', called with the data's shape."""

from __future__ import annotations

import importlib

from torch import nn

from hpcdl.config.schema import CustomModelConfig
from hpcdl.config.validate import TARGET_FORM
from hpcdl.errors import ConfigError


def build_custom(
    cfg: CustomModelConfig, input_shape: tuple[int, ...], num_classes: int
) -> nn.Module:
    key = f"model.target={cfg.target!r}"
    module_name, _, attr_path = cfg.target.partition(":")  # the form: checked by build_model
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{key}: cannot import {module_name!r} ({exc}); install it or put its folder on "
            f"PYTHONPATH; {TARGET_FORM}"
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
