"""Data: every source on small real-format files, splits, standardization, k-fold, sharding."""

from __future__ import annotations

import gzip
import pickle
import re
import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcdl.config import schema
from hpcdl.data import (
    EpochSharder,
    Preprocessing,
    build_data,
    iterate_batches,
    load_feature_rows,
)
from hpcdl.errors import ConfigError, DataError, DataWarning


# ----------------------------------------------------------------------------- file writers
def write_idx(path: Path, array: np.ndarray, *, gz: bool = False, magic: int | None = None) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) if magic is None else struct.pack(">I", magic)
    content = (
        header + struct.pack(f">{array.ndim}I", *array.shape) + array.astype(np.uint8).tobytes()
    )
    if gz:
        with gzip.open(f"{path}.gz", "wb") as f:
            f.write(content)
    else:
        path.write_bytes(content)


def write_mnist(folder: Path, *, gz: bool = False, num_train: int = 60, num_test: int = 20):
    """Tiny MNIST-format set (6x5 pixels, 10 classes); returns the arrays written."""
    rng = np.random.default_rng(0)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (num_train, 6, 5), dtype=np.uint8),
        "train-labels-idx1-ubyte": (np.arange(num_train) % 10).astype(np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (num_test, 6, 5), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": (np.arange(num_test) % 10).astype(np.uint8),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        write_idx(folder / name, array, gz=gz)
    return arrays


def write_cifar(folder: Path, *, num_per_batch: int = 10, meta: bool = True):
    """Tiny CIFAR-10 pickle batches; returns {batch name: (data [N, 3072], labels)}."""
    rng = np.random.default_rng(1)
    folder.mkdir(parents=True, exist_ok=True)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (num_per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in np.arange(num_per_batch) % 10]
        with (folder / name).open("wb") as f:
            pickle.dump({b"data": data, b"labels": labels, b"batch_label": name.encode()}, f)
        batches[name] = (data, labels)
    if meta:
        names = [f"c{i}".encode() for i in range(10)]
        with (folder / "batches.meta").open("wb") as f:
            pickle.dump({b"label_names": names}, f)
    return batches


def indexed_npz(path: Path, num_samples: int = 200, num_classes: int = 4) -> np.ndarray:
    """Feature 0 holds each sample's index, so splits can be traced back; returns labels."""
    rng = np.random.default_rng(2)
    y = np.array(["cat", "dog", "emu", "yak"])[np.arange(num_samples) % num_classes]
    x = np.column_stack([np.arange(num_samples), rng.normal(5.0, 3.0, (num_samples, 3))])
    np.savez(path, x=x, y=y)
    return y


def files_cfg(path: Path, **kwargs) -> schema.FilesConfig:
    return schema.FilesConfig(path=str(path), **kwargs)


def split_ids(data) -> list[np.ndarray]:
    """Original sample indices of train/val/test (feature 0, unstandardized)."""
    return [x[:, 0].numpy().astype(np.int64) for x in (data.x_train, data.x_val, data.x_test)]


# ----------------------------------------------------------------------------- mnist
@pytest.mark.parametrize("gz", [False, True])
def test_mnist_idx_raw_and_gz(tmp_path, gz):
    arrays = write_mnist(tmp_path, gz=gz)
    data = build_data(schema.MnistConfig(path=str(tmp_path), val_fraction=0.2, standardize=False))
    assert data.input_shape == (1, 6, 5)
    assert data.num_classes == 10 and data.class_names == [str(i) for i in range(10)]
    assert (data.x_train.shape[0], data.x_val.shape[0]) == (48, 12)
    # the official t10k set is the test split, scaled to [0, 1]
    expected = torch.from_numpy(arrays["t10k-images-idx3-ubyte"]).float()[:, None] / 255
    torch.testing.assert_close(data.x_test, expected)
    assert data.y_test.tolist() == arrays["t10k-labels-idx1-ubyte"].tolist()
    assert data.x_train.dtype == torch.float32 and data.y_train.dtype == torch.int64


def test_mnist_flat(tmp_path):
    write_mnist(tmp_path)
    data = build_data(schema.MnistConfig(path=str(tmp_path), as_images=False, val_fraction=0.2))
    assert data.input_shape == (30,) and data.x_test.shape == (20, 30)


def test_mnist_missing_file(tmp_path):
    write_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match=r"data.path=.*missing t10k-labels-idx1-ubyte\[\.gz\]"):
        build_data(schema.MnistConfig(path=str(tmp_path)))


def test_mnist_bad_magic(tmp_path):
    write_mnist(tmp_path)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(60, np.uint8), magic=0x00000803)
    with pytest.raises(DataError, match="magic number 0x00000803, expected 0x00000801"):
        build_data(schema.MnistConfig(path=str(tmp_path)))


def test_mnist_truncated(tmp_path):
    write_mnist(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(DataError, match="truncated or corrupt"):
        build_data(schema.MnistConfig(path=str(tmp_path)))


def test_mnist_label_count_mismatch(tmp_path):
    write_mnist(tmp_path)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(59, np.uint8))
    with pytest.raises(DataError, match="60 samples but train labels hold 59"):
        build_data(schema.MnistConfig(path=str(tmp_path)))


def test_mnist_test_images_of_another_size_are_refused(tmp_path):
    # 20 images of 6x5 are 600 bytes; 24 of 5x5 are too: before, they were read as 20 of 6x5.
    write_mnist(tmp_path)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((24, 5, 5), np.uint8))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(24, np.uint8))
    with pytest.raises(DataError, match="t10k images are 5x5 pixels, train images 6x5"):
        build_data(schema.MnistConfig(path=str(tmp_path)))


@pytest.mark.parametrize("damage", ["cut", "damaged"])
def test_mnist_corrupt_gz(tmp_path, damage):
    write_mnist(tmp_path, gz=True, num_train=600)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    content = bytearray(path.read_bytes())
    if damage == "cut":
        content = content[:20]
    else:  # a damaged deflate stream: zlib.error ("invalid stored block lengths"), not caught
        content = bytearray(gzip.compress(gzip.decompress(content), mtime=0))
        content[12:20] = b"\xff" * 8  # the deflate stream starts at byte 10
    path.write_bytes(bytes(content))
    with pytest.raises(DataError, match=r"cannot read.*; the file is truncated or corrupt"):
        build_data(schema.MnistConfig(path=str(tmp_path)))


# ----------------------------------------------------------------------------- cifar10
@pytest.mark.parametrize("point_at_parent", [False, True])
def test_cifar10_batches(tmp_path, point_at_parent):
    folder = tmp_path / "cifar-10-batches-py"
    batches = write_cifar(folder)
    path = tmp_path if point_at_parent else folder
    data = build_data(schema.Cifar10Config(path=str(path), val_fraction=0.2, standardize=False))
    assert data.input_shape == (3, 32, 32) and data.num_classes == 10
    assert data.class_names == [f"c{i}" for i in range(10)]
    assert (data.x_train.shape[0], data.x_val.shape[0], data.x_test.shape[0]) == (40, 10, 10)
    test_data, test_labels = batches["test_batch"]
    expected = torch.from_numpy(test_data).float().reshape(-1, 3, 32, 32) / 255
    torch.testing.assert_close(data.x_test, expected)
    assert data.y_test.tolist() == test_labels


def test_cifar10_default_class_names_and_errors(tmp_path):
    write_cifar(tmp_path, meta=False)
    cfg = schema.Cifar10Config(path=str(tmp_path), val_fraction=0.2)
    assert build_data(cfg).class_names[:2] == ["airplane", "automobile"]
    (tmp_path / "data_batch_3").unlink()
    with pytest.raises(DataError, match=r"missing .*data_batch_3"):
        build_data(cfg)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"data.path=.*no test_batch"):
        build_data(schema.Cifar10Config(path=str(tmp_path / "empty")))
    with pytest.raises(ConfigError, match=r"data.path=.*nowhere.*no such file or folder"):
        build_data(schema.Cifar10Config(path=str(tmp_path / "nowhere")))


def test_cifar10_bad_batch(tmp_path):
    write_cifar(tmp_path)
    with (tmp_path / "data_batch_2").open("wb") as f:
        pickle.dump({b"data": np.zeros((10, 100), np.uint8), b"labels": [0] * 10}, f)
    cfg = schema.Cifar10Config(path=str(tmp_path), val_fraction=0.2)
    with pytest.raises(DataError, match=r"data_batch_2 holds data \(10, 100\)"):
        build_data(cfg)
    (tmp_path / "data_batch_2").write_bytes(b"not a pickle")
    with pytest.raises(DataError, match="cannot unpickle"):
        build_data(cfg)


# ----------------------------------------------------------------------------- files
def test_an_npz_s_other_arrays_are_never_read(tmp_path):
    """Only x and y are read from a .npz (also by predict's --input): an array of Python
    objects next to them, which reading would refuse (allow_pickle=False), stays unread."""
    x = np.arange(60, dtype=np.float32).reshape(30, 2)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(30) % 2, notes=np.array([{"a": 1}] * 30))
    data = build_data(files_cfg(tmp_path / "d.npz", standardize=False))
    assert data.input_shape == (2,) and len(data.x_train) + len(data.x_val) + len(data.x_test) == 30
    rows = load_feature_rows(str(tmp_path / "d.npz"), (2,))
    assert np.array_equal(np.asarray(rows), x)
    np.savez(tmp_path / "one.npz", features=x)
    assert np.array_equal(np.asarray(load_feature_rows(str(tmp_path / "one.npz"), (2,))), x)
    np.savez(tmp_path / "two.npz", a=x, b=x)
    with pytest.raises(DataError, match=r"no array 'x' \(has \['a', 'b'\]\)"):
        load_feature_rows(str(tmp_path / "two.npz"), (2,))
    np.savez(tmp_path / "noy.npz", x=x, notes=np.array([{"a": 1}] * 30))
    with pytest.raises(DataError, match=r"no array 'y' \(has \['notes', 'x'\]\)"):
        build_data(files_cfg(tmp_path / "noy.npz"))


def test_npz_with_string_labels(tmp_path):
    y = indexed_npz(tmp_path / "d.npz")
    data = build_data(files_cfg(tmp_path / "d.npz"))
    assert data.class_names == ["cat", "dog", "emu", "yak"] and data.input_shape == (4,)
    data = build_data(files_cfg(tmp_path / "d.npz", standardize=False))
    for ids, labels in zip(split_ids(data), (data.y_train, data.y_val, data.y_test), strict=True):
        assert [data.class_names[i] for i in labels] == y[ids].tolist()


def test_npy_with_labels_path(tmp_path):
    x = np.random.default_rng(0).normal(size=(50, 2, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.arange(50) % 2 + 7)
    data = build_data(files_cfg(tmp_path / "x.npy", labels_path=str(tmp_path / "y.npy")))
    assert data.input_shape == (2, 3) and data.class_names == ["7", "8"]
    assert sum(len(t) for t in (data.y_train, data.y_val, data.y_test)) == 50


def test_csv_with_label_column(tmp_path):
    lines = ["a,grade,b"] + [f"{i},{['9', '10', '2'][i % 3]},{i * 0.5}" for i in range(30)]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    data = build_data(files_cfg(tmp_path / "d.csv", label_column="grade", standardize=False))
    assert data.class_names == ["2", "9", "10"]  # numbers sort by value
    ids, labels = split_ids(data)[0], data.y_train.numpy()
    assert [data.class_names[v] for v in labels] == [["9", "10", "2"][i % 3] for i in ids]
    torch.testing.assert_close(data.x_train[:, 1], torch.from_numpy(ids * 0.5).float())


def test_csv_feature_columns_pick_and_order_the_features(tmp_path):
    """data.feature_columns: an ID, a note and an unnamed column are left unread, the picked
    columns are read in the order given and recorded for predict."""
    lines = [",id,a,note,grade,b"] + [
        f"{i},{1000 + i},{i},text,{i % 2},{i * 0.5}" for i in range(30)
    ]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    cfg = files_cfg(
        tmp_path / "d.csv", label_column="grade", feature_columns=["b", "a"], standardize=False
    )
    data = build_data(cfg)
    assert data.feature_columns == ["b", "a"] and data.input_shape == (2,)
    torch.testing.assert_close(data.x_train[:, 0], data.x_train[:, 1] * 0.5)  # b = a / 2


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (["a", "bb"], "data.feature_columns: no column 'bb' in the header of"),
        (["a", "grade"], "data.feature_columns: 'grade' is data.label_column, the target"),
        (["a", "a"], "data.feature_columns: 'a' is given twice; give it once"),
        ([], "data.feature_columns=[]: name at least one column"),
    ],
)
def test_csv_feature_columns_mistakes_are_one_line(tmp_path, columns, message):
    lines = ["a,grade,b"] + [f"{i},{i % 2},{i * 0.5}" for i in range(30)]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    cfg = files_cfg(tmp_path / "d.csv", label_column="grade", feature_columns=columns)
    with pytest.raises(DataError, match=re.escape(message)):
        build_data(cfg)
    np.savez(tmp_path / "d.npz", x=np.zeros((30, 2)), y=np.arange(30) % 2)
    with pytest.raises(DataError, match=r"picks a CSV's columns by name; .* is a \.npz file"):
        build_data(files_cfg(tmp_path / "d.npz", feature_columns=["a"]))


def write_big_csv(path: Path, num_rows: int, num_features: int) -> np.ndarray:
    """A CSV with a header, float features and a class-name label column; its features."""
    x = np.random.default_rng(0).normal(size=(num_rows, num_features))
    names = ",".join(f"g{i}" for i in range(num_features))
    body = "".join(
        ",".join(map(repr, row)) + f",{'ab'[i % 2]}\n" for i, row in enumerate(x.tolist())
    )
    path.write_text(f"{names},kind\n{body}")
    return x


@pytest.mark.parametrize("reader", ["training", "predict --input"])
def test_csv_is_parsed_in_chunks_not_held_as_text(tmp_path, reader):
    """A CSV is parsed a chunk of rows at a time: read whole as Python strings, 50k x 11
    cells took ~10x the float64 features' 4 MB at their peak (a 200k-row CSV: ~850 MB)."""
    import tracemalloc

    x = write_big_csv(tmp_path / "big.csv", 50_000, 10)
    names = [f"g{i}" for i in range(10)]
    write_big_csv(tmp_path / "small.csv", 20, 10)  # imports (scikit-learn's) are not traced
    build_data(files_cfg(tmp_path / "small.csv", label_column="kind"))
    tracemalloc.start()
    try:
        if reader == "training":
            got = build_data(files_cfg(tmp_path / "big.csv", label_column="kind"))
            assert got.feature_columns == names and got.class_names == ["a", "b"]
            num_rows = sum(len(y) for y in (got.y_train, got.y_val, got.y_test))
            assert num_rows == 50_000
        else:
            rows = load_feature_rows(str(tmp_path / "big.csv"), (10,), names, "kind")
            np.testing.assert_array_equal(rows, x.astype(np.float32))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 6 * x.nbytes, f"peak {peak / 2**20:.0f} MiB for {x.nbytes / 2**20:.0f} MiB"


def test_csv_mistakes_past_the_first_chunk_name_their_line(tmp_path):
    lines = ["a,b,label"] + [f"{i},{i},{i % 2}" for i in range(10_000)]
    lines[9_000] = "1,oops,0"
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"d.csv' line 9001, column 'b': 'oops' is not a number"):
        build_data(files_cfg(tmp_path / "d.csv"))
    lines[9_000] = "1,0"
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"d.csv' line 9001 has 2 columns, expected 3"):
        load_feature_rows(str(tmp_path / "d.csv"), (2,), ["a", "b"], "label")


def test_npy_splits_are_prepared_a_chunk_at_a_time(tmp_path):
    """A .npy of features is memory-mapped and each split prepared from it a chunk at a
    time: it was read whole, then each split copied raw and prepared whole (NumPy's share of
    the peak: 1.9x the file; now the training split's raw copy for the fit, 0.74x)."""
    import tracemalloc

    from hpcdl.data.splits import split_indices

    x = np.random.default_rng(0).normal(2.0, 3.0, size=(20_000, 100)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.arange(20_000) % 3)
    cfg = files_cfg(tmp_path / "x.npy", labels_path=str(tmp_path / "y.npy"))
    build_data(cfg)  # imports are not traced
    tracemalloc.start()
    try:
        data = build_data(cfg)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.2 * x.nbytes, f"peak {peak / x.nbytes:.2f}x the file"
    split = split_indices(np.arange(20_000) % 3, cfg, has_official_test=False)
    prepare = Preprocessing.fit(x[split.train], scale=1.0, standardize=True)
    for got, idx in (
        (data.x_train, split.train),
        (data.x_val, split.val),
        (data.x_test, split.test),
    ):
        assert torch.equal(got, prepare.apply(x[idx]))


def test_other_data_of_another_width_is_refused_naming_the_file(tmp_path):
    """evaluate/predict on other data: it said only 'features of shape (40, 3) do not fit
    the model's input_shape (2,)', naming neither the key nor the file."""
    np.save(tmp_path / "x.npy", np.zeros((40, 3), dtype=np.float32))
    np.save(tmp_path / "y.npy", np.arange(40) % 2)
    trained = Preprocessing.fit(np.ones((10, 2)), scale=1.0, standardize=True)
    cfg = files_cfg(tmp_path / "x.npy", labels_path=str(tmp_path / "y.npy"))
    match = r"data.path='.*x.npy': samples of shape \(3,\), the checkpoint's model was trained"
    match += r" on .* \(2,\)"
    with pytest.raises(DataError, match=match):
        build_data(cfg, preprocessing=trained)


def test_csv_header_names_are_recorded_for_predict(tmp_path):
    """The checkpoint's data_info names a CSV's feature columns and label column, so that
    `hpcdl predict` can pick an input CSV's columns by name; not for a header whose names
    repeat (a name would not pick one column), nor for arrays."""
    from hpcdl.data.feed import build_feed

    def info(name: str, header: str, **kwargs) -> dict:
        lines = [header] + [f"{i},{i % 2},{i * 0.5}" for i in range(30)]
        (tmp_path / name).write_text("\n".join(lines) + "\n")
        return build_feed(files_cfg(tmp_path / name, **kwargs), torch.device("cpu"), 0).info()

    got = info("d.csv", "b,grade,a", label_column="grade")
    assert got["feature_columns"] == ["b", "a"] and got["label_column"] == "grade"
    assert "feature_columns" not in info("twice.csv", "a,label,a")
    indexed_npz(tmp_path / "d.npz")
    npz = build_feed(files_cfg(tmp_path / "d.npz"), torch.device("cpu"), 0).info()
    assert "feature_columns" not in npz


@pytest.mark.parametrize(
    ("setup", "match"),
    [
        ("npy_without_labels", r"data.path=.*set data.labels_path"),
        ("count_mismatch", "50 feature rows but 49 labels"),
        ("npz_missing_y", "no array 'y'"),
        ("csv_missing_column", "data.label_column='label': no such column"),
        ("csv_non_numeric", "d.csv' line 3, column 'a': 'abc' is not a number"),
        ("nan_features", r"row 3, feature 1 holds nan \(1 NaN or inf value in the features\)"),
        ("csv_inf", r"line 4, column 'b' holds inf \(2 NaN or inf values in the features\)"),
        ("one_class", "need at least two classes"),
        ("unknown_suffix", "unknown file type '.txt'"),
        ("missing_file", "no such file"),
        # Before: "'utf-8' codec can't decode byte 0x80 in position 6", no line, no fix.
        ("csv_cp1252", r"d.csv' line 3 \(byte 0x80\) is not UTF-8 text \(Excel's plain \"CSV\" "
         r"is Windows-1252\); save it as \"CSV UTF-8\", or convert it: iconv -f cp1252"),
    ],
)  # fmt: skip
def test_files_errors(tmp_path, setup, match):
    x, y = np.ones((50, 3)), np.arange(50) % 2
    cfg = files_cfg(tmp_path / "x.npy", labels_path=str(tmp_path / "y.npy"))
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    if setup == "npy_without_labels":
        cfg.labels_path = None
    elif setup == "count_mismatch":
        np.save(tmp_path / "y.npy", y[:49])
    elif setup == "npz_missing_y":
        np.savez(tmp_path / "d.npz", x=x, labels=y)
        cfg = files_cfg(tmp_path / "d.npz")
    elif setup in ("csv_missing_column", "csv_non_numeric"):
        cell = "abc" if setup == "csv_non_numeric" else "1"
        header = "a,label" if setup == "csv_non_numeric" else "a,b"
        (tmp_path / "d.csv").write_text(f"{header}\n1,0\n{cell},1\n")
        cfg = files_cfg(tmp_path / "d.csv")
    elif setup == "csv_inf":  # float() reads "inf" and "nan" as numbers
        (tmp_path / "d.csv").write_text("a,b,label\n1,2,0\n3,4,1\n5,inf,0\n7,-Infinity,1\n")
        cfg = files_cfg(tmp_path / "d.csv")
    elif setup == "nan_features":
        x[3, 1] = np.nan
        np.save(tmp_path / "x.npy", x)
    elif setup == "one_class":
        np.save(tmp_path / "y.npy", np.zeros(50))
    elif setup == "unknown_suffix":
        (tmp_path / "d.txt").write_text("1,0\n")
        cfg = files_cfg(tmp_path / "d.txt")
    elif setup == "missing_file":
        cfg = files_cfg(tmp_path / "nope.npz")
    elif setup == "csv_cp1252":
        (tmp_path / "d.csv").write_text("a,label\n1,0\n2 \u20ac,1\n", encoding="cp1252")
        cfg = files_cfg(tmp_path / "d.csv")
    # a missing file is caught by the config check, as on the login node
    expected = ConfigError if setup == "missing_file" else DataError
    with pytest.raises(expected, match=match) as info:
        build_data(cfg)
    assert "\n" not in str(info.value)


def write_bad_file(folder: Path, case: str) -> str:
    """A small data file with one content mistake; returns its name."""
    labels = [str(i % 2) for i in range(40)]
    body = [f"{i},{i * 2},{y}" for i, y in enumerate(labels)]
    csv_lines = {
        "ragged_rows": ["a,b,label", "1,2,0", "3,4", *body],
        "non_numeric_cell": ["a,b,label", "1,2,0", "3,x,1", *body],
        "id_column": ["id,a,b,label", *(f"S{i},{i},{i % 3},{i % 2}" for i in range(40))],
        "no_header": body,
        "empty_label": ["a,b,label", "1,2,", *body],
        "only_labels": ["label", *labels],
        "fractional_labels": ["a,b,label", *(f"{i},{i * 2},{i % 2 + 0.5}" for i in range(40))],
        "missing_label_column": ["a,b,label", *body],
        "flat_rows_for_cnn": ["a,b,label", *body],
        "stray_label_csv": ["a,b,label", *body[:17], "17,34,5", *body[18:]],
        "na_target": ["a,b,label", *body[:5], "5,10,NA", *body[6:]],
        "semicolons": ["a;b;label", *(row.replace(",", ";") for row in body)],
        "trailing_commas": ["a,b,label,", *(f"{row}," for row in body)],
        "pandas_index": [",a,b,label", *(f"{i},{row}" for i, row in enumerate(body))],
    }
    if case == "empty_csv":
        (folder / "d.csv").write_text("")
        return "d.csv"
    if case in csv_lines:
        (folder / "d.csv").write_text("\n".join(csv_lines[case]) + "\n")
        return "d.csv"
    x = np.random.default_rng(0).normal(size=(40, 3))
    y = {
        "labels_2d": np.arange(80).reshape(40, 2) % 2,
        "targets_2d": np.random.default_rng(1).normal(size=(40, 2)),
        "labels_short": np.arange(39) % 2,
        "stray_label": np.where(np.arange(40) == 17, 5, np.arange(40) % 2),
        "nan_target": np.where(np.arange(40) == 3, np.nan, np.arange(40) * 0.5),
        "bytes_targets": np.array([b"NA" if i == 4 else str(i * 0.5).encode() for i in range(40)]),
    }[case]
    np.savez(folder / "d.npz", x=x, y=y)
    return "d.npz"


@pytest.mark.parametrize(
    ("case", "extra", "message"),
    [
        ("ragged_rows", [], "data.path: 'd.csv' line 3 has 2 columns, expected 3"),
        ("non_numeric_cell", [], "'d.csv' line 3, column 'b': 'x' is not a number"),
        # A column of text (an ID) is named with the key that leaves it unread.
        (
            "id_column",
            [],
            "'d.csv' line 2, column 'id': 'S0' is not a number; leave text columns in the file "
            "unread with data.feature_columns=[a,b]",
        ),
        ("no_header", [], "data.path='d.csv': the CSV has no header row"),
        ("empty_label", [], "'d.csv' line 2 has an empty 'label' cell"),
        ("only_labels", [], "data.path='d.csv': the rows hold no feature values"),
        ("fractional_labels", [], "(e.g. 0.5); use task=regression"),
        ("missing_label_column", ["data.label_column=price"], "data.label_column='price'"),
        # A near miss is named; a file of other separators has a header of one cell.
        (
            "missing_label_column",
            ["data.label_column=lable"],
            "did you mean data.label_column=label?",
        ),
        ("semicolons", [], "the header is one cell: the file seems separated by ';'"),
        ("empty_csv", [], "data.path: 'd.csv' is empty (no rows); point data.path at a file"),
        # An unnamed column was read as a feature ('' in predict's names) or, empty, refused
        # as "column '': '' is not a number".
        ("trailing_commas", [], "data.path='d.csv': column 4 of 4 has no name in the header"),
        ("pandas_index", [], "column 1 of 4 has no name in the header (a comma at the end"),
        ("flat_rows_for_cnn", ["model=cnn"], "model=cnn needs image input"),
        ("labels_2d", [], "data.path='d.npz': the labels have shape (40, 2)"),
        ("targets_2d", ["task=regression"], "data.path='d.npz': the labels have shape (40, 2)"),
        ("labels_short", ["cluster=local"], "data.path='d.npz': 40 feature rows but 39 labels"),
        # A stray label would otherwise become a class of its own, and the split be blamed.
        ("stray_label", [], "data.path='d.npz': label 5 (row 17) occurs in one sample only"),
        # In a CSV, by the line the file shows (the header is line 1): it said "(row 17)".
        ("stray_label_csv", [], "d.csv': label 5 (line 19) occurs in one sample only"),
        # A regression target that is not a number: by its line and cell (it showed NumPy's
        # "could not convert string to float: np.str_('NA')"), and a NaN by its row.
        (
            "na_target",
            ["task=regression"],
            "data.path='d.csv': task=regression needs numeric labels, but line 7 holds 'NA' "
            "(1 of 40 labels are not numbers)",
        ),
        ("nan_target", ["task=regression"], "'d.npz': row 3 holds the target nan (1 NaN or inf"),
        (
            "bytes_targets",
            ["task=regression"],
            "'d.npz': task=regression needs numeric labels, but row 4 holds 'NA' (1 of 40 labels "
            "are not numbers); fill in or drop those rows, or save the targets as numbers",
        ),
    ],
)
def test_bad_data_files_are_refused_before_the_run_dir_exists(
    case, extra, message, tmp_path, monkeypatch, capsys
):
    """`hpcdl train data=files ...` reads the file once before creating the run dir
    (cluster=debug and local): one line naming the file or key, exit status 2, nothing made."""
    from hpcdl.cli.main import main

    monkeypatch.chdir(tmp_path)
    name = write_bad_file(tmp_path, case)
    code = main(["train", "run_dir=run", "data=files", f"data.path={name}", *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    # data.path is made absolute at compose: the message names the file wherever it runs.
    message = message.replace(f"'{name}'", f"'{tmp_path / name}'")
    assert message in lines[0], lines[0]
    assert not (tmp_path / "run").exists() and not (tmp_path / "outputs").exists()


def test_missing_path_is_config_error():
    with pytest.raises(ConfigError, match=r"data\.path is not set"):
        build_data(schema.MnistConfig())


# ----------------------------------------------------------------------------- sklearn, synthetic
def test_breast_cancer_and_digits():
    data = build_data(schema.BreastCancerConfig())
    assert data.input_shape == (30,) and data.class_names == ["malignant", "benign"]
    assert sum(len(t) for t in (data.y_train, data.y_val, data.y_test)) == 569
    assert build_data(schema.DigitsConfig()).input_shape == (1, 8, 8)
    flat = build_data(schema.DigitsConfig(as_images=False, standardize=False))
    assert flat.input_shape == (64,) and flat.x_train.min() >= 0 and flat.x_train.max() <= 1


def test_synthetic_is_deterministic_and_learnable():
    from sklearn.linear_model import LogisticRegression

    cfg = schema.SyntheticConfig(num_samples=600, num_classes=3, shape=[8])
    a, b = build_data(cfg), build_data(cfg)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_val, b.y_val)
    other = build_data(replace(cfg, seed=1))
    assert not torch.equal(a.x_train, other.x_train)
    clf = LogisticRegression(max_iter=500).fit(a.x_train.numpy(), a.y_train.numpy())
    assert clf.score(a.x_val.numpy(), a.y_val.numpy()) > 0.9
    assert build_data(replace(cfg, shape=[3, 4, 4])).input_shape == (3, 4, 4)


# ----------------------------------------------------------------------------- splits
def test_splits_disjoint_covering_stratified(tmp_path):
    y = indexed_npz(tmp_path / "d.npz", num_samples=400)
    data = build_data(files_cfg(tmp_path / "d.npz", standardize=False, val_fraction=0.2))
    train, val, test = split_ids(data)
    assert (len(train), len(val), len(test)) == (260, 80, 60)
    assert sorted(np.concatenate([train, val, test]).tolist()) == list(range(400))
    for ids in (train, val, test):  # 4 balanced classes stay balanced
        counts = np.unique(y[ids], return_counts=True)[1]
        assert counts.max() - counts.min() <= 1


def test_splits_depend_on_seed_only(tmp_path):
    indexed_npz(tmp_path / "d.npz")
    cfg = files_cfg(tmp_path / "d.npz", standardize=False)
    first, again = split_ids(build_data(cfg)), split_ids(build_data(cfg))
    other = split_ids(build_data(replace(cfg, split_seed=1)))
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not np.array_equal(first[0], other[0])


def test_standardization_uses_train_split_only(tmp_path):
    indexed_npz(tmp_path / "d.npz")
    cfg = files_cfg(tmp_path / "d.npz")
    data, raw = build_data(cfg), build_data(replace(cfg, standardize=False))
    torch.testing.assert_close(data.x_train.mean(0), torch.zeros(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(data.x_train.std(0, unbiased=False), torch.ones(4))
    assert (data.x_val.mean(0).abs() > 1e-3).any()
    raw_train = raw.x_train.double()
    torch.testing.assert_close(
        data.preprocessing.mean.double(), raw_train.mean(0), check_dtype=False
    )
    expected_val = (raw.x_val - raw_train.mean(0).float()) / raw_train.std(
        0, unbiased=False
    ).float()
    torch.testing.assert_close(data.x_val, expected_val)


def test_image_standardization_per_channel():
    data = build_data(schema.SyntheticConfig(num_samples=300, shape=[3, 4, 5]))
    assert data.preprocessing.mean.shape == (3, 1, 1)
    per_channel = data.x_train.transpose(0, 1).reshape(3, -1)
    torch.testing.assert_close(per_channel.mean(1), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(per_channel.std(1, unbiased=False), torch.ones(3))


def test_constant_feature_keeps_std_one(tmp_path):
    x = np.column_stack([np.full(40, 3.0), np.arange(40.0)])
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(40) % 2)
    data = build_data(files_cfg(tmp_path / "d.npz"))
    assert data.preprocessing.std[0] == 1 and torch.all(data.x_train[:, 0] == 0)


def test_preprocessing_round_trip_and_apply(tmp_path):
    data = build_data(schema.DigitsConfig())
    torch.save({"p": data.preprocessing.state_dict()}, tmp_path / "p.pt")
    state = torch.load(tmp_path / "p.pt", weights_only=True)["p"]
    restored = Preprocessing.from_state_dict(state)
    raw = build_data(schema.DigitsConfig(standardize=False))
    raw_test = (raw.x_test * 16).round().numpy()  # back to sklearn's 0..16 counts
    torch.testing.assert_close(restored.apply(raw_test), data.x_test)
    torch.testing.assert_close(restored.apply(raw_test.reshape(-1, 64)), data.x_test)
    with pytest.raises(DataError, match="do not fit the model's input_shape"):
        restored.apply(np.zeros((2, 63)))


# ----------------------------------------------------------------------------- k-fold
def test_kfold_folds_partition_train_and_val(tmp_path):
    indexed_npz(tmp_path / "d.npz")
    cfg = files_cfg(tmp_path / "d.npz", standardize=False, num_folds=4)
    folds = [split_ids(build_data(replace(cfg, fold=k))) for k in range(4)]
    tests = {tuple(test) for _, _, test in folds}
    assert len(tests) == 1  # the test split does not move with the fold
    train_val = set(folds[0][0]) | set(folds[0][1])
    vals = [set(val) for _, val, _ in folds]
    assert set().union(*vals) == train_val and sum(len(v) for v in vals) == len(train_val)
    for train, val, _ in folds:
        assert set(train) | set(val) == train_val and not set(train) & set(val)


@pytest.mark.parametrize(
    ("num_folds", "fold", "match"),
    [
        (1, 0, "data.num_folds=1"),
        (3, 3, r"data.fold=3: must be in \[0, data.num_folds=3\)"),
        (3, -1, "data.fold=-1"),
    ],
)
def test_kfold_config_errors(num_folds, fold, match):
    with pytest.raises(ConfigError, match=match):
        build_data(schema.BreastCancerConfig(num_folds=num_folds, fold=fold))


# ----------------------------------------------------------------------------- load_feature_rows
def test_load_feature_rows(tmp_path):
    rows = np.arange(12.0).reshape(4, 3)
    (tmp_path / "h.csv").write_text(
        "a,label,b,c\n" + "".join(f"{r[0]},x,{r[1]},{r[2]}\n" for r in rows)
    )
    (tmp_path / "n.csv").write_text("".join(",".join(map(str, r)) + "\n" for r in rows))
    np.save(tmp_path / "r.npy", rows)
    np.savez(tmp_path / "r.npz", x=rows)
    for name in ("h.csv", "n.csv", "r.npy", "r.npz"):
        got = load_feature_rows(str(tmp_path / name), (3,))
        assert got.dtype == np.float32 and np.array_equal(got, rows), name
    assert load_feature_rows(str(tmp_path / "r.npy"), (1, 3)).shape == (4, 1, 3)
    with pytest.raises(DataError, match=r"n.csv': rows have 3 values, the model expects 30"):
        load_feature_rows(str(tmp_path / "n.csv"), (30,))


def test_a_csv_byte_order_mark_is_not_part_of_the_first_name(tmp_path):
    """Excel's "CSV UTF-8" starts with a byte-order mark. It was read into the first
    column's name: a label column first was 'no such column' ('\\ufeffprice'), and a
    feature column first was recorded as '\\ufeffid', so predict refused every input CSV."""
    lines = ["price,id,b"] + [f"{i * 0.5},{i},{i % 3}" for i in range(30)]
    (tmp_path / "p.csv").write_text("\r\n".join(lines) + "\r\n", encoding="utf-8-sig")
    data = build_data(files_cfg(tmp_path / "p.csv", label_column="price"), regression=True)
    assert data.feature_columns == ["id", "b"] and data.label_column == "price"
    (tmp_path / "i.csv").write_text("id,b\n1,2\n", encoding="utf-8-sig")
    got = load_feature_rows(str(tmp_path / "i.csv"), (2,), ["id", "b"], "price")
    assert np.array_equal(got, [[1.0, 2.0]])


def test_load_feature_rows_picks_a_headers_columns_by_name(tmp_path):
    """A run trained on a CSV with a header: an input CSV with a header gives the training
    columns by name, in any order, its other columns (the label column too) dropped; a
    headerless one gives them by position. A run that recorded no names: by position."""
    rows = np.arange(12.0).reshape(4, 3)  # columns a, b, c
    names = ["a", "b", "c"]
    (tmp_path / "shuffled.csv").write_text(
        "c,price,a,note,b\n" + "".join(f"{r[2]},1.5,{r[0]},x,{r[1]}\n" for r in rows)
    )
    with pytest.warns(DataWarning, match="column 'note' not used"):
        got = load_feature_rows(str(tmp_path / "shuffled.csv"), (3,), names, "price")
    assert np.array_equal(got, rows)
    (tmp_path / "ordered.csv").write_text("a,b,c\n" + "".join(f"{a},{b},{c}\n" for a, b, c in rows))
    (tmp_path / "cab.csv").write_text("c,a,b\n" + "".join(f"{c},{a},{b}\n" for a, b, c in rows))
    old = load_feature_rows(str(tmp_path / "cab.csv"), (3,))  # no names: as the file is
    assert np.array_equal(old, rows[:, [2, 0, 1]])
    assert np.array_equal(load_feature_rows(str(tmp_path / "cab.csv"), (3,), names), rows)
    (tmp_path / "plain.csv").write_text("".join(f"{a},{b},{c}\n" for a, b, c in rows))
    assert np.array_equal(load_feature_rows(str(tmp_path / "plain.csv"), (3,), names), rows)

    (tmp_path / "missing.csv").write_text("c,a\n1,2\n")
    with pytest.raises(DataError, match=r"missing.csv': no column 'b' in its header \(c, a\)"):
        load_feature_rows(str(tmp_path / "missing.csv"), (3,), names, "price")
    (tmp_path / "twice.csv").write_text("a,b,c,a\n1,2,3,4\n")
    with pytest.raises(DataError, match=r"twice.csv': column 'a' appears 2 times"):
        load_feature_rows(str(tmp_path / "twice.csv"), (3,), names, "price")
    (tmp_path / "wide.csv").write_text("".join(f"{a},{b},{c},7\n" for a, b, c in rows))
    expected = (
        r"wide.csv': rows have 4 values, the model expects 3 features \(input_shape \(3,\)\), "
        r"the training CSV's columns a, b, c \(not its label column 'price'\)"
    )
    with pytest.raises(DataError, match=expected):
        load_feature_rows(str(tmp_path / "wide.csv"), (3,), names, "price")
    np.save(tmp_path / "r.npy", rows)
    assert np.array_equal(load_feature_rows(str(tmp_path / "r.npy"), (3,), names, "price"), rows)


def test_load_feature_rows_decides_a_first_row_by_the_training_names(tmp_path):
    """A run that recorded the training CSV's names: a first row holding them is a header,
    even when the names look like numbers; a row of numbers is data; a first row with text
    that names no training column is refused in one line, naming the file, the row and the
    names expected. A run without names keeps training's rule: text makes a header."""
    rows = np.arange(12.0).reshape(4, 3)
    body = "".join(f"{a},{b},{c}\n" for a, b, c in rows)

    def load(text: str, names=("a", "b", "c"), label="price") -> np.ndarray:
        (tmp_path / "in.csv").write_text(text)
        return load_feature_rows(str(tmp_path / "in.csv"), (3,), names, label)

    assert np.array_equal(load(body), rows)
    assert np.array_equal(load("3,1,2\n" + body, names=("1", "2", "3")), rows[:, [1, 2, 0]])
    expected = (
        r"in.csv': line 1 \(setosa, 1.0, 2.0\) is neither a header naming the training "
        r"columns \(a, b, c\) nor numbers \('setosa' in column 1 is not a number\); start "
        r"the file with a header row naming those columns, or give numbers only$"
    )
    with pytest.raises(DataError, match=expected):
        load("setosa,1.0,2.0\n" + body)
    with pytest.raises(DataError, match=r"line 1 names the training columns in other letter case"):
        load("A,B,C\n" + body)
    long = [f"feature_{i}" for i in range(40)]
    shortened = (
        r"line 1 \(x{17}\.\.\., 1, 2\) .* columns \(feature_0, .*, feature_9, \.\.\. "
        r"\(40 in all\)\)"
    )
    with pytest.raises(DataError, match=shortened):
        load("x" * 30 + ",1,2\n", names=long)
    # Text that names a training column: a header, whose missing columns are named.
    with pytest.raises(DataError, match="no columns 'b', 'c' in its header"):
        load("a,price,x\n1,2,3\n")
    # No names recorded: a first row with text is a header, as training decides.
    (tmp_path / "old.csv").write_text("x,y,z\n" + body)
    assert np.array_equal(load_feature_rows(str(tmp_path / "old.csv"), (3,)), rows)


def test_load_feature_rows_refuses_a_header_without_rows(tmp_path):
    """A header alone has no rows to predict (it was refused as rows of 1 value), with the
    training CSV's names or without them."""
    (tmp_path / "head.csv").write_text("c,a,b\n")
    for names in (["a", "b", "c"], None):
        with pytest.raises(DataError, match=r"head.csv': a header but no rows; add the rows"):
            load_feature_rows(str(tmp_path / "head.csv"), (3,), names, "price")


def test_load_feature_rows_warns_of_unused_columns(tmp_path, recwarn):
    """Columns that are neither a feature nor the label column: one warning naming them,
    and the rows still predict. The label column alone draws no warning."""
    rows = np.arange(6.0).reshape(2, 3)
    (tmp_path / "extra.csv").write_text(
        "id,c,b,a,price,note\n" + "".join(f"7,{c},{b},{a},1,x\n" for a, b, c in rows)
    )
    with pytest.warns(DataWarning) as caught:
        got = load_feature_rows(str(tmp_path / "extra.csv"), (3,), ["a", "b", "c"], "price")
    assert np.array_equal(got, rows)
    assert [str(w.message) for w in caught] == [
        f"--input '{tmp_path / 'extra.csv'}': columns 'id', 'note' not used, the model takes "
        "a, b, c; predicting without them (an ID column goes into the output with "
        "--id-column id)"
    ]
    (tmp_path / "labelled.csv").write_text("price,a,b,c\n1,0,1,2\n")
    recwarn.clear()
    load_feature_rows(str(tmp_path / "labelled.csv"), (3,), ["a", "b", "c"], "price")
    assert not [w for w in recwarn if issubclass(w.category, DataWarning)]


# ----------------------------------------------------------------------------- sharding
@pytest.mark.parametrize(
    ("num_samples", "batch_size"), [(569, 32), (100, 10), (7, 5), (64, 64), (50, 7)]
)
def test_sharder_covers_each_sample_once(num_samples, batch_size):
    num_steps = -(-num_samples // batch_size)
    for world_size in range(1, min(batch_size, 5) + 1):
        sharders = [
            EpochSharder(num_samples, batch_size, rank, world_size, seed=3)
            for rank in range(world_size)
        ]
        assert {s.num_steps_per_epoch for s in sharders} == {num_steps}
        for epoch in (0, 1):
            seen = [s.local_indices(epoch, step) for s in sharders for step in range(num_steps)]
            assert sorted(torch.cat(seen).tolist()) == list(range(num_samples))


def test_sharder_order_independent_of_world_size():
    one = EpochSharder(569, 32, 0, 1, seed=7)
    three = [EpochSharder(569, 32, r, 3, seed=7) for r in range(3)]
    last = one.num_steps_per_epoch - 1
    assert [len(s.local_indices(0, last)) for s in three] == [9, 8, 8]  # 569 = 17 * 32 + 25
    for step in (0, 5, last):
        batch = one.global_batch(2, step)
        assert all(torch.equal(s.global_batch(2, step), batch) for s in three)
        merged = torch.cat([s.local_indices(2, step) for s in three])
        assert sorted(merged.tolist()) == sorted(batch.tolist())
    assert not torch.equal(one.permutation(0), one.permutation(1))
    assert not torch.equal(one.permutation(0), EpochSharder(569, 32, 0, 1, seed=8).permutation(0))


def test_sharder_rejects_batch_smaller_than_world():
    with pytest.raises(ConfigError, match=r"trainer\.batch_size=2"):
        EpochSharder(100, 2, 0, 4, seed=0)


def collect(x, y, sharder, epoch, start_step, **kwargs):
    return list(iterate_batches(x, y, sharder, epoch, start_step, torch.device("cpu"), **kwargs))


def test_iterate_batches_resume_and_counts():
    x, y = torch.arange(50.0)[:, None], torch.arange(50)
    sharder = EpochSharder(50, 8, 1, 3, seed=0)
    full = collect(x, y, sharder, 4, 0)
    assert [b[0] for b in full] == list(range(7))
    assert [b[3] for b in full] == [8] * 6 + [2]
    assert [len(b[2]) for b in full] == [3] * 6 + [1]  # rank 1 of 3 in a batch of 2: 1 sample
    resumed = collect(x, y, sharder, 4, 3)
    assert [b[0] for b in resumed] == [3, 4, 5, 6]
    for a, b in zip(full[3:], resumed, strict=True):
        assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
    for step, xb, yb, _ in full:
        assert torch.equal(yb, sharder.local_indices(4, step)) and torch.equal(xb[:, 0].long(), yb)
    assert collect(x, y, sharder, 4, 7) == []


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterate_batches_loader_matches_in_memory(num_workers):
    x, y = torch.randn(45, 2, 3), torch.arange(45) % 3
    sharder = EpochSharder(45, 8, 0, 2, seed=5)
    for epoch, start_step in ((0, 0), (1, 2), (2, 0)):
        fast = collect(x, y, sharder, epoch, start_step)
        loaded = collect(x, y, sharder, epoch, start_step, in_memory=False, num_workers=num_workers)
        assert len(fast) == len(loaded) == sharder.num_steps_per_epoch - start_step
        for a, b in zip(fast, loaded, strict=True):
            assert a[0] == b[0] and a[3] == b[3]
            assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
    # an epoch abandoned halfway (max_steps, a signal) must not leak into the next one
    partial = iterate_batches(
        x, y, sharder, 3, 0, torch.device("cpu"), in_memory=False, num_workers=num_workers
    )
    next(partial)
    del partial
    fast = collect(x, y, sharder, 4, 1)
    loaded = collect(x, y, sharder, 4, 1, in_memory=False, num_workers=num_workers)
    assert len(fast) == len(loaded)
    assert all(torch.equal(a[2], b[2]) for a, b in zip(fast, loaded, strict=True))


class _Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 30

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.tensor([float(i)]) + torch.rand(1), "y": i % 3}


@pytest.mark.parametrize("num_workers", [0, 1])
def test_dataset_batches_leave_the_global_rng_alone_and_are_seeded_per_sample(num_workers):
    """Starting a DataLoader iteration must not draw from the global torch RNG: a run resumed
    mid-epoch starts one where the uninterrupted run did not, and its dropout would differ."""
    from hpcdl.data.loader import LoaderSettings, dataset_batches

    settings = LoaderSettings(num_workers=num_workers, prefetch_factor=2, collate_fn=None, seed=7)
    sharder = EpochSharder(30, 8, 0, 1, seed=7)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    full = list(dataset_batches(_Squares(), sharder, 2, 0, torch.device("cpu"), settings))
    assert torch.equal(torch.get_rng_state(), before)
    resumed = list(dataset_batches(_Squares(), sharder, 2, 2, torch.device("cpu"), settings))
    assert torch.equal(torch.get_rng_state(), before)
    assert [s for s, _, _ in resumed] == [2, 3]
    for (_, a, _), (_, b, _) in zip(full[2:], resumed, strict=True):
        assert torch.equal(a["x"], b["x"]) and torch.equal(a["y"], b["y"])  # same augmentation


def test_a_batch_read_in_the_training_process_keeps_the_rng_states_once(monkeypatch) -> None:
    """num_workers=0: the training process's RNG states were saved and put back around each
    sample (~125 us: 20-80x a cheap sample's read); now once per batch, same samples."""
    from hpcdl.data import loader
    from hpcdl.data.loader import LoaderSettings, dataset_batches

    kept = loader.kept_rng_states
    calls: list[int] = []

    def counted():
        calls.append(1)
        return kept()

    monkeypatch.setattr(loader, "kept_rng_states", counted)
    settings = LoaderSettings(num_workers=0, prefetch_factor=2, collate_fn=None, seed=7)
    sharder = EpochSharder(30, 8, 0, 1, seed=7)
    batches = list(dataset_batches(_Squares(), sharder, 2, 0, torch.device("cpu"), settings))
    assert len(batches) == 4 and len(calls) == 4
    # The samples of one __getitem__ each, as before.
    one_by_one = loader.SeededSamples(_Squares(), 7)
    order = sharder.permutation(2).tolist()
    expected = torch.cat([one_by_one[(2, i)]["x"] for i in order[:8]])
    assert torch.equal(batches[0][1]["x"].reshape(-1), expected)


def test_where_batches_of_another_size_start_in_an_epoch() -> None:
    # 160 samples into the epoch (5 steps of 32): batches of 16 start there at step 10,
    # batches of 48 do not (40 and 80 would); at the end, the epoch's step count.
    sharder = EpochSharder(398, 16, rank=0, world_size=2, seed=0)
    assert sharder.step_starting_at(160) == 10
    assert sharder.step_starting_at(398) == sharder.num_steps_per_epoch == 25
    wide = EpochSharder(398, 48, rank=0, world_size=2, seed=0)
    assert wide.step_starting_at(160) is None
    assert wide.batch_sizes_starting_at(160) == [40, 80]
    assert EpochSharder(398, 48, rank=0, world_size=8, seed=0).batch_sizes_starting_at(7) == []


def test_a_refused_batch_size_names_the_saved_one_once() -> None:
    # Before: "resume with trainer.batch_size=32 or 32" (the saved size is also a neighbour).
    from hpcdl.config.schema import EarlyStoppingConfig
    from hpcdl.errors import CheckpointError
    from hpcdl.state import Progress
    from hpcdl.trainer import resumed_progress

    progress = Progress(epoch=0, step_in_epoch=2, global_step=2)  # 64 samples into the epoch
    state = {"progress": progress.to_dict(), "batch_size": 32}
    sharder = EpochSharder(398, 48, rank=0, world_size=1, seed=0)
    assert sharder.batch_sizes_starting_at(64) == [32, 64]
    with pytest.raises(CheckpointError) as info:
        resumed_progress(Path("c.pt"), state, sharder, EarlyStoppingConfig())
    assert "resume with trainer.batch_size=32 or 64, and change it" in str(info.value)


def test_a_numeric_target_given_as_class_labels_is_pointed_to_regression() -> None:
    # Before: "fix or drop that row (is it outside your classes?)" for house prices, and
    # "got non-integer numbers (e.g. 194524)" for 194524.13.
    from hpcdl.data.files import encode_labels

    prices = (np.random.default_rng(0).integers(100, 600, 400) * 1000).astype(str)
    with pytest.raises(DataError) as info:
        encode_labels(prices, "data.path", 2)
    assert str(info.value).endswith(
        "distinct numbers, 179 of them once: for a numeric target use task=regression"
    ), info.value
    with pytest.raises(DataError, match=r"non-integer numbers \(e\.g\. 194524\.13\)"):
        encode_labels(np.array(["194524.13", "3"]), "data.path", 2)
    stray = np.array(["0"] * 10 + ["1"] * 10 + ["7"])  # a typo among real classes
    with pytest.raises(DataError, match=r"fix or drop that row \(is it outside your classes\?\)$"):
        encode_labels(stray, "data.path", 2)


def test_predict_input_with_semicolons_or_another_case_says_so(tmp_path: Path) -> None:
    # Before: "line 1 (...) is neither a header naming the training columns ... nor numbers"
    # for both, where training names the separator and a name's case.
    from hpcdl.data.files import _is_named_header

    file = tmp_path / "new.csv"
    names = ["rooms", "area", "year"]
    with pytest.raises(DataError, match=r"line 1 is one cell: the file seems separated by ';'"):
        _is_named_header(file, ["rooms;area;year"], names, "price")
    with pytest.raises(DataError, match=r"training columns in other letter case \(ROOMS, AREA"):
        _is_named_header(file, ["ROOMS", "AREA", "YEAR"], names, "price")
    assert _is_named_header(file, ["year", "rooms", "area"], names, "price")
    with pytest.raises(DataError, match="is neither a header naming the training columns"):
        _is_named_header(file, ["width", "depth", "age"], names, "price")


@pytest.mark.parametrize(
    ("name", "own"), [("d.npz", "its y array"), ("d.csv", "its data.label_column")]
)
def test_a_labels_file_beside_a_file_with_its_own_labels_is_refused(tmp_path, name, own) -> None:
    # Before: ignored without a word, so the run trained on labels other than the user's.
    from hpcdl.config.validate import check_data

    (tmp_path / name).write_text("")
    np.save(tmp_path / "y.npy", np.zeros(4))
    cfg = files_cfg(tmp_path / name, labels_path=str(tmp_path / "y.npy"))
    with pytest.raises(ConfigError) as info:
        check_data(cfg)
    assert str(info.value) == (
        f"data.labels_path='{tmp_path / 'y.npy'}': only a .npy of features takes a labels "
        f"file; data.path='{tmp_path / name}' brings its own labels ({own}): remove "
        "data.labels_path"
    )


@pytest.mark.parametrize(
    ("name", "labels"), [("d.npz", "its y array"), ("d.npy", "data.labels_path")]
)
def test_a_label_column_for_an_array_file_is_refused(tmp_path, name, labels) -> None:
    # Before: ignored without a word (an array file has no columns).
    from hpcdl.config.validate import check_data

    if name.endswith(".npz"):  # array files (an empty file is refused as none: below)
        np.savez(tmp_path / name, x=np.zeros((4, 2)), y=np.zeros(4))
    else:
        np.save(tmp_path / name, np.zeros((4, 2)))
    np.save(tmp_path / "y.npy", np.zeros(4))
    extra = {"labels_path": str(tmp_path / "y.npy")} if name.endswith(".npy") else {}
    cfg = files_cfg(tmp_path / name, label_column="price", **extra)
    with pytest.raises(ConfigError) as info:
        check_data(cfg)
    assert str(info.value) == (
        f"data.label_column='price': names a .csv's label column; data.path="
        f"'{tmp_path / name}' is an array file (labels from {labels}): remove it"
    )
    check_data(files_cfg(tmp_path / name, **extra))  # the default "label": nothing said


def test_images_stored_channels_last_are_pointed_out(tmp_path) -> None:
    # Before: (16, 16, 3) samples trained as 16 channels of 16x3 pixels, without a word.
    import warnings

    from hpcdl.data.files import read_files

    y = np.arange(20) % 2
    np.save(tmp_path / "y.npy", y)
    for shape, warned in [((20, 16, 16, 3), True), ((20, 28, 28, 1), True),
                          ((20, 3, 16, 16), False), ((20, 1, 8, 8), False), ((20, 64), False)]:  # fmt: skip
        np.save(tmp_path / "x.npy", np.zeros(shape, dtype=np.float32))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            read_files(str(tmp_path / "x.npy"), str(tmp_path / "y.npy"), "label")
        said = [str(w.message) for w in seen if issubclass(w.category, DataWarning)]
        assert bool(said) == warned, (shape, said)
        if warned:
            h, w, c = shape[1:]
            assert said[0].endswith(
                f"samples of shape {(h, w, c)} are read as [C, H, W], {h} channels of {w}x{c} "
                f"pixels; if they are {h}x{w} images with {c} channel(s) last, save them as "
                "[N, C, H, W]: np.moveaxis(x, -1, 1)"
            )


class _OneOddSample(torch.utils.data.Dataset):
    """Samples of 6x8x8 but one of 6x8x7, well into the epoch (the check before a run reads
    only the first batch)."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int):
        return torch.zeros(6, 8, 7 if i == 13 else 8), 0


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_sample_of_another_shape_mid_epoch_is_named_as_such(num_workers: int) -> None:
    # With a worker, torch stacks into shared memory sized for the batch's first sample,
    # and the odd one failed as "Trying to resize storage that is not resizable".
    from hpcdl.data.feed import _named_collate_errors
    from hpcdl.errors import DataError

    loader = torch.utils.data.DataLoader(_OneOddSample(), batch_size=4, num_workers=num_workers)
    with pytest.raises(DataError) as info:
        list(_named_collate_errors(iter(loader), "data.target='rs.data:build'"))
    message = str(info.value)
    assert message.startswith("data.target='rs.data:build': samples of different shapes in one")
    assert message.endswith("or set data.collate_fn to pad them") and "\n" not in message


def test_classes_are_read_through_subsets_and_concatenated_parts_that_agree() -> None:
    """A ConcatDataset has no `classes` of its own: its parts' were not found, so a
    classification run needed data.num_classes and its confusion matrix showed 0, 1, 2.
    Parts that number their classes differently (two folder datasets of other class
    folders) would give one label two meanings: refused, naming the parts."""
    from torch.utils.data import ConcatDataset, Subset

    from hpcdl.data.custom import num_classes_of

    class Named(torch.utils.data.Dataset):
        def __init__(self, classes: list[str]) -> None:
            self.classes = classes

        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            return torch.zeros(2), 0

    cfg = schema.CustomDataConfig(target="mine:build")
    same = ConcatDataset([Named(["cat", "dog"]), Subset(Named(["cat", "dog"]), [0, 1])])
    assert num_classes_of(Subset(same, [0, 5]), cfg) == (2, ["cat", "dog"])
    assert num_classes_of(same, replace(cfg, num_classes=2)) == (2, ["cat", "dog"])
    other = ConcatDataset([Named(["cat", "dog"]), Named(["dog", "cat"])])
    with pytest.raises(DataError, match=re.escape(
        "data.target='mine:build': the ConcatDataset's parts 0 and 1 name different classes "
        "(['cat', 'dog'] and ['dog', 'cat']): a label would mean one class in one part"
    )):  # fmt: skip
        num_classes_of(other, cfg)
