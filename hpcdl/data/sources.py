"""One reader per data.name: typed data config -> RawData."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hpcdl.config import schema
from hpcdl.data.cifar import read_cifar10
from hpcdl.data.files import read_files
from hpcdl.data.idx import read_mnist
from hpcdl.data.raw import RawData
from hpcdl.errors import ConfigError

# sklearn's digits are 4-bit counts (0..16) of set pixels in 4x4 cells of 32x32 bitmaps.
DIGITS_MAX_VALUE = 16.0
# Typical distance between two synthetic class centres, in units of data.noise, for any
# shape: 6 puts a pair's Bayes error at Phi(-3) = 0.1% for data.noise=1.
SYNTHETIC_CENTER_DISTANCE = 6.0


def read_source(cfg: Any, regression: bool = False) -> RawData:
    """regression: numeric targets instead of class labels (data=files only; validate.py
    refuses the others)."""
    readers: dict[str, Callable[[Any], RawData]] = {
        "breast_cancer": read_breast_cancer,
        "digits": read_digits,
        "mnist": lambda c: read_mnist(require_path(c), as_images=c.as_images),
        "cifar10": lambda c: read_cifar10(require_path(c)),
        "files": lambda c: read_files(
            require_path(c), c.labels_path, c.label_column, regression=regression
        ),
        "synthetic": read_synthetic,
    }
    reader = readers.get(cfg.name)
    if reader is None:
        raise ConfigError(f"data.name={cfg.name!r}: unknown; choose one of {', '.join(readers)}")
    return reader(cfg)


def require_path(cfg: Any) -> str:
    """data.path as a str (build_data's check_data has refused an unset one)."""
    return str(cfg.path)


def read_breast_cancer(cfg: schema.BreastCancerConfig) -> RawData:
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    return RawData(
        x=bunch.data.astype(np.float64),
        y=bunch.target.astype(np.int64),
        class_names=[str(n) for n in bunch.target_names],
    )


def read_digits(cfg: schema.DigitsConfig) -> RawData:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    shape = (1, 8, 8) if cfg.as_images else (64,)
    return RawData(
        x=bunch.data.astype(np.float32).reshape(-1, *shape),
        y=bunch.target.astype(np.int64),
        class_names=[str(n) for n in bunch.target_names],
        pixel_scale=1 / DIGITS_MAX_VALUE,
    )


def read_synthetic(cfg: schema.SyntheticConfig) -> RawData:
    """Gaussian clusters, one per class, the same for a given data.seed."""
    # (ranges: checked by build_data through hpcdl.config.validate.check_data)
    rng = np.random.default_rng(cfg.seed)
    shape = tuple(int(s) for s in cfg.shape)
    # Two centres with per-feature std s lie sqrt(2 * num_features) * s apart on average.
    center_std = SYNTHETIC_CENTER_DISTANCE / np.sqrt(2 * np.prod(shape))
    centers = rng.normal(0.0, center_std, size=(cfg.num_classes, *shape))
    y = rng.permutation(np.arange(cfg.num_samples) % cfg.num_classes).astype(np.int64)
    x = centers[y] + cfg.noise * rng.normal(size=(cfg.num_samples, *shape))
    return RawData(
        x=x.astype(np.float32), y=y, class_names=[f"class_{i}" for i in range(cfg.num_classes)]
    )
