"""MNIST in its original IDX format (raw or gzipped), parsed with numpy."""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

from hpcdl.data.raw import RawData
from hpcdl.errors import DataError

# IDX header: two zero bytes, a type code (0x08 = unsigned byte), the number of dimensions,
# then one big-endian uint32 per dimension (http://yann.lecun.com/exdb/mnist/).
UBYTE_CODE = 0x08
IMAGES_NUM_DIMS = 3
LABELS_NUM_DIMS = 1
NUM_MNIST_CLASSES = 10
FIX_HINT = "point data.path at the folder holding the four MNIST IDX files"


def read_mnist(folder: str, *, as_images: bool) -> RawData:
    root = Path(folder).expanduser()
    x_train = read_idx(find_idx_file(root, "train-images-idx3-ubyte"), IMAGES_NUM_DIMS)
    y_train = read_idx(find_idx_file(root, "train-labels-idx1-ubyte"), LABELS_NUM_DIMS)
    x_test = read_idx(find_idx_file(root, "t10k-images-idx3-ubyte"), IMAGES_NUM_DIMS)
    y_test = read_idx(find_idx_file(root, "t10k-labels-idx1-ubyte"), LABELS_NUM_DIMS)
    for images, labels, split in ((x_train, y_train, "train"), (x_test, y_test, "t10k")):
        if images.shape[0] != labels.shape[0]:
            raise DataError(
                f"data.path={folder!r}: {split} images hold {images.shape[0]} samples but "
                f"{split} labels hold {labels.shape[0]}; {FIX_HINT} (from the same download)"
            )
        if labels.size and int(labels.max()) >= NUM_MNIST_CLASSES:
            raise DataError(
                f"data.path={folder!r}: {split} labels hold {int(labels.max())}, "
                f"MNIST labels are 0..{NUM_MNIST_CLASSES - 1}; {FIX_HINT}"
            )
    if x_test.shape[1:] != x_train.shape[1:]:
        raise DataError(
            f"data.path={folder!r}: t10k images are {x_test.shape[1]}x{x_test.shape[2]} pixels, "
            f"train images {x_train.shape[1]}x{x_train.shape[2]}; {FIX_HINT} (from the same "
            "download, or written with the same image size)"
        )
    shape = (1, *x_train.shape[1:]) if as_images else (int(np.prod(x_train.shape[1:])),)
    return RawData(
        x=x_train.reshape(-1, *shape),
        y=y_train.astype(np.int64),
        class_names=[str(i) for i in range(NUM_MNIST_CLASSES)],
        pixel_scale=1 / 255,
        x_test=x_test.reshape(-1, *shape),
        y_test=y_test.astype(np.int64),
    )


def find_idx_file(root: Path, name: str) -> Path:
    for candidate in (root / name, root / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise DataError(f"data.path='{root}': missing {name}[.gz]; {FIX_HINT}")


def read_idx(path: Path, num_dims: int) -> np.ndarray:
    """An IDX file of unsigned bytes with num_dims dimensions, checked against its header."""
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            content = f.read()
    except (OSError, EOFError, zlib.error) as exc:
        # A cut or damaged .gz (EOFError, BadGzipFile, zlib.error): the file, not the folder.
        damaged = isinstance(exc, (EOFError, gzip.BadGzipFile, zlib.error))
        fix = "the file is truncated or corrupt, download it again" if damaged else FIX_HINT
        raise DataError(f"data.path: cannot read {path}: {exc}; {fix}") from exc
    if len(content) < 4:
        raise DataError(f"data.path: {path} is too short for an IDX header; {FIX_HINT}")
    zero0, zero1, type_code, file_dims = content[0], content[1], content[2], content[3]
    magic = int.from_bytes(content[:4], "big")
    expected = (UBYTE_CODE << 8) | num_dims
    if zero0 or zero1 or type_code != UBYTE_CODE or file_dims != num_dims:
        raise DataError(
            f"data.path: {path} has magic number {magic:#010x}, expected {expected:#010x} "
            f"(unsigned bytes, {num_dims} dims); {FIX_HINT}"
        )
    header_bytes = 4 + 4 * num_dims
    if len(content) < header_bytes:
        raise DataError(f"data.path: {path} ends inside its IDX header; {FIX_HINT}")
    dims = struct.unpack(f">{num_dims}I", content[4:header_bytes])
    num_bytes = int(np.prod(dims))
    if len(content) - header_bytes != num_bytes:
        raise DataError(
            f"data.path: {path} holds {len(content) - header_bytes} data bytes, its header "
            f"{list(dims)} says {num_bytes}; the file is truncated or corrupt, download it again"
        )
    return np.frombuffer(content, dtype=np.uint8, offset=header_bytes).reshape(dims)
