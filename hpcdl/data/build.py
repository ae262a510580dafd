"""build_data: typed data config -> preprocessed train/val/test tensors."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

import numpy as np
import torch

from hpcdl.config.schema import FilesConfig
from hpcdl.config.validate import check_data
from hpcdl.data.preprocessing import Preprocessing
from hpcdl.data.raw import RawData
from hpcdl.data.sources import read_source
from hpcdl.data.splits import split_indices
from hpcdl.errors import DataError

# Samples prepared at a time: a split was copied raw, then prepared whole (with the data read
# whole, about 3.5x the prepared tensors' size at the peak).
PREPARE_CHUNK_NUM_ROWS = 4096


@dataclass
class DataSplits:
    """Model-ready CPU tensors: x float32 [N, *input_shape], y int64 [N]."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    class_names: list[str]
    preprocessing: Preprocessing
    # Regression: mean and std of the training targets (for standardize_target); else None.
    target_stats: Optional[tuple[float, float]] = None
    # The training CSV's feature column names and label column (RawData's); else None.
    feature_columns: Optional[list[str]] = None
    label_column: Optional[str] = None
    # Each split's samples' places in their source, in the splits' order: rows of the data
    # file (the official test file for the test split of a source with one), from 0.
    source_rows: Optional[dict[str, np.ndarray]] = None


def build_data(
    cfg: Any,
    regression: bool = False,
    preprocessing: Optional[Preprocessing] = None,
    feature_columns: Optional[list[str]] = None,
) -> DataSplits:
    """cfg: one of schema.DATA_SCHEMAS' dataclasses; regression: numeric targets;
    preprocessing: one fitted before (a checkpoint's, for `hpcdl evaluate` and `predict`),
    applied as it is; None fits one on this data's train split. feature_columns: the
    trained model's, by name: a CSV with the same columns in another order is read in
    this one (the fitted mean/std and the weights are per position)."""
    check_data(cfg)  # the ranges and files, as on the login node
    raw = in_column_order(read_source(cfg, regression=regression), feature_columns)
    split = split_indices(
        raw.y, cfg, has_official_test=raw.has_official_test, stratify=not raw.is_regression
    )
    x_test, test_idx, y_test = test_arrays(raw, split.test)
    if preprocessing is not None:
        check_fits(raw, preprocessing, cfg)
    if preprocessing is None:
        preprocessing = Preprocessing.fit(
            raw.x[split.train], scale=raw.pixel_scale, standardize=cfg.standardize
        )
    return DataSplits(
        x_train=prepared(preprocessing, raw.x, split.train),
        y_train=torch.from_numpy(raw.y[split.train]),
        x_val=prepared(preprocessing, raw.x, split.val),
        y_val=torch.from_numpy(raw.y[split.val]),
        x_test=prepared(preprocessing, x_test, test_idx),
        y_test=torch.from_numpy(y_test),
        num_classes=1 if raw.is_regression else len(raw.class_names),
        input_shape=raw.input_shape,
        class_names=list(raw.class_names),
        preprocessing=preprocessing,
        target_stats=target_stats(raw.y[split.train]) if raw.is_regression else None,
        feature_columns=raw.feature_columns,
        label_column=raw.label_column,
        source_rows={"train": split.train, "val": split.val, "test": test_idx},
    )


def in_column_order(raw: RawData, names: Optional[list[str]]) -> RawData:
    """raw with its feature columns in the order of `names` when it has the same ones in
    another order; else as it is (the caller refuses other columns by name)."""
    have = raw.feature_columns
    if names is None or have is None or have == names or sorted(have) != sorted(names):
        return raw
    if raw.x.ndim != 2 or len(set(names)) != len(names):
        return raw
    order = [have.index(name) for name in names]
    return replace(raw, x=raw.x[:, order], feature_columns=list(names))


def check_fits(raw: RawData, preprocessing: Preprocessing, cfg: Any) -> None:
    """Other data for a trained model (evaluate, predict --split): samples with as many
    values as the training samples, refused naming the file before anything is prepared."""
    trained = preprocessing.input_shape
    if int(np.prod(raw.input_shape)) == int(np.prod(trained)):
        return
    where = f"data.path={cfg.path!r}" if isinstance(cfg, FilesConfig) else f"data={cfg.name}"
    raise DataError(
        f"{where}: samples of shape {raw.input_shape}, the checkpoint's model was trained on "
        f"samples of shape {trained}; give data with those features, or a checkpoint "
        "trained on this data"
    )


def target_stats(y_train: np.ndarray) -> tuple[float, float]:
    """(mean, std) of the training targets; std 1 when they are all equal."""
    values = y_train.astype(np.float64)
    if values.size == 0:
        return 0.0, 1.0
    std = float(values.std())
    return float(values.mean()), std if std > 0 else 1.0


def test_arrays(raw: RawData, test_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the test samples' array, their indices in it, their labels)."""
    if raw.x_test is not None and raw.y_test is not None:
        return raw.x_test, np.arange(len(raw.x_test)), raw.y_test
    return raw.x, test_idx, raw.y[test_idx]


def prepared(preprocessing: Preprocessing, x: np.ndarray, idx: np.ndarray) -> torch.Tensor:
    """preprocessing.apply(x[idx]), PREPARE_CHUNK_NUM_ROWS samples at a time into one float32
    tensor: x[idx] is never copied whole (x may be a memory-mapped .npy)."""
    out = torch.empty((len(idx), *preprocessing.input_shape), dtype=torch.float32)
    for start in range(0, len(idx), PREPARE_CHUNK_NUM_ROWS):
        part = idx[start : start + PREPARE_CHUNK_NUM_ROWS]
        out[start : start + len(part)] = preprocessing.apply(x[part])
    return out
