"""What a run records about itself: metrics.csv, a weights hash, versions, JSON files.

The plots live in hpcdl.plots (matplotlib is imported only when a plot is drawn); they
are re-exported here so that callers import one module.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.metadata
import io
import json
import platform
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch

from hpcdl.checkpoint import write_file_atomic
from hpcdl.plots import plot_confusion_matrix, plot_learning_curves

__all__ = [
    "MetricsLog",
    "collect_versions",
    "confusion_matrix",
    "plot_confusion_matrix",
    "plot_learning_curves",
    "weights_sha256",
    "write_json_atomic",
]

# Key prefixes added by wrappers: DistributedDataParallel ("module.") and torch.compile
# ("_orig_mod."), possibly both, in either order.
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")

PathLike = Union[str, Path]


def strip_wrapper_prefix(key: str) -> str:
    stripped = True
    while stripped:
        stripped = False
        for prefix in _WRAPPER_PREFIXES:
            if key.startswith(prefix):
                key = key[len(prefix) :]
                stripped = True
    return key


def weights_sha256(state_dict: Mapping[str, Any]) -> str:
    """SHA-256 over (name, dtype, shape, bytes) of each tensor, in sorted key order.

    Keys lose their DDP/compile prefixes first, so a wrapped model hashes like the plain one.
    """
    entries = sorted((strip_wrapper_prefix(key), value) for key, value in state_dict.items())
    digest = hashlib.sha256()
    for key, value in entries:
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous().reshape(-1)
            meta = f"{key}|{tensor.dtype}|{tuple(value.shape)}\n"
            digest.update(meta.encode())
            # view(uint8) reinterprets the bytes, so dtypes numpy lacks (bf16) hash too.
            digest.update(tensor.view(torch.uint8).numpy().data)
        else:  # e.g. a module's _extra_state
            digest.update(f"{key}|{type(value).__name__}|{value!r}\n".encode())
    return digest.hexdigest()


def confusion_matrix(preds: torch.Tensor, targets: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Counts indexed [true class, predicted class], int64, on the inputs' device."""
    preds = preds.reshape(-1).long()
    targets = targets.reshape(-1).long()
    if preds.shape != targets.shape:
        raise ValueError(f"preds has {preds.numel()} values but targets has {targets.numel()}")
    for name, values in (("preds", preds), ("targets", targets)):
        if values.numel() and (values.min() < 0 or values.max() >= num_classes):
            raise ValueError(f"{name} holds a class outside [0, {num_classes})")
    counts = torch.bincount(targets * num_classes + preds, minlength=num_classes * num_classes)
    return counts.reshape(num_classes, num_classes)


class MetricsLog:
    """metrics.csv, one row per epoch; the header comes from the first row's keys."""

    def __init__(self, path: PathLike):
        self.path = Path(path)

    def append(self, row: Mapping[str, Any]) -> None:
        """Append one row and flush it (None is written as an empty cell)."""
        header = self._header()
        new_file = header is None
        fields = list(row) if header is None else header
        extra = [key for key in row if key not in fields]
        if extra:
            raise ValueError(f"{self.path}: row has keys {extra} that the header {fields} lacks")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
            if new_file:
                writer.writeheader()
            writer.writerow(dict(row))
            f.flush()

    def read(self) -> list[dict[str, Any]]:
        """Rows with numbers parsed (int, then float) and empty cells as None."""
        if not self.path.is_file():
            return []
        with open(self.path, newline="") as f:
            reader = csv.DictReader(f)
            return [{key: _parse_cell(value) for key, value in raw.items()} for raw in reader]

    def truncate_after_epoch(self, epoch: int) -> None:
        """Keep the rows with row["epoch"] <= epoch; rewrite the file atomically.

        Used on resume, so that the log matches the checkpoint. A row cut short by a kill
        (fewer cells than the header) is dropped too. Kept rows are copied verbatim.
        """
        if not self.path.is_file():
            return
        with open(self.path, newline="") as f:
            rows = list(csv.reader(f))
        if not rows:
            return
        header = rows[0]
        if "epoch" not in header:
            raise ValueError(f"{self.path}: no 'epoch' column in the header {header}")
        column = header.index("epoch")
        kept = [
            row
            for row in rows[1:]
            if len(row) == len(header)
            and isinstance(_parse_cell(row[column]), int)
            and _parse_cell(row[column]) <= epoch
        ]
        buffer = io.StringIO(newline="")
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(kept)
        write_file_atomic(self.path, [buffer.getvalue().encode()])

    def _header(self) -> Optional[list[str]]:
        if not self.path.is_file():
            return None
        with open(self.path, newline="") as f:
            first = next(csv.reader(f), None)
        return first or None


def _parse_cell(value: Optional[str]) -> Any:
    if value is None or value == "":
        return None
    for parse in (int, float):
        try:
            return parse(value)
        except ValueError:
            pass
    return value


def collect_versions() -> dict[str, str]:
    """Versions that decide whether a run can be reproduced, as strings."""
    try:
        hpcdl_version = importlib.metadata.version("hpcdl")
    except importlib.metadata.PackageNotFoundError:
        hpcdl_version = "unknown"
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "hpcdl": hpcdl_version,
        "cuda": str(torch.version.cuda) if torch.version.cuda else "none",
        "cudnn": str(cudnn) if cudnn else "none",
    }
    if torch.cuda.is_available():
        versions["gpu"] = torch.cuda.get_device_name(0)
    return versions


def write_json_atomic(path: PathLike, obj: Any) -> None:
    """Indented JSON via a temp file, fsync and rename (Path and Enum values as strings)."""
    text = json.dumps(obj, indent=2, default=_json_default) + "\n"
    write_file_atomic(path, [text.encode()])


def _json_default(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
