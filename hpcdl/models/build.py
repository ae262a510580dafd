"""build_model: typed model config + the data's shape -> an nn.Module that returns logits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from hpcdl.config.validate import check_model
from hpcdl.errors import ConfigError
from hpcdl.models.cnn import build_cnn
from hpcdl.models.custom import build_custom
from hpcdl.models.mlp import build_mlp
from hpcdl.models.resnet import build_resnet18

BUILDERS: dict[str, Callable[[Any, tuple[int, ...], int], nn.Module]] = {
    "mlp": build_mlp,
    "cnn": build_cnn,
    "resnet18": build_resnet18,
    "custom": build_custom,
}


def build_model(cfg: Any, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """cfg: one of schema.MODEL_SCHEMAS' dataclasses."""
    builder = BUILDERS.get(cfg.name)
    if builder is None:
        raise ConfigError(f"model.name={cfg.name!r}: unknown; choose one of {', '.join(BUILDERS)}")
    check_model(cfg)  # the ranges, as on the login node
    if num_classes < 1 and cfg.name != "custom":  # a model of yours may not need them
        raise ConfigError(
            f"model={cfg.name} needs the number of outputs, but the data names no classes; "
            "set data.num_classes (or give the dataset a `classes` attribute)"
        )
    return builder(cfg, tuple(int(s) for s in input_shape), num_classes)
