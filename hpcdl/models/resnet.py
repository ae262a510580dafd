"""ResNet-18 for small images (He et al. 2016, CIFAR variant): a 3x3 stride-1 stem and no
max-pool, so 32x32 inputs keep their resolution into the first stage."""

from __future__ import annotations

import torch
from torch import nn

from hpcdl.config.schema import Resnet18Config
from hpcdl.models.checks import require_image_shape

# BasicBlocks per stage and the stages' width multipliers (ResNet-18).
NUM_BLOCKS_PER_STAGE = (2, 2, 2, 2)
STAGE_WIDTH_MULTIPLIERS = (1, 2, 4, 8)


def conv3x3(num_in: int, num_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(num_in, num_out, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    def __init__(self, num_in: int, num_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = conv3x3(num_in, num_out, stride)
        self.bn1 = nn.BatchNorm2d(num_out)
        self.conv2 = conv3x3(num_out, num_out)
        self.bn2 = nn.BatchNorm2d(num_out)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or num_in != num_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(num_in, num_out, 1, stride=stride, bias=False), nn.BatchNorm2d(num_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, num_in_channels: int, num_classes: int, width: int = 64) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            conv3x3(num_in_channels, width), nn.BatchNorm2d(width), nn.ReLU(inplace=True)
        )
        stages: list[nn.Module] = []
        num_in = width
        for i, (num_blocks, multiplier) in enumerate(
            zip(NUM_BLOCKS_PER_STAGE, STAGE_WIDTH_MULTIPLIERS, strict=True)
        ):
            num_out = width * multiplier
            strides = [1 if i == 0 else 2] + [1] * (num_blocks - 1)
            blocks = []
            for stride in strides:
                blocks.append(BasicBlock(num_in, num_out, stride))
                num_in = num_out
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(num_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.pool(self.stages(self.stem(x)))
        return self.fc(torch.flatten(out, 1))


def build_resnet18(cfg: Resnet18Config, input_shape: tuple[int, ...], num_classes: int) -> ResNet18:
    num_in_channels, _, _ = require_image_shape("resnet18", input_shape)
    return ResNet18(num_in_channels, num_classes, width=cfg.width)
