"""Multi-layer perceptron: flatten -> (Linear, ReLU, Dropout) per hidden size -> logits."""

from __future__ import annotations

import math

from torch import nn

from hpcdl.config.schema import MlpConfig


def build_mlp(cfg: MlpConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Flatten()]
    num_in = math.prod(input_shape)
    for num_out in cfg.hidden_sizes:
        layers += [nn.Linear(num_in, num_out), nn.ReLU(), nn.Dropout(cfg.dropout)]
        num_in = num_out
    layers.append(nn.Linear(num_in, num_classes))
    return nn.Sequential(*layers)
