"""hpcdl predict on many rows: --input read a batch at a time, and the class table made by
a few tensor operations over all rows, not several per row."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from hpcdl.data import Preprocessing, load_feature_rows
from hpcdl.data.feed import EVAL_BATCH_SIZE
from hpcdl.errors import DataError
from hpcdl.inference import _class_rows, _row_batches


class CountTensorOps(TorchFunctionMode):
    """Counts the torch functions and tensor methods called while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def test_class_rows_are_each_rows_argmax_and_its_probability():
    logits = torch.tensor([[0.0, 0.0, 1.0], [2.0, 2.0, 0.0], [0.0, 3.0, 0.0], [5.0, 0.0, 5.0]])
    probs = torch.softmax(logits, dim=1)
    table = _class_rows(logits, ["a", "b"])  # a checkpoint naming fewer classes: by number
    assert table.columns == ["row", "predicted", "class_name", "probability"]
    assert [row[:3] for row in table.rows] == [[0, 2, "2"], [1, 0, "a"], [2, 1, "b"], [3, 0, "a"]]
    assert [row[3] for row in table.rows] == [float(p.max()) for p in probs]
    assert next(iter(table.csv_rows()))[3] == str(probs[0, 2].numpy())


def test_class_rows_take_no_tensor_work_per_row():
    """An argmax, an index and a float() per row took 2 s for 200k rows; the work on
    tensors is now the same few calls for any number of rows."""
    logits = torch.randn(5_000, 3, generator=torch.Generator().manual_seed(0))
    with CountTensorOps() as ops:
        table = _class_rows(logits, ["a", "b", "c"])
    assert len(table.rows) == 5_000
    assert ops.count < 50, f"{ops.count} tensor operations for 5000 rows"


def test_npy_input_is_read_and_prepared_a_batch_at_a_time(tmp_path):
    """A float32 .npy given to --input is memory-mapped and prepared batch by batch, with
    the training preprocessing: it was read whole, copied to float32 and prepared whole
    (three copies of the file in the process's own memory)."""
    import tracemalloc

    rows = np.random.default_rng(0).normal(3.0, 2.0, size=(20_000, 100)).astype(np.float32)
    np.save(tmp_path / "rows.npy", rows)
    prepare = Preprocessing.fit(rows[:1000], scale=1.0, standardize=True)
    state = {"data_info": {"input_shape": [100]}, "preprocessing": prepare.state_dict()}
    total = torch.zeros(100, dtype=torch.float64)
    tracemalloc.start()
    try:
        for x, y in _row_batches(state, str(tmp_path / "rows.npy")):
            assert y is None and len(x) <= EVAL_BATCH_SIZE
            total += x.sum(dim=0, dtype=torch.float64)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    expected = prepare.apply(rows).sum(dim=0, dtype=torch.float64)
    torch.testing.assert_close(total, expected)
    assert peak < rows.nbytes / 4, f"peak {peak / 2**20:.1f} MiB for {rows.nbytes / 2**20:.0f} MiB"


def test_a_cut_npy_input_is_named_as_cut(tmp_path):
    """Memory-mapped, a cut .npy made NumPy say only 'mmap length is greater than file size'."""
    np.save(tmp_path / "whole.npy", np.zeros((100, 30), dtype=np.float32))
    (tmp_path / "cut.npy").write_bytes((tmp_path / "whole.npy").read_bytes()[:5000])
    with pytest.raises(DataError, match=r"--input: cannot read '.*cut.npy' as .npy: it holds "):
        load_feature_rows(str(tmp_path / "cut.npy"), (30,))


def test_an_object_npy_input_says_what_to_save(tmp_path):
    """Memory-mapped, NumPy said 'Array can't be memory-mapped: Python objects in dtype.'"""
    np.save(tmp_path / "objects.npy", np.array([[1.0, "a"]], dtype=object), allow_pickle=True)
    with pytest.raises(DataError, match=r"objects.npy' as .npy: it holds Python objects .*"):
        load_feature_rows(str(tmp_path / "objects.npy"), (2,))


@pytest.mark.parametrize(
    ("text", "place"),
    [("a,b\n1,2\n3,nan\n", "line 3, column 'b'"), ("1,2\ninf,4\n", "line 2, column 1")],
)
def test_a_nan_in_an_input_csv_is_named_by_line_and_column(tmp_path, text, place):
    """As in a training CSV; it said 'row 1, feature 1' (row counted from 0, header aside)."""
    (tmp_path / "rows.csv").write_text(text)
    with pytest.raises(DataError, match=rf"rows.csv': {place} holds (nan|inf) \(1 NaN or inf"):
        load_feature_rows(str(tmp_path / "rows.csv"), (2,), ["a", "b"])
