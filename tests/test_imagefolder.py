"""data=imagefolder: class discovery, lazy Pillow decoding, transforms, layouts, errors."""

from __future__ import annotations

import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from hpcdl.data import imagefolder
from hpcdl.data.imagefolder import ImageFolderDataset, build_imagefolder, find_classes
from hpcdl.errors import DataError


# ----------------------------------------------------------------------------- image writers
def write_image(path: Path, pixels: np.ndarray) -> Path:
    """pixels: uint8 [H, W] (grayscale) or [H, W, 3] (RGB); format from the suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels.astype(np.uint8)).save(path)
    return path


def solid(width: int, height: int, color: tuple[int, int, int]) -> np.ndarray:
    return np.broadcast_to(np.array(color, dtype=np.uint8), (height, width, 3)).copy()


def pattern(width: int, height: int) -> np.ndarray:
    """Every pixel different, and no symmetry: a flip or a shifted crop changes it."""
    values = np.arange(height * width * 3).reshape(height, width, 3)
    return (values * 7 % 251).astype(np.uint8)


def class_tree(root: Path, counts: dict[str, int], size: tuple[int, int] = (8, 6)) -> Path:
    """root/CLASS/i.png for each class; image i of class c is solid (10*i, c index, 0)."""
    for index, name in enumerate(counts):
        for i in range(counts[name]):
            write_image(root / name / f"{i}.png", solid(*size, (10 * i, index, 0)))
    return root


def plain(root: Path, **overrides: Any) -> ImageFolderDataset:
    """The single dataset over a class-per-folder tree, no transforms unless overridden."""
    return build_imagefolder(str(root), **overrides)["all"]


# ----------------------------------------------------------------------------- discovery
def test_find_classes_sorts_classes_and_labels_every_image(tmp_path: Path) -> None:
    img = solid(4, 4, (1, 2, 3))
    write_image(tmp_path / "dog" / "b.png", img)
    write_image(tmp_path / "dog" / "A.PNG", img)  # suffixes are case-insensitive
    write_image(tmp_path / "cat" / "z.jpg", img)
    write_image(tmp_path / "cat" / "deeper" / "a.jpeg", img)  # nested folders count
    write_image(tmp_path / "cat-2" / "x.bmp", img)
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    write_image(tmp_path / "cat" / ".hidden.png", img)
    write_image(tmp_path / "cat" / ".ipynb_checkpoints" / "c.png", img)
    write_image(tmp_path / ".cache" / "d.png", img)  # a hidden folder is not a class
    write_image(tmp_path / "loose.png", img)  # not in a class folder

    classes, samples = find_classes(tmp_path)

    assert classes == ["cat", "cat-2", "dog"]
    assert samples == [
        ("cat/deeper/a.jpeg", 0),
        ("cat/z.jpg", 0),
        ("cat-2/x.bmp", 1),
        ("dog/A.PNG", 2),
        ("dog/b.png", 2),
    ]


def test_labels_are_int64_scalars_of_the_class_index(tmp_path: Path) -> None:
    dataset = plain(class_tree(tmp_path, {"b": 2, "a": 3}))

    assert dataset.classes == ["a", "b"]
    assert dataset.num_classes == 2
    assert len(dataset) == 5
    labels = [dataset[i][1] for i in range(len(dataset))]
    assert all(y.dtype == torch.int64 and y.shape == () for y in labels)
    assert [int(y) for y in labels] == [0, 0, 0, 1, 1]
    # The pixels come from the labelled file: class "a" was written with green 1, "b" with 0.
    assert round(float(dataset[0][0][1, 0, 0]) * 255) == 1
    assert round(float(dataset[4][0][1, 0, 0]) * 255) == 0


# ----------------------------------------------------------------------------- lazy decoding
def test_construction_opens_no_image_and_a_corrupt_one_fails_when_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class_tree(tmp_path, {"cat": 2})
    (tmp_path / "cat" / "broken.png").write_bytes(b"this is not a png")
    jpeg = write_image(tmp_path / "cat" / "cut.jpg", pattern(32, 32))
    jpeg.write_bytes(jpeg.read_bytes()[: jpeg.stat().st_size // 2])

    def no_open(*args: object, **kwargs: object) -> None:
        raise AssertionError("an image was opened while building the dataset")

    with monkeypatch.context() as patch:
        patch.setattr(imagefolder.Image, "open", no_open)
        dataset = plain(tmp_path)

    names = [Path(file).name for file, _ in dataset.samples]
    assert names == ["0.png", "1.png", "broken.png", "cut.jpg"]
    assert dataset[0][0].shape == (3, 6, 8)
    for index, name in ((2, "broken.png"), (3, "cut.jpg")):
        with pytest.raises(DataError, match=f"{name}: cannot read the image") as error:
            dataset[index]
        assert "\n" not in str(error.value)


def test_a_corrupt_image_read_by_a_worker_is_one_line_naming_it(tmp_path: Path) -> None:
    """torch re-raises a worker's DataError with the worker's traceback for its message: the
    run's error line was "Caught DataError in DataLoader worker process 0." and 30 more."""
    from hpcdl.config.schema import ImageFolderConfig
    from hpcdl.data.feed import build_dataset_feed

    class_tree(tmp_path, {"cat": 3, "dog": 3})
    (tmp_path / "dog" / "2.png").write_bytes(b"this is not a png")
    cfg = ImageFolderConfig(path=str(tmp_path), num_workers=1, val_fraction=0.0)
    cfg.test_fraction = 0.0
    feed = build_dataset_feed(cfg, seed=0)
    with pytest.raises(DataError) as error:
        list(feed.eval_batches("train", 0, 1, torch.device("cpu"), 2))
    assert str(error.value) == (
        f"{tmp_path / 'dog' / '2.png'}: cannot read the image (cannot identify image file "
        f"'{tmp_path / 'dog' / '2.png'}'); replace or remove the file"
    )


def test_the_dataset_pickles_without_pixels(tmp_path: Path) -> None:
    for i in range(4):
        write_image(
            tmp_path / "noise" / f"{i}.png", np.random.default_rng(i).integers(0, 255, (64, 64, 3))
        )
    dataset = plain(tmp_path)
    dataset[0]  # a read must not cache the decoded image either

    blob = pickle.dumps(dataset)

    assert len(blob) < 2_000  # four 64x64 RGB images are 49,152 bytes of pixels
    assert torch.equal(pickle.loads(blob)[3][0], dataset[3][0])


def test_works_in_a_dataloader_with_spawned_workers(tmp_path: Path) -> None:
    # spawn, not fork: the workers get the dataset by pickling it.
    dataset = plain(class_tree(tmp_path, {"a": 3, "b": 4}), crop_size=4)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=3, num_workers=2, multiprocessing_context="spawn"
    )

    batches = list(loader)

    assert torch.equal(torch.cat([x for x, _ in batches]), torch.stack([x for x, _ in dataset]))
    assert torch.cat([y for _, y in batches]).tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert batches[0][0].shape == (3, 3, 4, 4)


# ----------------------------------------------------------------------------- transforms
def test_resize_shorter_side_is_bilinear_and_keeps_the_aspect(tmp_path: Path) -> None:
    pixels = pattern(40, 20)
    write_image(tmp_path / "wide" / "a" / "x.png", pixels)
    write_image(tmp_path / "tall" / "a" / "x.png", pattern(20, 40))

    wide = plain(tmp_path / "wide", image_size=10)[0][0]
    tall = plain(tmp_path / "tall", image_size=10)[0][0]

    assert wide.shape == (3, 10, 20)
    assert tall.shape == (3, 20, 10)
    expected = np.array(Image.fromarray(pixels).resize((20, 10), Image.Resampling.BILINEAR))
    assert torch.allclose(wide, torch.from_numpy(expected).permute(2, 0, 1).float() / 255)


def test_center_crop_after_resize_and_without_it(tmp_path: Path) -> None:
    pixels = np.zeros((6, 10, 3), dtype=np.uint8)
    pixels[:, :, 0] = np.arange(10) * 10  # red: the column
    pixels[:, :, 1] = (np.arange(6) * 10)[:, None]  # green: the row
    write_image(tmp_path / "a" / "grid.png", pixels)
    write_image(tmp_path / "b" / "big.png", pattern(40, 20))

    cropped = plain(tmp_path, crop_size=4)[0][0]
    assert (cropped[0, 0] * 255).round().tolist() == [30, 40, 50, 60]
    assert (cropped[1, :, 0] * 255).round().tolist() == [10, 20, 30, 40]

    assert plain(tmp_path, image_size=6, crop_size=5)[1][0].shape == (3, 5, 5)


def test_rgb_and_grayscale_channels(tmp_path: Path) -> None:
    color = (200, 100, 50)
    write_image(tmp_path / "a" / "color.png", solid(5, 4, color))
    write_image(tmp_path / "b" / "gray.png", np.full((4, 5), 77))
    write_image(tmp_path / "c" / "photo.jpg", solid(5, 4, color))

    rgb = plain(tmp_path, channels=3)
    gray = plain(tmp_path, channels=1)

    assert rgb[0][0].shape == (3, 4, 5) and rgb[0][0].dtype == torch.float32
    assert (rgb[0][0][:, 0, 0] * 255).round().tolist() == list(color)
    assert (rgb[1][0] * 255).round().unique().tolist() == [77]  # gray copied to 3 channels
    assert torch.allclose(rgb[2][0][:, 0, 0] * 255, torch.tensor(color).float(), atol=4)
    luma = Image.new("RGB", (1, 1), color).convert("L").getpixel((0, 0))
    assert gray[0][0].shape == (1, 4, 5)
    assert (gray[0][0] * 255).round().unique().tolist() == [luma]
    assert (gray[1][0] * 255).round().unique().tolist() == [77]
    assert gray[2][0].shape == (1, 4, 5)


def test_normalization_per_channel(tmp_path: Path) -> None:
    write_image(tmp_path / "a" / "x.png", solid(3, 2, (255, 0, 51)))  # 1.0, 0.0, 0.2

    x = plain(tmp_path, mean=[0.5, 0.25, 0.1], std=[0.5, 0.25, 0.2])[0][0]

    assert x.dtype == torch.float32
    for channel, value in enumerate([1.0, -1.0, 0.5]):
        assert torch.allclose(x[channel], torch.full((2, 3), value), atol=1e-6)


def test_random_flip_and_crop_follow_torch_seed_only(tmp_path: Path) -> None:
    write_image(tmp_path / "a" / "x.png", pattern(12, 10))
    full = plain(tmp_path)[0][0]
    augmented = plain(tmp_path, crop_size=6, random_crop=True, random_flip=True)

    candidates = {}
    for top in range(10 - 6 + 1):
        for left in range(12 - 6 + 1):
            window = full[:, top : top + 6, left : left + 6]
            candidates[(top, left, False)] = window
            candidates[(top, left, True)] = window.flip(-1)

    windows = set()
    flips = set()
    for seed in range(12):
        torch.manual_seed(seed)
        random.seed(1)
        np.random.seed(1)
        x = augmented[0][0]
        torch.manual_seed(seed)
        random.seed(2)  # Python's and numpy's RNGs must not matter
        np.random.seed(2)
        assert torch.equal(augmented[0][0], x)
        matches = [key for key, window in candidates.items() if torch.equal(x, window)]
        assert len(matches) == 1  # each output is one window of the image, maybe mirrored
        windows.add(matches[0][:2])
        flips.add(matches[0][2])
    assert len(windows) > 3
    assert flips == {False, True}


# ----------------------------------------------------------------------------- layouts
def test_train_val_test_folders(tmp_path: Path) -> None:
    class_tree(tmp_path / "train", {"cat": 3, "dog": 2}, size=(10, 8))
    class_tree(tmp_path / "val", {"cat": 1, "dog": 1}, size=(10, 8))
    class_tree(tmp_path / "test", {"cat": 2, "dog": 1}, size=(10, 8))
    write_image(tmp_path / "val" / "dog" / "0.png", pattern(10, 8))  # a crop or flip shows

    made = build_imagefolder(str(tmp_path), crop_size=4, random_crop=True, random_flip=True)

    assert sorted(made) == ["test", "train", "val"]
    assert [len(made[s]) for s in ("train", "val", "test")] == [5, 2, 3]
    assert all(d.classes == ["cat", "dog"] for d in made.values())
    assert [int(made["test"][i][1]) for i in range(3)] == [0, 0, 1]
    assert made["train"].root == tmp_path / "train"
    # Only train is augmented: val gives its center crop whatever the seed.
    center = build_imagefolder(str(tmp_path), crop_size=4)["val"][1][0]
    for seed in range(5):
        torch.manual_seed(seed)
        assert torch.equal(made["val"][1][0], center)

    shutil.rmtree(tmp_path / "test")
    assert sorted(build_imagefolder(str(tmp_path))) == ["train", "val"]


def test_split_folders_need_train(tmp_path: Path) -> None:
    class_tree(tmp_path / "val", {"cat": 1})
    with pytest.raises(DataError, match=r"has val/ but no train/"):
        build_imagefolder(str(tmp_path))
    class_tree(tmp_path / "training", {"cat": 1})
    assert sorted(build_imagefolder(str(tmp_path), train_dir="training")) == ["train", "val"]


def test_mismatched_classes_between_splits_are_refused(tmp_path: Path) -> None:
    class_tree(tmp_path / "train", {"cat": 1, "dog": 1})
    class_tree(tmp_path / "val", {"cat": 1, "eel": 1})

    with pytest.raises(DataError, match=r"val/ lacks class folders \['dog'\] and has \['eel'\]"):
        build_imagefolder(str(tmp_path))


# ----------------------------------------------------------------------------- errors
def test_empty_class_folder_is_refused(tmp_path: Path) -> None:
    class_tree(tmp_path, {"cat": 2})
    (tmp_path / "dog").mkdir()
    (tmp_path / "dog" / "readme.txt").write_text("no images here")

    with pytest.raises(DataError, match=r"class folder '.*dog' holds no images"):
        plain(tmp_path)


def test_missing_folder_and_no_class_folders_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"data.path='.*nowhere': no such folder"):
        build_imagefolder(str(tmp_path / "nowhere"))
    write_image(tmp_path / "loose.png", solid(2, 2, (0, 0, 0)))
    with pytest.raises(DataError, match=r"has no class folders"):
        build_imagefolder(str(tmp_path))


def test_images_of_different_sizes_need_a_size(tmp_path: Path) -> None:
    write_image(tmp_path / "a" / "0.png", pattern(8, 8))
    write_image(tmp_path / "a" / "1.png", pattern(10, 8))

    dataset = plain(tmp_path)
    assert dataset[0][0].shape == (3, 8, 8)
    with pytest.raises(
        DataError, match=r"1\.png: 10x8 pixels, but .*0\.png is 8x8; set data.image_size"
    ):
        dataset[1]
    # The reference is sample 0 even when another sample is read first.
    with pytest.raises(DataError, match=r"1\.png: 10x8"):
        plain(tmp_path)[1]
    # Resizing alone leaves 8x8 and 10x8 apart; a crop brings them together.
    with pytest.raises(DataError, match=r"after data.image_size=4.*set data.crop_size"):
        plain(tmp_path, image_size=4)[1]
    assert plain(tmp_path, image_size=4, crop_size=4)[1][0].shape == (3, 4, 4)


def test_crop_larger_than_the_image_is_refused(tmp_path: Path) -> None:
    write_image(tmp_path / "a" / "small.png", pattern(5, 4))

    with pytest.raises(DataError, match=r"small\.png: 5x4 pixels is smaller than data.crop_size=5"):
        plain(tmp_path, crop_size=5)[0]
    with pytest.raises(DataError, match=r"data.crop_size=8 is larger than data.image_size=6"):
        plain(tmp_path, image_size=6, crop_size=8)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"channels": 2}, r"data.channels=2: use 1"),
        ({"mean": [0.5]}, r"data.mean=\[0.5\]: give one value per channel"),
        ({"channels": 1, "std": [0.0]}, r"data.std=\[0.0\]: every value must be > 0"),
    ],
)
def test_bad_settings_are_refused(tmp_path: Path, overrides: dict, message: str) -> None:
    class_tree(tmp_path, {"a": 1})
    with pytest.raises(DataError, match=message):
        plain(tmp_path, **overrides)


def test_without_augmentation_gives_the_center_crop(tmp_path: Path) -> None:
    write_image(tmp_path / "a" / "x.png", pattern(12, 10))
    augmented = plain(tmp_path, crop_size=6, random_crop=True, random_flip=True)
    center = plain(tmp_path, crop_size=6)[0][0]

    evaluated = augmented.without_augmentation()

    seen = set()
    for seed in range(8):
        torch.manual_seed(seed)
        assert torch.equal(evaluated[0][0], center)
        torch.manual_seed(seed)
        seen.add(augmented[0][0].numpy().tobytes())  # the original stays augmented
    assert len(seen) > 1


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "data.standardize=true",
            "data.standardize: data=imagefolder reads samples lazily and does not use it; "
            "normalize per channel with data.mean=[...] data.std=[...] instead (remove "
            "data.standardize)",
        ),
        (
            "data.in_memory=false",
            "data.in_memory: data=imagefolder reads samples lazily and does not use it; its "
            "images are read by DataLoader workers (data.num_workers) (remove data.in_memory)",
        ),
        (
            "data.val_fraction=0.2",
            "data.val_fraction: data.path='{root}' holds train/ (and its own val/ if any) "
            "split folders, which are the splits; the fractions split only a folder of class "
            "folders (remove data.val_fraction, or move val images into val/)",
        ),
    ],
)
def test_keys_a_split_image_folder_would_ignore_are_refused(
    tmp_path: Path, override: str, message: str
) -> None:
    """They were ignored without a word: images trained unstandardized, no val split."""
    from hpcdl.cli.compose import compose_config
    from hpcdl.errors import ConfigError

    class_tree(tmp_path / "train", {"a": 2, "b": 2})
    base = ["data=imagefolder", f"data.path={tmp_path}"]
    with pytest.raises(ConfigError) as err:
        compose_config([*base, override])
    assert str(err.value) == message.format(root=tmp_path)
    compose_config(base)  # the source's own keys: fine
    flat = tmp_path / "flat"
    class_tree(flat, {"a": 2, "b": 2})
    cfg = compose_config(["data=imagefolder", f"data.path={flat}", "data.val_fraction=0.2"])
    assert cfg.data.val_fraction == 0.2  # class folders in data.path: the fraction splits them
    with pytest.raises(ConfigError, match=r"^data.standardize: data=custom reads .* normalize in"):
        compose_config(["data=custom", "data.target=m:f", "data.standardize=false"])
    (tmp_path / "rows.csv").write_text("a,label\n1,0\n")
    with pytest.raises(ConfigError) as err:  # was "no such folder", of a file that exists
        compose_config(["data=imagefolder", f"data.path={tmp_path / 'rows.csv'}"])
    assert str(err.value) == (
        f"data.path='{tmp_path / 'rows.csv'}': a file; data=imagefolder reads a folder of class "
        f"sub-folders of images (for this file: data=files data.path={tmp_path / 'rows.csv'})"
    )


def test_a_train_folder_without_val_warns_that_there_is_no_validation(tmp_path: Path) -> None:
    from hpcdl.config.schema import ImageFolderConfig
    from hpcdl.data.feed import build_imagefolder_datasets
    from hpcdl.errors import DataWarning

    class_tree(tmp_path / "train", {"a": 2, "b": 2})
    cfg = ImageFolderConfig(path=str(tmp_path), channels=3)
    with pytest.warns(DataWarning, match=r"holds train/ but no val/ folder, so the run has no "):
        splits, _ = build_imagefolder_datasets(cfg)
    assert len(splits["val"]) == 0
    class_tree(tmp_path / "val", {"a": 1, "b": 1})
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        splits, _ = build_imagefolder_datasets(cfg)
    assert len(splits["val"]) == 2


def test_one_folder_is_split_stratified_so_a_rare_class_reaches_val_and_test(
    tmp_path: Path,
) -> None:
    """It was a plain permutation: a class of 6 images in 86 could be missing from the test
    split, its test metrics silently without it (configuration.md said stratified)."""
    from collections import Counter

    from hpcdl.config.schema import ImageFolderConfig
    from hpcdl.data.feed import build_imagefolder_datasets

    for index, (name, count) in enumerate({"common": 40, "other": 40, "rare": 6}.items()):
        for i in range(count):
            write_image(tmp_path / name / f"{i}.png", solid(8, 6, (i, index, 0)))

    def counts(stratify: bool, seed: int) -> dict[str, Counter]:
        cfg = ImageFolderConfig(path=str(tmp_path), split_seed=seed, stratify=stratify)
        splits, names = build_imagefolder_datasets(cfg)
        return {
            split: Counter(names[data.dataset.samples[i][1]] for i in data.indices)
            for split, data in splits.items()
        }

    for seed in range(5):
        made = counts(True, seed)
        assert made["test"] == {"common": 6, "other": 6, "rare": 1}, made
        assert made["val"]["rare"] == 1 and sum(made["train"].values()) == 60
    plain = [counts(False, seed)["test"]["rare"] for seed in range(20)]
    assert 0 in plain  # what a run stored before `stratify` existed still gets
