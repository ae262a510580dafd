"""A user's model: model.target='package.module:factory', called with the data's shape."""

from __future__ import annotations

from torch import nn

from hpcdl.config.schema import CustomModelConfig
from hpcdl.errors import ConfigError
from hpcdl.targets import resolve_callable


def build_custom(
    cfg: CustomModelConfig, input_shape: tuple[int, ...], num_classes: int
) -> nn.Module:
    key = f"model.target={cfg.target!r}"
    factory = resolve_callable("model.target", cfg.target)
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
