"""One reader per data.name: typed data config -> RawData."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hpcdl.config import schema
from hpcdl.data.cifar import read_cifar10
from hpcdl.data.files import read_files
from hpcdl.data.idx import read_mnist
from hpcdl.data.raw import RawData
from hpcdl.errors import ConfigError, DataError

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
            require_path(c),
            c.labels_path,
            c.label_column,
            regression=regression,
            feature_columns=c.feature_columns,
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
    with bundled_file("breast_cancer.csv").open(encoding="utf-8") as f:
        first = f.readline().strip().split(",")  # "569,30,malignant,benign"
        table = np.loadtxt(f, delimiter=",", ndmin=2)
    num_samples, num_features = int(first[0]), int(first[1])
    if table.shape != (num_samples, num_features + 1):
        raise DataError(f"data=breast_cancer: scikit-learn's copy has shape {table.shape}")
    return RawData(
        x=table[:, :-1].astype(np.float64),
        y=table[:, -1].astype(np.int64),
        class_names=first[2:],
    )


def read_digits(cfg: schema.DigitsConfig) -> RawData:
    table = np.loadtxt(bundled_file("digits.csv.gz"), delimiter=",", ndmin=2)
    shape = (1, 8, 8) if cfg.as_images else (64,)
    return RawData(
        x=table[:, :-1].astype(np.float32).reshape(-1, *shape),
        y=table[:, -1].astype(np.int64),
        class_names=[str(n) for n in range(10)],
        pixel_scale=1 / DIGITS_MAX_VALUE,
    )


def bundled_file(name: str) -> Path:
    """One of the data files that scikit-learn ships (sklearn/datasets/data/NAME), found
    without importing scikit-learn: its import (with scipy's) costs 1.5 s in every process
    that reads the data, each rank included. The values are those of sklearn.datasets'
    load_breast_cancer and load_digits, which read the same files."""
    spec = importlib.util.find_spec("sklearn")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / "datasets" / "data" / name
        if path.is_file():
            return path
    raise DataError(
        f"data: scikit-learn's bundled {name} not found; install scikit-learn "
        "(pip install scikit-learn), which ships the breast_cancer and digits data"
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
