"""What the loop and evaluation read: batches of a split, whatever the source.

TensorFeed: the built-in sources, preprocessed tensors (device-resident or a DataLoader).
DatasetFeed: map-style Datasets (data=custom, data=imagefolder) through DataLoaders.
A batch is an (x, y) tuple for the built-in sources, and whatever the collate function
makes of the user's samples otherwise; it is on the training device.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional

import numpy as np
import torch
from torch.utils.data import Subset

from hpcdl.config.schema import (
    ClassificationTaskConfig,
    CustomDataConfig,
    DataConfig,
    ImageFolderConfig,
    numeric_targets,
)
from hpcdl.data.build import DataSplits, build_data
from hpcdl.data.loader import (
    LoaderSettings,
    dataset_batches,
    dataset_eval_batches,
    iterate_batches,
    quiet_default_collate,
)
from hpcdl.data.sharding import EpochSharder
from hpcdl.errors import DataError
from hpcdl.samples import input_target_pair
from hpcdl.targets import resolve_callable

# Samples per forward pass when evaluating in-memory tensors, per rank.
EVAL_BATCH_SIZE = 512

TrainBatch = tuple[int, Any, int]  # (step_in_epoch, batch, samples in the global batch)


class Feed:
    input_shape: tuple[int, ...]
    num_classes: int  # the model's number of outputs (1 for a regression target)
    class_names: list[str]
    # Regression on a built-in source: (mean, std) of the training targets.
    target_stats: Optional[tuple[float, float]] = None

    def num_samples(self, split: str) -> int:
        raise NotImplementedError

    def train_batches(
        self, sharder: EpochSharder, epoch: int, start_step: int, device: torch.device
    ) -> Iterator[TrainBatch]:
        raise NotImplementedError

    def eval_batches(
        self, split: str, rank: int, world_size: int, device: torch.device, batch_size: int
    ) -> Iterator[Any]:
        raise NotImplementedError

    def preprocessing_state(self) -> dict[str, Any]:
        """What `hpcdl predict` needs to prepare raw rows ({} when it cannot)."""
        return {}

    def data_state(self) -> Optional[dict[str, Any]]:
        """data=custom: the train dataset's own fitted state (hpcdl.data.fitted_state)."""
        return None

    def load_data_state(self, state: dict[str, Any]) -> None:
        """A checkpoint's data_state into the datasets, before any batch is read."""

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "class_names": list(self.class_names),
        }
        if self.target_stats is not None:
            info["target_mean"], info["target_std"] = self.target_stats
        return info


class TensorFeed(Feed):
    def __init__(
        self, data: DataSplits, device: torch.device, *, in_memory: bool, num_workers: int
    ) -> None:
        self.data = data
        self.input_shape = data.input_shape
        self.num_classes = data.num_classes
        self.class_names = list(data.class_names)
        self.target_stats = data.target_stats
        self.in_memory = in_memory
        self.num_workers = num_workers
        if in_memory:  # the training split lives on the device: each step only indexes
            data.x_train = data.x_train.to(device)
            data.y_train = data.y_train.to(device)

    def _split(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.data
        return {
            "train": (d.x_train, d.y_train),
            "val": (d.x_val, d.y_val),
            "test": (d.x_test, d.y_test),
        }[split]

    def num_samples(self, split: str) -> int:
        return int(self._split(split)[1].shape[0])

    def train_batches(
        self, sharder: EpochSharder, epoch: int, start_step: int, device: torch.device
    ) -> Iterator[TrainBatch]:
        batches = iterate_batches(
            self.data.x_train,
            self.data.y_train,
            sharder,
            epoch,
            start_step,
            device,
            in_memory=self.in_memory,
            num_workers=self.num_workers,
        )
        for step, xb, yb, count in batches:
            yield step, (xb, yb), count

    def eval_batches(
        self, split: str, rank: int, world_size: int, device: torch.device, batch_size: int
    ) -> Iterator[Any]:
        x, y = self._split(split)
        x, y = x.to(device), y.to(device)
        idx = torch.arange(rank, x.shape[0], world_size, device=device)
        for start in range(0, idx.numel(), EVAL_BATCH_SIZE):
            batch = idx[start : start + EVAL_BATCH_SIZE]
            yield x[batch], y[batch]

    def preprocessing_state(self) -> dict[str, Any]:
        return self.data.preprocessing.state_dict()

    def info(self) -> dict[str, Any]:
        info = super().info()
        if self.data.feature_columns is not None:  # a CSV with a header
            info["feature_columns"] = list(self.data.feature_columns)
            info["label_column"] = self.data.label_column
        return info


class DatasetFeed(Feed):
    def __init__(
        self,
        datasets: dict[str, Any],
        settings: LoaderSettings,
        *,
        input_shape: tuple[int, ...],
        num_classes: int,
        class_names: list[str],
        source: str = "data.target",
        data_state: Optional[dict[str, Any]] = None,
    ) -> None:
        self.datasets = datasets
        self.source = source  # data.target='mylab.data:build', named in errors
        self._data_state = data_state
        self.settings = settings
        self.input_shape = input_shape
        self.num_classes = num_classes
        self.class_names = class_names

    def num_samples(self, split: str) -> int:
        return len(self.datasets[split])

    def data_state(self) -> Optional[dict[str, Any]]:
        return self._data_state

    def load_data_state(self, state: dict[str, Any]) -> None:
        from hpcdl.data.fitted_state import load_data_state

        load_data_state(self.datasets, state, self.source)
        self._data_state = state  # saved again as it was

    def train_batches(
        self, sharder: EpochSharder, epoch: int, start_step: int, device: torch.device
    ) -> Iterator[TrainBatch]:
        batches = dataset_batches(
            self.datasets["train"], sharder, epoch, start_step, device, self.settings
        )
        return _named_collate_errors(batches, self.source)

    def eval_batches(
        self, split: str, rank: int, world_size: int, device: torch.device, batch_size: int
    ) -> Iterator[Any]:
        batches = dataset_eval_batches(
            self.datasets[split], rank, world_size, batch_size, device, self.settings
        )
        return _named_collate_errors(batches, self.source)


def _named_collate_errors(batches: Iterator[Any], source: str) -> Iterator[Any]:
    """torch's collate error for samples of different shapes, as one line naming the fix;
    a DataError raised in a DataLoader worker (an unreadable image), as its own line."""
    try:
        yield from batches
    except DataError as exc:
        raise DataError(worker_error_message(exc)) from None
    except RuntimeError as exc:
        text = str(exc)
        # In a DataLoader worker, torch stacks into shared memory sized for the first
        # sample: a larger one later fails as a storage resize, its shapes unnamed.
        marks = ("stack expects each tensor to be equal size", "Trying to resize storage")
        detail = next((ln for ln in text.splitlines() if any(m in ln for m in marks)), None)
        if detail is not None:
            raise DataError(
                f"{source}: samples of different shapes in one batch ({detail.strip()}); make "
                "every sample the same shape (resize/crop), or set data.collate_fn to pad them"
            ) from None
        raise


def worker_error_message(exc: BaseException) -> str:
    """The message an exception was raised with in a DataLoader worker: torch re-raises it in
    this process as the same type with "Caught X in DataLoader worker process N." and the
    worker's whole traceback for its message; the traceback's last line holds the original.
    Other messages as they are."""
    text = str(exc)
    if not text.startswith("Caught ") or "Original Traceback" not in text:
        return text
    kind = type(exc)
    prefixes = (f"{kind.__module__}.{kind.__qualname__}: ", f"{kind.__qualname__}: ")
    for line in reversed(text.splitlines()):
        for prefix in prefixes:
            if line.startswith(prefix):
                return line[len(prefix) :]
    return text


def build_feed(
    cfg: DataConfig,
    device: torch.device,
    seed: int,
    *,
    task: Any = None,
    class_names: Optional[list[str]] = None,
) -> Feed:
    """task: the run's task config. A regression target gives the model one output; the
    built-in classification's labels are checked batch by batch on the host, before they
    move to the device (on a GPU a label out of range is a device-side assert, which ends
    the process without saying which label). class_names: a trained model's classes, for
    data=imagefolder's labels (its folders may then be any of them)."""
    regression = numeric_targets(task)
    if isinstance(cfg, (CustomDataConfig, ImageFolderConfig)):
        classes = isinstance(task, ClassificationTaskConfig)
        return build_dataset_feed(
            cfg, seed, regression=regression, check_labels=classes, class_names=class_names
        )
    data = build_data(cfg, regression=regression)
    return TensorFeed(data, device, in_memory=cfg.in_memory, num_workers=cfg.num_workers)


def build_dataset_feed(
    cfg: CustomDataConfig | ImageFolderConfig,
    seed: int,
    *,
    regression: bool = False,
    check_labels: bool = False,
    class_names: Optional[list[str]] = None,
) -> DatasetFeed:
    from hpcdl.config.validate import check_data
    from hpcdl.data.custom import (
        build_custom_datasets,
        check_collate,
        check_last_samples,
        first_sample,
        first_sample_info,
        num_classes_of,
    )

    check_data(cfg)
    data_state = None
    if isinstance(cfg, CustomDataConfig):
        from hpcdl.data.fitted_state import read_data_state

        datasets = build_custom_datasets(cfg)
        where = f"data.target={cfg.target!r}"
        data_state = read_data_state(datasets, where)
        collate: Optional[Any] = (
            resolve_callable("data.collate_fn", cfg.collate_fn) if cfg.collate_fn else None
        )
        collate_key = f"data.collate_fn={cfg.collate_fn!r}"
        num_classes, class_names = num_classes_of(datasets["train"], cfg)
    else:
        datasets, class_names = build_imagefolder_datasets(cfg, class_names)
        where = f"data.path={cfg.path!r}"
        collate, collate_key = None, "data.collate_fn"
        num_classes = len(class_names)
    sample = first_sample(datasets["train"], where)
    check_last_samples(datasets, where)
    check_collate(sample, collate, collate_key, where)
    input_shape, label = first_sample_info(sample)
    if regression:
        num_classes, class_names = 1, []
    else:
        _check_label(label, num_classes, where)
    settings = LoaderSettings(
        num_workers=cfg.num_workers,
        prefetch_factor=cfg.prefetch_factor,
        collate_fn=collate or quiet_default_collate,
        seed=seed,
        check_batch=LabelCheck(num_classes, where) if check_labels and num_classes > 0 else None,
    )
    return DatasetFeed(
        datasets,
        settings,
        input_shape=input_shape,
        num_classes=num_classes,
        class_names=class_names,
        source=where,
        data_state=data_state,
    )


def _check_label(label: Any, num_classes: int, where: str) -> None:
    """A class label of the first sample, when the task may need one: in range."""
    if label is None or num_classes <= 0:
        return
    value = label.item() if isinstance(label, torch.Tensor) and label.numel() == 1 else label
    if isinstance(value, int) and not 0 <= value < num_classes:
        raise _label_out_of_range(where, "the first training sample has", value, num_classes)


def _label_out_of_range(where: str, holder: str, value: int, num_classes: int) -> DataError:
    return DataError(
        f"{where}: {holder} label {value}, outside [0, {num_classes}) classes; labels must be "
        "class indices (set data.num_classes if it is wrong)"
    )


class LabelCheck:
    """Every batch's class labels in range, on the host, before the batch moves to the
    device: one reduction over a batch of integers (labels of other kinds are left to the
    task's own errors)."""

    def __init__(self, num_classes: int, where: str) -> None:
        self.num_classes = num_classes
        self.where = where

    def __call__(self, batch: Any) -> None:
        pair = input_target_pair(batch)
        labels = pair[1] if pair is not None else None
        if not isinstance(labels, torch.Tensor) or labels.numel() == 0:
            return
        if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.is_cuda:
            return
        # As int64, as the task reads them (aminmax has no kernel for uint16/32/64 or bool).
        low, high = (int(v) for v in torch.aminmax(labels.long()))
        if low < 0 or high >= self.num_classes:
            bad = low if low < 0 else high
            raise _label_out_of_range(self.where, "a batch holds", bad, self.num_classes)


def _split_images(dataset: Any, cfg: ImageFolderConfig) -> dict[str, Any]:
    """One folder of class folders into train/val/test: stratified by class (the labels
    are the folders, known without reading an image), as data=files splits its rows."""
    from hpcdl.data.custom import split_dataset
    from hpcdl.data.splits import split_indices

    if not cfg.stratify:
        return split_dataset(dataset, cfg)
    labels = np.array([label for _, label in dataset.samples], dtype=np.int64)
    parts = split_indices(labels, cfg, has_official_test=False)
    return {
        "train": Subset(dataset, parts.train.tolist()),
        "val": Subset(dataset, parts.val.tolist()),
        "test": Subset(dataset, parts.test.tolist()),
    }


def build_imagefolder_datasets(
    cfg: ImageFolderConfig, trained: Optional[list[str]] = None
) -> tuple[dict[str, Any], list[str]]:
    """The splits (one folder split by val/test_fraction, or train/val/test folders) and
    the class names (trained: a trained model's, which the folders' labels index)."""
    from hpcdl.data.imagefolder import build_imagefolder

    made = build_imagefolder(
        cfg.path,
        image_size=cfg.image_size,
        crop_size=cfg.crop_size,
        random_flip=cfg.random_flip,
        random_crop=cfg.random_crop,
        mean=cfg.mean,
        std=cfg.std,
        channels=cfg.channels,
        classes=trained,
    )
    classes = list(next(iter(made.values())).classes)
    if "all" in made:
        splits = _split_images(made["all"], cfg)
        plain = made["all"].without_augmentation()  # val/test: no random flips or crops
        for name in ("val", "test"):
            splits[name] = Subset(plain, splits[name].indices)
        return splits, classes
    if "val" not in made and trained is None:  # training (evaluate reads its own split)
        import warnings

        from hpcdl.errors import DataWarning

        warnings.warn(
            f"data.path={cfg.path!r}: holds train/ but no val/ folder, so the run has no "
            "validation split (no val metrics, best.pt or early stopping); add val/CLASS/ "
            "folders, or put the class folders in data.path itself to split them by "
            "data.val_fraction",
            DataWarning,
            stacklevel=2,
        )
    empty = torch.utils.data.TensorDataset(torch.empty(0))
    return {name: made.get(name, empty) for name in ("train", "val", "test")}, classes
