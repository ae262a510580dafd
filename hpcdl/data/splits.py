"""Stratified train/val/test index splits and k-fold cross-validation, fixed by a seed."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from hpcdl.errors import ConfigError, DataError, DataWarning, plural


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
    a plain seeded random split, for regression targets). The same indices, in the same
    order, as scikit-learn's train_test_split(idx, test_size=num_held_out, stratify=y,
    random_state=seed, shuffle=True), which hpcdl used before (runs resume on the same
    split); written out here so that a rank's start does not import scikit-learn and
    scipy (1.5 s of every process that reads data)."""
    if num_held_out == 0:
        return idx, idx[:0]
    if num_held_out >= len(idx):
        raise ConfigError(f"{key}: holds out all {len(idx)} remaining samples; lower it")
    rng = np.random.RandomState(seed)
    if y is None:
        order = rng.permutation(len(idx))
        return idx[order[num_held_out:]], idx[order[:num_held_out]]
    classes, y_indices, class_counts = np.unique(y, return_inverse=True, return_counts=True)
    num_kept = len(idx) - num_held_out
    single = classes[class_counts < 2].tolist()
    problem = (
        f"class {single[0]!r} has 1 sample"
        if single
        else f"{num_kept} kept for {len(classes)} classes"
        if num_kept < len(classes)
        else f"{num_held_out} held out for {len(classes)} classes"
        if num_held_out < len(classes)
        else None
    )
    if problem is not None:
        raise DataError(
            f"{key}: cannot hold out {num_held_out} of {len(idx)} samples stratified by class "
            f"({problem}); change {key.partition('=')[0]} or get more samples of the rare "
            "classes"
        )
    by_class = np.split(np.argsort(y_indices, kind="stable"), np.cumsum(class_counts)[:-1])
    kept_counts = _approximate_mode(class_counts, num_kept, rng)
    held_counts = _approximate_mode(class_counts - kept_counts, num_held_out, rng)
    kept: list[np.ndarray] = []
    held_out: list[np.ndarray] = []
    for members, n_kept, n_held in zip(by_class, kept_counts, held_counts, strict=True):
        shuffled = members.take(rng.permutation(len(members)), mode="clip")
        kept.append(shuffled[:n_kept])
        held_out.append(shuffled[n_kept : n_kept + n_held])
    kept_pos = rng.permutation(np.concatenate(kept))
    held_pos = rng.permutation(np.concatenate(held_out))
    return idx[kept_pos], idx[held_pos]


def _approximate_mode(
    class_counts: np.ndarray, num_draws: int, rng: np.random.RandomState
) -> np.ndarray:
    """Samples per class of num_draws, in proportion to class_counts: each class's count
    rounded down, then one more to the classes with the largest remainders (ties drawn at
    random), as scikit-learn's utils.extmath._approximate_mode draws them."""
    continuous = class_counts / class_counts.sum() * num_draws
    floored = np.floor(continuous)
    need_to_add = int(num_draws - floored.sum())
    if need_to_add > 0:
        remainder = continuous - floored
        for value in np.sort(np.unique(remainder))[::-1]:
            (tied,) = np.where(remainder == value)
            add_now = min(len(tied), need_to_add)
            floored[rng.choice(tied, size=add_now, replace=False)] += 1
            need_to_add -= add_now
            if need_to_add == 0:
                break
    return floored.astype(int)


def kfold_split(
    idx: np.ndarray, y: Optional[np.ndarray], num_folds: int, fold: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """(train, val): fold number `fold` of a shuffled (stratified, with y) k-fold over idx:
    the folds of scikit-learn's StratifiedKFold (KFold without y) with shuffle=True and
    random_state=seed, which hpcdl used before (see stratified_split)."""
    if num_folds > len(idx):
        raise DataError(
            f"data.num_folds={num_folds}: cannot split {len(idx)} samples into {num_folds} "
            "folds; lower data.num_folds"
        )
    rng = np.random.RandomState(seed)
    if y is None:
        order = np.arange(len(idx))
        rng.shuffle(order)
        sizes = np.full(num_folds, len(idx) // num_folds, dtype=int)
        sizes[: len(idx) % num_folds] += 1
        start = int(sizes[:fold].sum())
        in_val = np.zeros(len(idx), dtype=bool)
        in_val[order[start : start + sizes[fold]]] = True
    else:
        in_val = _stratified_folds(y, num_folds, rng) == fold
    positions = np.arange(len(idx))
    return idx[positions[~in_val]], idx[positions[in_val]]


def _stratified_folds(y: np.ndarray, num_folds: int, rng: np.random.RandomState) -> np.ndarray:
    """Each sample's fold: every class dealt round-robin over the folds in sorted order,
    then each class's fold numbers shuffled (scikit-learn's StratifiedKFold)."""
    _, first_seen, inverse = np.unique(y, return_index=True, return_inverse=True)
    _, class_order = np.unique(first_seen, return_inverse=True)
    encoded = class_order[inverse.reshape(-1)]  # classes numbered by first appearance
    num_classes = len(first_seen)
    counts = np.bincount(encoded)
    if np.all(num_folds > counts):
        raise DataError(
            f"data.num_folds={num_folds}: cannot split {len(y)} samples into stratified "
            f"folds (no class has {num_folds} samples); lower data.num_folds"
        )
    if num_folds > counts.min():
        warnings.warn(
            f"data.num_folds={num_folds}: the smallest class has "
            f"{plural(int(counts.min()), 'sample')}, fewer than the folds; some folds' "
            "validation split holds none of it",
            DataWarning,
            stacklevel=2,
        )
    in_order = np.sort(encoded)
    allocation = np.asarray(
        [np.bincount(in_order[i::num_folds], minlength=num_classes) for i in range(num_folds)]
    )
    folds = np.empty(len(y), dtype="i")
    for k in range(num_classes):
        for_class = np.arange(num_folds).repeat(allocation[:, k])
        rng.shuffle(for_class)
        folds[encoded == k] = for_class
    return folds
