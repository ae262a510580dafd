"""CIFAR-10 in its "python version" pickle batches."""

from __future__ import annotations

import codecs
import functools
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from hpcdl.data.raw import RawData
from hpcdl.errors import DataError

BATCH_FOLDER = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
IMAGE_SHAPE = (3, 32, 32)  # each row: 1024 red, then 1024 green, then 1024 blue bytes
CLASS_NAMES = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
]
FIX_HINT = f"point data.path at the {BATCH_FOLDER} folder (or its parent)"


def read_cifar10(path: str) -> RawData:
    folder = find_batch_folder(Path(path).expanduser())
    train = [read_batch(folder / name) for name in TRAIN_BATCHES]
    x_test, y_test = read_batch(folder / TEST_BATCH)
    return RawData(
        x=np.concatenate([x for x, _ in train]),
        y=np.concatenate([y for _, y in train]),
        class_names=read_class_names(folder),
        pixel_scale=1 / 255,
        x_test=x_test,
        y_test=y_test,
    )


def find_batch_folder(path: Path) -> Path:
    for candidate in (path, path / BATCH_FOLDER):
        if (candidate / TEST_BATCH).is_file():
            return candidate
    raise DataError(f"data.path='{path}': no {TEST_BATCH} there or in {BATCH_FOLDER}/; {FIX_HINT}")


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    batch = unpickle(path)
    data, labels = batch.get(b"data"), batch.get(b"labels")
    if data is None or labels is None:
        raise DataError(f"data.path: {path} lacks b'data' or b'labels'; {FIX_HINT}")
    x = np.asarray(data, dtype=np.uint8)
    y = np.asarray(labels, dtype=np.int64)
    num_values = int(np.prod(IMAGE_SHAPE))
    if x.ndim != 2 or x.shape[1] != num_values or x.shape[0] != y.shape[0]:
        raise DataError(
            f"data.path: {path} holds data {x.shape} and {y.shape[0]} labels, expected "
            f"[N, {num_values}] and N labels; {FIX_HINT}"
        )
    if y.size and not 0 <= int(y.min()) <= int(y.max()) < len(CLASS_NAMES):
        raise DataError(f"data.path: {path} has labels outside 0..9; {FIX_HINT}")
    return x.reshape(-1, *IMAGE_SHAPE), y


def read_class_names(folder: Path) -> list[str]:
    meta_path = folder / "batches.meta"
    if not meta_path.is_file():
        return list(CLASS_NAMES)
    names = unpickle(meta_path).get(b"label_names")
    if not names or len(names) != len(CLASS_NAMES):
        return list(CLASS_NAMES)
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


def unpickle(path: Path) -> dict[Any, Any]:
    """A batch file as a dict, unpickled with only the types a CIFAR-10 batch holds: a
    crafted file that would call anything else (os.system, ...) is refused, not run."""
    if not path.is_file():
        raise DataError(f"data.path: missing {path}; {FIX_HINT}")
    try:
        with path.open("rb") as f:
            content = _BatchUnpickler(f, encoding="bytes").load()
    except _Refused as exc:
        raise DataError(
            f"data.path: {path}: refused: the pickle calls {exc}, which a CIFAR-10 batch "
            f"never holds (only dicts, lists, bytes, str and numpy arrays); {FIX_HINT}, "
            "from the official cifar-10-python.tar.gz"
        ) from None
    except Exception as exc:  # pickle raises many types on bad input
        raise DataError(f"data.path: cannot unpickle {path}: {exc!r}; {FIX_HINT}") from exc
    if not isinstance(content, dict):
        raise DataError(
            f"data.path: {path} holds a {type(content).__name__}, not a dict; {FIX_HINT}"
        )
    return content


class _Refused(pickle.UnpicklingError):
    """The pickle names a global outside the allow-list; the message is module.name."""


def _latin1_encode(text: str, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    # Python 3 pickles bytes with protocols 0-2 as _codecs.encode(str, "latin1").
    if encoding not in ("latin1", "latin-1") or errors != "strict":
        raise _Refused(f"_codecs.encode with encoding {encoding!r}")
    return codecs.encode(text, "latin1")


@functools.cache
def _allowed_globals() -> dict[tuple[str, str], Any]:
    """What pickles of CIFAR-10 batches name: numpy's array reconstructors (under both the
    numpy 1 and numpy 2 module names), ndarray, dtype, numpy scalars, and bytes."""
    try:
        from numpy._core import multiarray, numeric  # numpy >= 2
    except ImportError:  # numpy 1
        from numpy.core import multiarray, numeric  # type: ignore[no-redef]
    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): _latin1_encode,
    }
    for package in ("numpy.core", "numpy._core"):
        allowed[(f"{package}.multiarray", "_reconstruct")] = multiarray._reconstruct
        allowed[(f"{package}.multiarray", "scalar")] = multiarray.scalar
        # Protocol 5 pickles of arrays (absent from numpy's type stubs).
        allowed[(f"{package}.numeric", "_frombuffer")] = vars(numeric)["_frombuffer"]
    return allowed


class _BatchUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _allowed_globals()[(module, name)]
        except KeyError:
            raise _Refused(f"{module}.{name}") from None
