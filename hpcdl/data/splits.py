"""Stratified train/val/test index splits and k-fold cross-validation, fixed by a seed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from hpcdl.errors import ConfigError, DataError


@dataclass
class SplitIndices:
    train: np.ndarray  # int64, sorted
    val: np.ndarray
    test: np.ndarray  # empty when the source brings its own test set


def split_indices(
    y: np.ndarray, cfg: Any, *, has_official_test: bool, stratify: bool = True
) -> SplitIndices:
    """Indices into y. Without an official test set: a stratified test split of
    data.test_fraction first, then val (data.val_fraction of all of y, or a k-fold fold)
    from the rest. With one, y is the official train set and only val comes out of it."""
    everything = np.arange(len(y), dtype=np.int64)
    if has_official_test:
        rest, test = everything, everything[:0]
    else:
        num_test = round(cfg.test_fraction * len(y))
        rest, test = stratified_split(
            everything,
            y if stratify else None,
            num_test,
            cfg.split_seed,
            f"data.test_fraction={cfg.test_fraction}",
        )
    if cfg.num_folds:
        labels = y[rest] if stratify else None
        train, val = kfold_split(rest, labels, cfg.num_folds, cfg.fold, cfg.split_seed)
    else:
        num_val = round(cfg.val_fraction * len(y))
        train, val = stratified_split(
            rest,
            y[rest] if stratify else None,
            num_val,
            cfg.split_seed,
            f"data.val_fraction={cfg.val_fraction}",
        )
    return SplitIndices(train=np.sort(train), val=np.sort(val), test=np.sort(test))


def stratified_split(
    idx: np.ndarray, y: Optional[np.ndarray], num_held_out: int, seed: int, key: str
) -> tuple[np.ndarray, np.ndarray]:
    """(kept, held_out) with num_held_out samples held out, class proportions kept (y None:
    a plain seeded random split, for regression targets)."""
    from sklearn.model_selection import train_test_split

    if num_held_out == 0:
        return idx, idx[:0]
    if num_held_out >= len(idx):
        raise ConfigError(f"{key}: holds out all {len(idx)} remaining samples; lower it")
    try:
        kept, held_out = train_test_split(
            idx, test_size=num_held_out, stratify=y, random_state=seed, shuffle=True
        )
    except ValueError as exc:
        raise DataError(
            f"{key}: cannot hold out {num_held_out} of {len(idx)} samples stratified by class "
            f"({exc}); change {key.partition('=')[0]} or get more samples of the rare classes"
        ) from exc
    return np.asarray(kept, dtype=np.int64), np.asarray(held_out, dtype=np.int64)


def kfold_split(
    idx: np.ndarray, y: Optional[np.ndarray], num_folds: int, fold: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """(train, val): fold number `fold` of a shuffled (stratified, with y) k-fold over idx."""
    from sklearn.model_selection import KFold, StratifiedKFold

    folds: Any = (
        StratifiedKFold(n_splits=num_folds, shuffle=True, random_state=seed)
        if y is not None
        else KFold(n_splits=num_folds, shuffle=True, random_state=seed)
    )
    try:
        train_pos, val_pos = list(folds.split(np.zeros(len(idx)), y))[fold]
    except ValueError as exc:
        raise DataError(
            f"data.num_folds={num_folds}: cannot split {len(idx)} samples into stratified "
            f"folds ({exc}); lower data.num_folds"
        ) from exc
    return idx[train_pos], idx[val_pos]
