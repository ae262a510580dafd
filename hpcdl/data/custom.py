"""data=custom: the user's map-style Datasets, from `data.target(**data.kwargs)`.

Nothing here reads the data: a dataset is checked by its length and its first sample.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

import numpy as np
import torch
from torch.utils.data import ConcatDataset, Subset

from hpcdl.config.schema import CustomDataConfig, DataCommon
from hpcdl.data.loader import quiet_default_collate
from hpcdl.errors import DataError, raised
from hpcdl.samples import first_array_shape, input_target_pair
from hpcdl.targets import (
    parameter_names,
    refuse_kwargs_not_taken,
    required_not_given,
    resolve_callable,
)

SPLITS = ("train", "val", "test")


def build_custom_datasets(cfg: CustomDataConfig) -> dict[str, Any]:
    """{"train": ..., "val": ..., "test": ...} (val/test may be empty)."""
    where = f"data.target={cfg.target!r}"
    fn = resolve_callable("data.target", cfg.target)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (a builtin): let the call tell
        signature = None
    if signature is not None:
        refuse_kwargs_not_taken("data", cfg.target, signature, cfg.kwargs)  # a typo: named
        try:
            signature.bind(**cfg.kwargs)
        except TypeError as exc:  # a required parameter not given, or positional-only
            raise DataError(
                f"{where}: {kwargs_not_bound(fn, signature, cfg.kwargs, exc)}"
            ) from None
    try:
        made = fn(**cfg.kwargs)
    except Exception as exc:
        message = str(exc).strip().splitlines()
        detail = f": {message[0]}" if message else ""
        raise DataError(f"{where}: raised {type(exc).__name__}{detail}") from exc
    datasets = _as_splits(made, where)
    if len(datasets) == 1 and "all" in datasets:
        datasets = split_dataset(datasets["all"], cfg)
    for name, dataset in datasets.items():
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise DataError(
                f"{where}: the {name} split is of type {type(dataset).__name__}, not a map-style "
                "Dataset (it needs __len__ and __getitem__; iterable datasets cannot be "
                "resumed mid-epoch)"
            )
    if len(datasets["train"]) == 0:
        raise DataError(f"{where}: the train split is empty")
    return datasets


def kwargs_not_bound(
    fn: Callable[..., Any], signature: inspect.Signature, kwargs: Mapping[str, Any], exc: TypeError
) -> str:
    """Why fn(**data.kwargs) cannot be called: the required parameters not given, named as
    the keys to set (inspect's text otherwise)."""
    missing = required_not_given(signature, kwargs)
    if not missing:
        return f"does not take data.kwargs={dict(kwargs)} ({exc})"
    name = getattr(fn, "__name__", "it")
    keys = ", ".join(f"data.kwargs.{k}" for k in missing)
    return f"{name} needs {keys}; set it (its parameters: {parameter_names(signature)})"


def _as_splits(made: Any, where: str) -> dict[str, Any]:
    if isinstance(made, Mapping):
        unknown = [k for k in made if k not in SPLITS]
        if unknown or "train" not in made:
            raise DataError(
                f"{where}: returned a dict with keys {sorted(made)}; use 'train', 'val' and "
                "optionally 'test'"
            )
        return {name: made.get(name, _Empty()) for name in SPLITS}
    if isinstance(made, (tuple, list)):
        if len(made) not in (2, 3):
            raise DataError(
                f"{where}: returned {len(made)} datasets; return (train, val) or (train, val, test)"
            )
        parts = list(made) + [_Empty()] * (3 - len(made))
        return dict(zip(SPLITS, parts, strict=True))
    return {"all": made}


class _Empty(torch.utils.data.Dataset[Any]):
    def __len__(self) -> int:
        return 0

    def __getitem__(self, index: int) -> Any:
        raise IndexError(index)


def split_dataset(dataset: Any, cfg: DataCommon) -> dict[str, Any]:
    """One dataset into train/val/test by a permutation fixed by data.split_seed."""
    num = len(dataset)
    order = np.random.default_rng(cfg.split_seed).permutation(num)
    num_test = round(cfg.test_fraction * num)
    num_val = round(cfg.val_fraction * num)
    if num_test + num_val >= num:
        raise DataError(
            f"data.val_fraction + data.test_fraction hold out all {num} samples; lower them"
        )
    test, val, train = np.split(order, [num_test, num_test + num_val])
    return {
        "train": Subset(dataset, np.sort(train).tolist()),
        "val": Subset(dataset, np.sort(val).tolist()),
        "test": Subset(dataset, np.sort(test).tolist()),
    }


def first_sample(dataset: Any, where: str) -> Any:
    """The first training sample, read once; a failure as one line naming `where`."""
    try:
        return dataset[0]
    except Exception as exc:
        raise DataError(
            f"{where}: reading the first training sample failed: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc


def check_last_samples(datasets: dict[str, Any], where: str) -> None:
    """Each split's last sample (index len - 1), read once: a __len__ larger than the data
    (a count of shards times a nominal size, an off-by-one) is one line naming the split
    and the index here, not an IndexError in a DataLoader worker well into an epoch."""
    for split, dataset in datasets.items():
        try:
            size = len(dataset)
        except TypeError:
            continue  # no __len__: nothing to check against
        if size <= 1:
            continue
        try:
            dataset[size - 1]
        except (IndexError, KeyError) as exc:  # out of range: __len__ says more than there is
            raise DataError(
                f"{where}: reading the {split} split's last sample (index {size - 1}; its "
                f"__len__ is {size}) failed: {raised(exc).removeprefix('raised ')}; is __len__ "
                "the number of samples __getitem__ can read?"
            ) from exc
        except Exception:
            continue  # the sample's own error (a bad file): said when training reads it


def first_sample_info(sample: Any) -> tuple[tuple[int, ...], Optional[Any]]:
    """(input shape, label) of a sample when samples are (x, y) pairs or
    {"x"/"input", "y"/"target"} dicts; ((), None) for any other sample form."""
    x, y = input_target_pair(sample) or (None, None)
    shape = tuple(int(s) for s in np.shape(x)) if x is not None else ()
    return shape, y


def check_collate(
    sample: Any, collate: Optional[Callable[[list[Any]], Any]], collate_key: str, where: str
) -> None:
    """Batch the first training sample, twice, with data.collate_fn (`collate`, named by
    `collate_key`), else torch's default_collate (the sample is named by `where`): a collate
    function that raises, returns None or puts the samples elsewhere than first in the
    batch's first tensor (which is how hpcdl counts them), or a sample that default_collate
    cannot batch, is one line here instead of a traceback or wrong sample counts later."""
    try:
        batch = (collate or quiet_default_collate)([sample, sample])
    except Exception as exc:
        message = raised(exc)
        if collate is not None:
            raise DataError(
                f"{collate_key}: failed on a list of the first training sample, twice: {message}"
            ) from exc
        raise DataError(
            f"{where}: torch's default_collate cannot batch the first training sample "
            f"({message.removeprefix('raised ')}); return tensors, numbers, or tuples, lists or dicts of them from "
            "__getitem__, or set data.collate_fn to batch them"
        ) from exc
    if batch is None:
        raise DataError(
            f"{collate_key}: returned None for a list of the first training sample, twice; "
            "return the batch"
        )
    shape = first_array_shape(batch)
    if shape is not None and (shape[0] if shape else 1) != 2:
        raise DataError(
            f"{collate_key}: a batch of 2 samples has a first tensor of shape {shape}; hpcdl "
            "counts a batch's samples by that tensor's leading size (metric means, predict's "
            "rows), so put the samples first there (pad_sequence(..., batch_first=True))"
        )


def num_classes_of(dataset: Any, cfg: CustomDataConfig) -> tuple[int, list[str]]:
    """data.num_classes, else the dataset's `classes` (names) or `num_classes`, looking
    through Subsets and into a ConcatDataset's parts (which must then agree); (0, []) when
    none says."""
    names, number = _declared_classes(dataset, f"data.target={cfg.target!r}")
    if cfg.num_classes is not None:
        count = cfg.num_classes
    elif names is not None:
        count = len(names)
    else:
        count = number
    if names is not None and len(names) == count:
        return count, names
    return count, [str(i) for i in range(count)]


def _declared_classes(dataset: Any, where: str) -> tuple[Optional[list[str]], int]:
    """(the `classes` names, the `num_classes`) the dataset's parts declare, the same in
    each: concatenated datasets that number their classes differently (two ImageFolders of
    other class folders) would give one label two meanings."""
    declared = []
    for index, part in enumerate(_parts(dataset)):
        names = getattr(part, "classes", None)
        if isinstance(names, Sequence) and not isinstance(names, str):
            declared.append((index, [str(n) for n in names]))
    if len({tuple(names) for _, names in declared}) > 1:
        (i, first), (j, other) = next(
            (declared[0], d) for d in declared[1:] if d[1] != declared[0][1]
        )
        raise DataError(
            f"{where}: the ConcatDataset's parts {i} and {j} name different classes ({first} "
            f"and {other}): a label would mean one class in one part and another in the "
            "other; give every part the same classes, in the same order"
        )
    if declared:
        return declared[0][1], len(declared[0][1])
    numbers = [int(getattr(part, "num_classes", 0) or 0) for part in _parts(dataset)]
    return None, max(numbers, default=0)


def own_dataset(dataset: Any) -> Any:
    """The dataset under torch Subsets (hpcdl's own split of one dataset, or a fold)."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return dataset


def _parts(dataset: Any) -> list[Any]:
    """The datasets under Subset wrappers and inside ConcatDatasets, in order."""
    dataset = own_dataset(dataset)
    if isinstance(dataset, ConcatDataset):
        return [inner for part in dataset.datasets for inner in _parts(part)]
    return [dataset]
