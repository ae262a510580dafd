"""hpcdl's own splitters and bundled-data readers give what scikit-learn's gave: runs made
before hpcdl stopped importing scikit-learn resume on the same train/val/test split, and
the bundled datasets hold the same numbers."""

from __future__ import annotations

import subprocess
import sys
import types
import warnings

import numpy as np
import pytest

from hpcdl.data.splits import kfold_split, stratified_split
from hpcdl.errors import DataError, DataWarning


def label_sets() -> list[tuple[np.ndarray, int]]:
    """(labels, seed): balanced, skewed, many-class, tied-remainder, and string labels."""
    rng = np.random.default_rng(0)
    cases = [
        (np.arange(569) % 2, 0),
        (np.repeat([0, 1, 2], [50, 30, 7]), 3),
        (np.arange(1797) % 10, 42),
        (np.repeat([0, 1, 2, 3], [3, 3, 3, 3]), 7),
        (rng.permutation(np.repeat(np.array(["b", "a", "c"]), [40, 25, 11])), 11),
    ]
    for seed in range(12):
        size = int(rng.integers(20, 400))
        num_classes = int(rng.integers(2, 9))
        weights = rng.dirichlet(np.ones(num_classes))
        labels = rng.choice(num_classes, size=size, p=weights)
        if np.bincount(labels, minlength=num_classes).min() < 6:
            labels = np.concatenate([labels, np.repeat(np.arange(num_classes), 6)])
        cases.append((rng.permutation(labels), seed * 1000 + 1))
    return cases


@pytest.mark.parametrize("case", range(len(label_sets())))
def test_stratified_and_plain_splits_are_scikit_learns(case: int) -> None:
    from sklearn.model_selection import train_test_split

    y, seed = label_sets()[case]
    idx = np.arange(100, 100 + len(y), dtype=np.int64)  # not positions: indices into data
    num_classes = len(np.unique(y))
    for held in (num_classes, max(num_classes, round(0.15 * len(y))), len(y) // 2):
        ours = stratified_split(idx, y, held, seed, "data.val_fraction=0.1")
        theirs = train_test_split(idx, test_size=held, stratify=y, random_state=seed)
        assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))
        plain = stratified_split(idx, None, held, seed, "data.val_fraction=0.1")
        unstratified = train_test_split(idx, test_size=held, random_state=seed, shuffle=True)
        assert all(np.array_equal(a, b) for a, b in zip(plain, unstratified, strict=True))


@pytest.mark.filterwarnings("ignore:.*(least populated|smallest class)")
@pytest.mark.parametrize("case", range(len(label_sets())))
def test_kfold_folds_are_scikit_learns(case: int) -> None:
    from sklearn.model_selection import KFold, StratifiedKFold

    y, seed = label_sets()[case]
    idx = np.arange(7, 7 + len(y), dtype=np.int64)
    largest = int(np.unique(y, return_counts=True)[1].max())
    for num_folds in (2, min(5, largest), min(8, largest)):  # 8: over the smallest class
        stratified = list(
            StratifiedKFold(num_folds, shuffle=True, random_state=seed).split(np.zeros(len(y)), y)
        )
        plain = list(KFold(num_folds, shuffle=True, random_state=seed).split(np.zeros(len(y))))
        for fold in range(num_folds):
            ours = kfold_split(idx, y, num_folds, fold, seed)
            assert all(
                np.array_equal(a, idx[b]) for a, b in zip(ours, stratified[fold], strict=True)
            )
            ours = kfold_split(idx, None, num_folds, fold, seed)
            assert all(np.array_equal(a, idx[b]) for a, b in zip(ours, plain[fold], strict=True))


def test_splits_that_cannot_be_made_are_one_line_naming_the_key() -> None:
    idx = np.arange(12)
    lonely = np.array([0] * 6 + [1] * 5 + [2])
    with pytest.raises(
        DataError,
        match=r"data.val_fraction=0.2: cannot hold out 2 of 12 "
        r"samples stratified by class \(class 2 has 1 sample\)",
    ):
        stratified_split(idx, lonely, 2, 0, "data.val_fraction=0.2")
    with pytest.raises(DataError, match=r"\(2 held out for 3 classes\)"):
        stratified_split(idx, np.arange(12) % 3, 2, 0, "data.val_fraction=0.2")
    with pytest.raises(DataError, match="cannot split 12 samples into 13 folds"):
        kfold_split(idx, None, 13, 0, 0)
    with pytest.raises(DataError, match=r"no class has 7 samples"):
        kfold_split(idx, np.arange(12) % 2, 7, 0, 0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        kfold_split(idx, np.array([0] * 10 + [1] * 2), 3, 0, 0)
    assert [type(w.message) for w in seen] == [DataWarning]
    assert "the smallest class has 2 samples, fewer than the folds" in str(seen[0].message)


def test_bundled_data_is_scikit_learns_read_without_importing_it() -> None:
    code = (
        "import sys, types\n"
        "from hpcdl.data.sources import read_breast_cancer, read_digits\n"
        "read_breast_cancer(None), read_digits(types.SimpleNamespace(as_images=True))\n"
        "assert 'sklearn' not in sys.modules and 'scipy' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    from sklearn.datasets import load_breast_cancer, load_digits

    from hpcdl.data.sources import read_breast_cancer, read_digits

    ours, theirs = read_breast_cancer(None), load_breast_cancer()  # type: ignore[arg-type]
    assert np.array_equal(ours.x, theirs.data) and ours.x.dtype == np.float64
    assert np.array_equal(ours.y, theirs.target) and ours.y.dtype == np.int64
    assert ours.class_names == ["malignant", "benign"]
    flat = read_digits(types.SimpleNamespace(as_images=False))  # type: ignore[arg-type]
    digits = load_digits()
    assert np.array_equal(flat.x, digits.data.astype(np.float32)) and flat.x.shape == (1797, 64)
    assert np.array_equal(flat.y, digits.target) and flat.class_names == list("0123456789")
    images = read_digits(types.SimpleNamespace(as_images=True))  # type: ignore[arg-type]
    assert np.array_equal(images.x.reshape(-1, 64), flat.x)
