"""Small CNN: (Conv, ReLU, MaxPool(2)) per entry of model.channels -> MLP head."""

from __future__ import annotations

from torch import nn

from hpcdl.config.schema import CnnConfig
from hpcdl.models.checks import require_image_shape


def build_cnn(cfg: CnnConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    num_in, height, width = require_image_shape("cnn", input_shape)
    k = cfg.kernel_size
    layers: list[nn.Module] = []
    for num_out in cfg.channels:
        layers += [nn.Conv2d(num_in, num_out, k, padding=k // 2), nn.ReLU()]
        # padding k//2 keeps the size for odd k and adds one for even k.
        height, width = height + 2 * (k // 2) - k + 1, width + 2 * (k // 2) - k + 1
        if height // 2 >= 1 and width // 2 >= 1:
            layers.append(nn.MaxPool2d(2))
            height, width = height // 2, width // 2
        num_in = num_out
    layers += [
        nn.Flatten(),
        nn.Linear(num_in * height * width, cfg.hidden_size),
        nn.ReLU(),
        nn.Dropout(cfg.dropout),
        nn.Linear(cfg.hidden_size, num_classes),
    ]
    return nn.Sequential(*layers)
