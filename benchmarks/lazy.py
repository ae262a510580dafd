"""A lazily read map-style dataset and a small CNN: the user code of the data benchmarks.

    data=custom data.target=benchmarks.lazy:build data.kwargs.path=IMAGES.npy
        data.kwargs.num_train=8192 data.kwargs.num_val=1024
    model=custom model.target=benchmarks.lazy:SmallCnn

Images live in one (N, H, W, 3) uint8 .npy; every __getitem__ opens it again with
np.load(mmap_mode='r') and decodes one row (HWC uint8 -> CHW float32 in [-1, 1]), as a
dataset of image files opens and decodes one file per sample. Once the file is in the page
cache this times the per-sample open/index/decode path, not the disk.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

NUM_CLASSES = 10


def labels_path(images_path: Path | str) -> Path:
    path = Path(images_path)
    return path.with_name(path.stem + "-labels.npy")


def write_images(path: Path, num_samples: int, image_size: int, seed: int = 0) -> Path:
    """Random uint8 images and labels (the timing does not depend on what they show)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (num_samples, image_size, image_size, 3), dtype=np.uint8)
    np.save(path, images)
    np.save(labels_path(path), rng.integers(0, NUM_CLASSES, num_samples, dtype=np.int64))
    return path


def decode(image: np.ndarray) -> np.ndarray:
    chw = np.ascontiguousarray(image.transpose(2, 0, 1), dtype=np.float32)
    return chw * (2 / 255) - 1


class LazyImages(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """Rows `rows` of the .npy at `path`, read one sample at a time."""

    num_classes = NUM_CLASSES

    def __init__(self, path: Path | str, rows: np.ndarray) -> None:
        self.path = str(path)
        self.rows = rows
        self.labels = np.load(labels_path(path))[rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        images = np.load(self.path, mmap_mode="r")  # opened per sample, on purpose
        return torch.from_numpy(decode(images[self.rows[index]])), int(self.labels[index])


def build(path: str, num_train: int, num_val: int) -> tuple[LazyImages, LazyImages]:
    """data.target: the first num_train rows for training, the next num_val for validation."""
    return (
        LazyImages(path, np.arange(num_train)),
        LazyImages(path, np.arange(num_train, num_train + num_val)),
    )


class SmallCnn(nn.Module):
    """Two conv-relu-maxpool blocks and a linear layer: about 10 ms per step of 64 32x32
    images on 2 CPU cores, the same order as reading the batch, so the benchmark sees
    both the data path and the step."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, width: int = 16) -> None:
        super().__init__()
        channels, height, width_px = input_shape
        self.layers = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(2 * width * (height // 4) * (width_px // 4), num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)
