"""Cell images and their masks, read one sample at a time from .npy files on disk.

ROOT/images.npy holds uint8 images [N, H, W], ROOT/masks.npy uint8 masks [N, H, W] (1 =
cell). A sample is one positioned read from each file, so a data set many times larger
than memory trains as well as a small one.
"""

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset


class NpyRows:
    """The rows array[i] of a C-ordered .npy file, each read from disk when asked for.
    (Not np.load(mmap_mode="r"): with samples in random order, a memory map's readahead
    pulls in megabytes per sample and thrashes a job's memory limit.)"""

    def __init__(self, path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = getattr(np.lib.format, f"read_array_header_{version[0]}_0")
            shape, fortran_order, self.dtype = read_header(f)
            self.offset = f.tell()
        if fortran_order:
            raise ValueError(f"{path}: Fortran-ordered arrays are not supported")
        self.shape = shape
        self.row_bytes = int(np.prod(shape[1:])) * self.dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, i: int) -> np.ndarray:
        with open(self.path, "rb") as f:
            f.seek(self.offset + int(i) * self.row_bytes)
            row = np.frombuffer(f.read(self.row_bytes), self.dtype)
        return row.reshape(self.shape[1:])


class CellImages(Dataset):
    """Samples {"image": float32 [1, H, W] in [0, 1], "mask": float32 [1, H, W]}."""

    def __init__(self, root, indices, flip: bool = False):
        self.images = NpyRows(Path(root) / "images.npy")
        self.masks = NpyRows(Path(root) / "masks.npy")
        self.indices = np.asarray(indices)
        self.flip = flip

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict:
        j = self.indices[i]
        image = torch.from_numpy(self.images[j].astype(np.float32) / 255).unsqueeze(0)
        mask = torch.from_numpy(self.masks[j].astype(np.float32)).unsqueeze(0)
        if self.flip and torch.rand(()) < 0.5:  # torch's RNG: reproducible when seeded
            image, mask = image.flip(-1), mask.flip(-1)
        return {"image": image, "mask": mask}


def build_datasets(root, val_fraction: float = 0.1, test_fraction: float = 0.1, seed: int = 0):
    """{"train", "val", "test"}: a random split of ROOT's samples (flips in train only)."""
    num = len(NpyRows(Path(root) / "images.npy"))
    order = np.random.default_rng(seed).permutation(num)
    num_val, num_test = round(val_fraction * num), round(test_fraction * num)
    val, test, train = np.split(order, [num_val, num_val + num_test])
    return {
        "train": CellImages(root, np.sort(train), flip=True),
        "val": CellImages(root, np.sort(val)),
        "test": CellImages(root, np.sort(test)),
    }
