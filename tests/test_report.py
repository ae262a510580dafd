"""What a run records: weights hash, metrics.csv, confusion matrix, plots, versions, JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from hpcdl.atomic import write_json_atomic
from hpcdl.evaluation import confusion_matrix
from hpcdl.plots import plot_confusion_matrix, plot_learning_curves
from hpcdl.provenance import collect_versions, weights_sha256
from hpcdl.rundir import MetricsLog

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2)
    )


def test_weights_sha256_is_stable_and_a_hex_digest() -> None:
    state = small_model().state_dict()
    digest = weights_sha256(state)
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert weights_sha256(small_model().state_dict()) == digest


def test_weights_sha256_changes_with_one_element() -> None:
    state = small_model().state_dict()
    before = weights_sha256(state)
    state["0.weight"][1, 2] += 1e-6
    assert weights_sha256(state) != before


def test_weights_sha256_ignores_insertion_order() -> None:
    state = small_model().state_dict()
    reversed_state = OrderedDict(reversed(list(state.items())))
    assert list(reversed_state) != list(state)
    assert weights_sha256(reversed_state) == weights_sha256(state)


def test_weights_sha256_strips_ddp_and_compile_prefixes() -> None:
    state = small_model().state_dict()
    ddp = {f"module.{key}": value for key, value in state.items()}
    compiled = {f"_orig_mod.{key}": value for key, value in state.items()}
    both = {f"_orig_mod.module.{key}": value for key, value in state.items()}
    expected = weights_sha256(state)
    assert weights_sha256(ddp) == weights_sha256(compiled) == weights_sha256(both) == expected


def test_weights_sha256_sees_dtype_and_handles_bf16() -> None:
    weights = {"w": torch.randn(4, 4)}
    bf16 = {"w": weights["w"].to(torch.bfloat16)}
    assert weights_sha256(bf16) == weights_sha256({"w": bf16["w"].clone()})
    assert weights_sha256(bf16) != weights_sha256(weights)
    # Non-contiguous tensors hash by their values.
    transposed = weights["w"].t()
    assert weights_sha256({"w": transposed}) == weights_sha256({"w": transposed.contiguous()})


ROW_KEYS = ("epoch", "step", "train_loss", "val_loss", "val_accuracy")


def row(epoch: int, val_loss: float | None = 0.5) -> dict:
    return {
        "epoch": epoch,
        "step": epoch * 10,
        "train_loss": 1.0 / epoch,
        "val_loss": val_loss,
        "val_accuracy": 0.75,
    }


def test_metrics_log_append_and_read(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "sub" / "metrics.csv")
    assert log.read() == []
    log.append(row(1, val_loss=None))
    log.append(row(2))
    rows = log.read()
    assert rows == [row(1, val_loss=None), row(2)]
    assert isinstance(rows[0]["epoch"], int) and isinstance(rows[1]["train_loss"], float)
    lines = (tmp_path / "sub" / "metrics.csv").read_text().splitlines()
    assert lines[0] == ",".join(ROW_KEYS)
    assert len(lines) == 3


def test_metrics_log_keeps_the_header_of_an_existing_file(tmp_path: Path) -> None:
    MetricsLog(tmp_path / "m.csv").append(row(1))
    log = MetricsLog(tmp_path / "m.csv")  # a resumed run opens the same file
    log.append({"epoch": 2, "step": 20, "train_loss": 0.5})
    assert log.read()[1] == {
        "epoch": 2,
        "step": 20,
        "train_loss": 0.5,
        "val_loss": None,
        "val_accuracy": None,
    }
    with pytest.raises(ValueError, match="lr"):
        log.append({**row(3), "lr": 0.1})


def test_metrics_log_truncate_after_epoch(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    log = MetricsLog(path)
    for epoch in (1, 2, 3, 4):
        log.append(row(epoch))
    # A row cut short by a kill while it was written.
    with open(path, "a") as f:
        f.write("5,50,0.2")
    log.truncate_after_epoch(2)
    assert log.read() == [row(1), row(2)]
    log.append(row(3))
    assert [r["epoch"] for r in log.read()] == [1, 2, 3]
    assert not list(tmp_path.glob(".*tmp*"))
    MetricsLog(tmp_path / "absent.csv").truncate_after_epoch(0)  # nothing to do


def test_confusion_matrix_counts_true_by_predicted() -> None:
    targets = torch.tensor([0, 0, 1, 2, 2, 2])
    preds = torch.tensor([0, 1, 1, 2, 0, 2])
    cm = confusion_matrix(preds, targets, 3)
    assert cm.dtype == torch.int64
    assert cm.tolist() == [[1, 1, 0], [0, 1, 0], [1, 0, 2]]
    assert confusion_matrix(
        torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long), 2
    ).tolist() == [
        [0, 0],
        [0, 0],
    ]
    with pytest.raises(ValueError, match="outside"):
        confusion_matrix(torch.tensor([3]), torch.tensor([0]), 3)


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 5_000


def test_plot_learning_curves_writes_a_png(tmp_path: Path) -> None:
    rows = [
        {
            "epoch": e,
            "train_loss": 1 / e,
            "val_loss": 1.2 / e,
            "train_accuracy": 1 - 1 / (e + 1),
            "val_accuracy": None,
        }
        for e in range(1, 6)
    ]
    out = tmp_path / "plots" / "learning_curves.png"
    plot_learning_curves(rows, out)
    assert_png(out)


def test_many_metrics_wrap_into_rows_of_panels(tmp_path: Path) -> None:
    # 23 metrics made one row 13800 pixels wide; at 120 dpi a panel is 600 x 480 pixels.
    import struct

    names = ["loss", *(f"m{k}" for k in range(22))]
    rows = [
        {"epoch": e, **{f"{split}_{n}": 1 / e for n in names for split in ("train", "val")}}
        for e in range(1, 4)
    ]
    out = tmp_path / "learning_curves.png"
    plot_learning_curves(rows, out)
    width, height = struct.unpack(">II", out.read_bytes()[16:24])  # the PNG's IHDR
    assert (width, height) == (4 * 600, 6 * 480)
    plot_learning_curves([{k: v for k, v in r.items() if "_m" not in k} for r in rows], out)
    assert struct.unpack(">II", out.read_bytes()[16:24]) == (2 * 600, 480)  # loss, accuracy


def test_plot_confusion_matrix_writes_a_png(tmp_path: Path) -> None:
    out = tmp_path / "confusion_matrix.png"
    plot_confusion_matrix(torch.tensor([[5, 1], [2, 7]]), ["benign", "malignant"], out)
    assert_png(out)
    with pytest.raises(ValueError, match="class names"):
        plot_confusion_matrix(torch.zeros(3, 3, dtype=torch.long), ["a", "b"], out)


def test_importing_report_does_not_import_matplotlib() -> None:
    code = "import sys, hpcdl.plots, hpcdl.provenance, hpcdl.finalize; print('matplotlib' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_collect_versions() -> None:
    versions = collect_versions()
    assert versions["torch"] == torch.__version__
    assert versions["python"].count(".") == 2
    assert {"numpy", "hpcdl", "cuda", "cudnn"} <= set(versions)
    assert all(isinstance(value, str) for value in versions.values())


def test_write_json_atomic(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_text("old")
    write_json_atomic(path, {"accuracy": 0.9, "checkpoint": tmp_path / "x.pt", "none": None})
    assert json.loads(path.read_text()) == {
        "accuracy": 0.9,
        "checkpoint": str(tmp_path / "x.pt"),
        "none": None,
    }
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]
