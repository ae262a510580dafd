"""Segmentation networks: images [N, C, H, W] -> per-pixel logits [N, 1, H, W]."""

import torch
import torch.nn.functional as F
from torch import nn


def conv_block(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
        nn.Conv2d(out_channels, out_channels, 3, padding=1),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class TinyUNet(nn.Module):
    """A two-level U-Net (Ronneberger et al. 2015, much smaller). H and W must be even."""

    def __init__(self, in_channels: int = 1, base: int = 8):
        super().__init__()
        self.encode = conv_block(in_channels, base)
        self.bottom = conv_block(base, 2 * base)
        self.up = nn.ConvTranspose2d(2 * base, base, 2, stride=2)
        self.decode = conv_block(2 * base, base)
        self.head = nn.Conv2d(base, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.encode(x)
        deep = self.bottom(F.max_pool2d(skip, 2))
        return self.head(self.decode(torch.cat([skip, self.up(deep)], dim=1)))


class SmoothedThreshold(nn.Module):
    """Baseline: a cell where the locally averaged intensity exceeds a learned threshold
    (two parameters; cheap enough for very large images)."""

    def __init__(self, window: int = 3):
        super().__init__()
        self.window = window
        self.threshold = nn.Parameter(torch.tensor(0.5))
        self.sharpness = nn.Parameter(torch.tensor(10.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gray = x.mean(dim=1, keepdim=True)
        smooth = F.avg_pool2d(gray, self.window, stride=1, padding=self.window // 2)
        return self.sharpness * (smooth - self.threshold)
