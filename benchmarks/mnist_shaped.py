"""MNIST-shaped data for the time-to-accuracy benchmark, written as MNIST's four IDX files.

No data set can be downloaded here, so the benchmark makes its own: 28x28 uint8 images of
10 classes, each class a template of pen strokes (a shared base stroke plus two of its
own), every sample the template moved by up to 3 pixels, its contrast varied and pixel
noise added. A small CNN needs a few epochs to pass 99% on it, as on MNIST. The files
are MNIST's format exactly, so `data=mnist data.path=DIR` reads them through hpcdl's own
IDX reader, as it reads the real MNIST.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

SIZE = 28
NUM_CLASSES = 10
MAX_SHIFT = 3
NOISE = 90.0  # pixel noise, in 0..255 units


def write_mnist_shaped(folder: Path, num_train: int, num_test: int, seed: int = 0) -> Path:
    """train-/t10k- images and labels (gzipped IDX) in folder; returns folder."""
    rng = np.random.default_rng(seed)
    templates = class_templates(rng)
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, num in (("train", num_train), ("t10k", num_test)):
        images, labels = samples(templates, num, rng)
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", labels)
    return folder


def class_templates(rng: np.random.Generator) -> np.ndarray:
    """[10, 28, 28] float in 0..1: a base stroke every class shares, and two of each's own."""
    base = stroke(rng)
    return np.stack([np.clip(base + stroke(rng) + stroke(rng), 0, 1) for _ in range(NUM_CLASSES)])


def stroke(rng: np.random.Generator) -> np.ndarray:
    """A pen stroke: a line segment in the middle 20x20, drawn with a soft 1.5-pixel pen."""
    start, end = rng.uniform(4, SIZE - 4, size=(2, 2))
    points = start + np.linspace(0, 1, 40)[:, None] * (end - start)
    rows, cols = np.mgrid[0:SIZE, 0:SIZE]
    distance2 = (rows[None] - points[:, 0, None, None]) ** 2 + (
        cols[None] - points[:, 1, None, None]
    ) ** 2
    return np.exp(-distance2 / (2 * 1.5**2)).max(axis=0)


def samples(
    templates: np.ndarray, num: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    labels = rng.integers(NUM_CLASSES, size=num).astype(np.uint8)
    images = np.empty((num, SIZE, SIZE), dtype=np.uint8)
    shifts = rng.integers(-MAX_SHIFT, MAX_SHIFT + 1, size=(num, 2))
    contrast = rng.uniform(0.6, 1.0, size=num)
    for i in range(num):
        image = np.roll(templates[labels[i]], tuple(shifts[i]), axis=(0, 1)) * 255 * contrast[i]
        image += rng.normal(0, NOISE, size=(SIZE, SIZE))
        images[i] = np.clip(image, 0, 255)
    return images, labels


def write_idx(path: Path, array: np.ndarray) -> None:
    """IDX: zero, zero, the type code (0x08: uint8), the number of dimensions, each size
    (big-endian int32), then the values."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(
        f">{array.ndim}i", *array.shape
    )
    with gzip.open(path, "wb", compresslevel=1) as file:
        file.write(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())
