"""data=imagefolder: images in one sub-folder per class, decoded with Pillow as they are read.

    PATH/CLASS/IMAGE.png                      -> {"all": dataset}; the caller splits it
    PATH/train/CLASS/IMAGE.png (+ val/, test/) -> {"train": ..., "val": ..., "test": ...}

A dataset holds only the folder, relative file paths and labels, so it pickles cheaply
into DataLoader workers. Each sample: resize the shorter side to image_size (bilinear),
crop to crop_size (center, or random with random_crop), flip horizontally with p=0.5
(random_flip), scale to float32 [C, H, W] in [0, 1], normalize per channel with mean/std.
Only the train folder is augmented; val/ and test/ get the center crop and no flip (for one
folder split by the caller, make val/test subsets of `dataset.without_augmentation()`).

Randomness: flips and crops draw from torch's global RNG only (torch.rand, torch.randint),
never from numpy or `random`. The training loop reseeds torch (and numpy, random) from
(seed, epoch, index) before every sample (hpcdl.data.loader.SeededSamples), so a sample gets
the same augmentation in any worker, on any number of ranks, and after a resume.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from PIL import Image

from hpcdl.errors import DataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
# data.channels -> the Pillow mode every image is converted to.
MODES = {1: "L", 3: "RGB"}
# What Pillow raises for a missing, truncated, corrupt or oversized image file.
PILLOW_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


def find_classes(
    root: Path, known: Optional[Sequence[str]] = None
) -> tuple[list[str], list[tuple[str, int]]]:
    """Sorted class (sub-folder) names, and (path relative to root, class index) for every
    image below them, in class then path order. Hidden files and folders are skipped.
    known: a trained model's class names (evaluate, predict): the folders may be any of
    them, and a label is the index of its folder's name among them."""
    if not root.is_dir():
        raise DataError(f"data.path: no such folder '{root}'; point data.path at your images")
    found = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not found:
        raise DataError(
            f"data.path: '{root}' has no class folders; put each class's images in its own "
            "sub-folder (CLASS/IMAGE.png)"
        )
    classes = found if known is None else list(known)
    unknown = [name for name in found if name not in classes]
    if unknown:
        raise DataError(
            f"data.path: class folder '{root / unknown[0]}' is not one of the model's classes "
            f"({', '.join(classes)}); give folders of those classes only"
        )
    samples: list[tuple[str, int]] = []
    for name in found:
        index = classes.index(name)
        files = image_files(root, name)
        if not files:
            raise DataError(
                f"data.path: class folder '{root / name}' holds no images "
                f"({' '.join(IMAGE_SUFFIXES)}); add some or remove the folder"
            )
        samples.extend((file, index) for file in files)
    return classes, samples


def unlabelled_images(path: Path, given: str) -> tuple[Path, list[str]]:
    """`hpcdl predict --input`: one image file, or the image files anywhere below a folder
    (sorted POSIX paths relative to it, class folders or none); (root, paths)."""
    if path.is_file():
        if not path.name.lower().endswith(IMAGE_SUFFIXES):
            raise DataError(
                f"--input {given!r}: not an image file ({' '.join(IMAGE_SUFFIXES)}); give an "
                "image or a folder of them"
            )
        return path.parent, [path.name]
    if not path.is_dir():
        raise DataError(f"--input {given!r}: no such file or folder")
    files = image_files(path, ".")
    if not files:
        raise DataError(
            f"--input {given!r}: holds no images ({' '.join(IMAGE_SUFFIXES)}), in it or below it"
        )
    return path, [Path(f).as_posix() for f in files]


def image_files(root: Path, class_name: str) -> list[str]:
    """Image files anywhere below root/class_name, as sorted POSIX paths relative to root."""
    found = []
    for folder, dirs, files in os.walk(root / class_name, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        base = Path(folder).relative_to(root)
        found += [
            (base / f).as_posix()
            for f in files
            if not f.startswith(".") and f.lower().endswith(IMAGE_SUFFIXES)
        ]
    return sorted(found)


class ImageFolderDataset(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """(x float32 [C, H, W], y int64 scalar) per image file, decoded when indexed."""

    def __init__(
        self,
        root: str | Path,
        samples: Sequence[tuple[str, int]],
        classes: Sequence[str],
        *,
        image_size: Optional[int],
        crop_size: Optional[int],
        random_flip: bool,
        random_crop: bool,
        mean: Optional[Sequence[float]],
        std: Optional[Sequence[float]],
        channels: int,
    ) -> None:
        if channels not in MODES:
            raise DataError(f"data.channels={channels}: use 1 (grayscale) or 3 (RGB)")
        for key, values in (("mean", mean), ("std", std)):
            if values is not None and len(values) != channels:
                raise DataError(
                    f"data.{key}={list(values)}: give one value per channel "
                    f"(data.channels={channels})"
                )
        if std is not None and any(v <= 0 for v in std):
            raise DataError(f"data.std={list(std)}: every value must be > 0")
        if image_size is not None and crop_size is not None and crop_size > image_size:
            raise DataError(
                f"data.crop_size={crop_size} is larger than data.image_size={image_size}: "
                "the crop must fit in the resized image; lower data.crop_size"
            )
        self.root = Path(root)
        self.samples = list(samples)
        self.classes = list(classes)
        self.image_size = image_size
        self.crop_size = crop_size
        self.random_flip = random_flip
        self.random_crop = random_crop
        self.mean = None if mean is None else tuple(float(v) for v in mean)
        self.std = None if std is None else tuple(float(v) for v in std)
        self.mode = MODES[channels]
        # (width, height) of sample 0 after resizing: every sample's size without a crop.
        self._first_size: Optional[tuple[int, int]] = None

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        relative, label = self.samples[index]
        image = self._read(relative)
        if self.image_size is not None:
            image = resize_shorter_side(image, self.image_size)
        if self.crop_size is None:
            self._check_first_size(relative, image.size)
        else:
            image = image.crop(self._crop_box(relative, image.size, self.crop_size))
        x = to_tensor(image)
        if self.random_flip and torch.rand(1).item() < 0.5:
            x = x.flip(-1)
        if self.mean is not None:
            x = x - torch.tensor(self.mean).view(-1, 1, 1)
        if self.std is not None:
            x = x / torch.tensor(self.std).view(-1, 1, 1)
        return x, torch.tensor(label, dtype=torch.int64)

    def without_augmentation(self) -> ImageFolderDataset:
        """The same samples with no random flip and a center crop (for val/test subsets)."""
        plain = copy.copy(self)
        plain.random_flip = plain.random_crop = False
        return plain

    def _read(self, relative: str) -> Image.Image:
        file = self.root / relative
        try:
            with Image.open(file) as image:
                return image.convert(self.mode)
        except PILLOW_ERRORS as exc:
            raise unreadable(file, exc) from exc

    def _check_first_size(self, relative: str, size: tuple[int, int]) -> None:
        """Samples of different sizes cannot be batched: refuse them here, naming the file."""
        first = self.samples[0][0]
        if self._first_size is None:
            self._first_size = size if relative == first else self.image_size_of(first)
        if size == self._first_size:
            return
        resized = "" if self.image_size is None else f" after data.image_size={self.image_size}"
        fix = "set data.image_size and data.crop_size" if not resized else "set data.crop_size"
        raise DataError(
            f"{self.root / relative}: {size[0]}x{size[1]} pixels{resized}, but {self.root / first} "
            f"is {self._first_size[0]}x{self._first_size[1]}; {fix} to bring images to one size"
        )

    def image_size_of(self, relative: str) -> tuple[int, int]:
        """A sample's (width, height) as read (after data.image_size), from its header."""
        file = self.root / relative
        try:
            with Image.open(file) as image:  # reads the header only
                size: tuple[int, int] = image.size
        except PILLOW_ERRORS as exc:
            raise unreadable(file, exc) from exc
        return size if self.image_size is None else resized_size(size, self.image_size)

    def _crop_box(
        self, relative: str, size: tuple[int, int], crop: int
    ) -> tuple[int, int, int, int]:
        width, height = size
        if crop > width or crop > height:
            raise DataError(
                f"{self.root / relative}: {width}x{height} pixels is smaller than "
                f"data.crop_size={crop}; lower data.crop_size or set data.image_size >= it"
            )
        if self.random_crop:
            top = int(torch.randint(height - crop + 1, (1,)).item())
            left = int(torch.randint(width - crop + 1, (1,)).item())
        else:  # rounded as torchvision's CenterCrop does
            top, left = round((height - crop) / 2), round((width - crop) / 2)
        return left, top, left + crop, top + crop


def build_imagefolder(
    path: str,
    *,
    train_dir: str = "train",
    val_dir: str = "val",
    test_dir: str = "test",
    image_size: Optional[int] = None,
    crop_size: Optional[int] = None,
    random_flip: bool = False,
    random_crop: bool = False,
    mean: Optional[Sequence[float]] = None,
    std: Optional[Sequence[float]] = None,
    channels: int = 3,
    classes: Optional[Sequence[str]] = None,
) -> dict[str, ImageFolderDataset]:
    """{"all": dataset} when path holds class folders; else one dataset per split folder
    present (train/ required), each with the same class folders. classes: a trained
    model's class names (see find_classes); each split may then hold any of them."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise DataError(
            f"data.path={path!r}: no such folder; point it at a folder of class sub-folders "
            f"(or of {train_dir}/ {val_dir}/ {test_dir}/ holding them)"
        )

    def dataset(folder: Path, augment: bool) -> ImageFolderDataset:
        names, samples = find_classes(folder, classes)
        return ImageFolderDataset(
            folder,
            samples,
            names,
            image_size=image_size,
            crop_size=crop_size,
            random_flip=random_flip and augment,
            random_crop=random_crop and augment,
            mean=mean,
            std=std,
            channels=channels,
        )

    folders = {"train": train_dir, "val": val_dir, "test": test_dir}
    present = {split: name for split, name in folders.items() if (root / name).is_dir()}
    if not present:
        return {"all": dataset(root, augment=True)}
    if "train" not in present:
        raise DataError(
            f"data.path={path!r}: has {'/ and '.join(present.values())}/ but no {train_dir}/; "
            f"add {train_dir}/CLASS/IMAGE files (or, if these are classes, rename them)"
        )
    made = {
        split: dataset(root / name, augment=split == "train") for split, name in present.items()
    }
    if classes is not None:
        return made  # a trained model's classes: any of them in each split
    train_classes = made["train"].classes
    for split, data in made.items():
        if data.classes != train_classes:
            missing = sorted(set(train_classes) - set(data.classes))
            extra = sorted(set(data.classes) - set(train_classes))
            raise DataError(
                f"data.path={path!r}: {present[split]}/ lacks class folders {missing} and has "
                f"{extra} that {train_dir}/ has not; every split needs the same class folders"
            )
    return made


def resize_shorter_side(image: Image.Image, size: int) -> Image.Image:
    new_size = resized_size(image.size, size)
    return image if new_size == image.size else image.resize(new_size, Image.Resampling.BILINEAR)


def resized_size(size: tuple[int, int], shorter: int) -> tuple[int, int]:
    """(width, height) with the shorter side at `shorter`; the longer one truncated, as
    torchvision's Resize(int) does."""
    width, height = size
    if width <= height:
        return shorter, int(shorter * height / width)
    return int(shorter * width / height), shorter


def to_tensor(image: Image.Image) -> torch.Tensor:
    """float32 [C, H, W] in [0, 1] from an 'L' or 'RGB' image."""
    pixels = np.array(image, dtype=np.uint8)  # a copy: [H, W] or [H, W, C]
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    return torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1))).float() / 255


def unreadable(file: Path, exc: BaseException) -> DataError:
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return DataError(f"{file}: cannot read the image ({reason}); replace or remove the file")
