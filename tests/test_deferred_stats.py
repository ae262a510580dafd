"""Deferred training statistics (hpcdl.deferred_stats): classification's correct predictions
counted a chunk of steps at a time give exactly the per-step counts, in the metrics rows and
in every checkpoint, whatever the chunk."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import hpcdl.deferred_stats
from hpcdl.checkpoint import CheckpointStore, read_checkpoint
from hpcdl.deferred_stats import DeferredStats
from hpcdl.tasks import ClassificationTask

# The default MLP on breast cancer: 13 steps an epoch at batch 32; a checkpoint every 5
# steps falls mid-epoch (steps 5, 10, 15, ...).
RUN = ["trainer.max_epochs=3", "trainer.checkpoint_every_steps=5", "trainer.keep_last=100"]


def test_chunked_counts_equal_the_per_batch_counts() -> None:
    task = ClassificationTask()
    g = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(n, 5, generator=g), torch.randint(0, 5, (n,), generator=g))
        for n in (32, 32, 7)
    ]
    per_batch = sum(float(task.stats_of(x, y)["correct"]) for x, y in batches)
    # 32 x 5 fp32 logits and 32 int64 labels: 896 bytes a full batch. A take every step,
    # every other step, at the end.
    for max_bytes in (1, 1500, 10**9):
        deferred = DeferredStats(task.stats_of, max_bytes)
        counted = 0.0
        for x, y in batches:
            deferred.add(x, y)
            if deferred.full:
                counted += deferred.take()["correct"]
        counted += deferred.take().get("correct", 0.0)
        assert counted == per_batch
        assert deferred.take() == {}  # nothing left over


def test_kept_outputs_hold_no_graph_and_bf16_logits_count_as_in_the_step() -> None:
    task = ClassificationTask()
    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    logits = model(x).bfloat16()
    deferred = DeferredStats(task.stats_of)
    deferred.add(logits, y)
    assert not deferred._outputs[0].requires_grad  # the step's graph is not kept alive
    assert deferred.take() == {"correct": float(task.stats_of(logits, y)["correct"])}


def test_the_bound_is_read_when_the_trainer_starts(monkeypatch) -> None:
    monkeypatch.setattr(hpcdl.deferred_stats, "MAX_PENDING_BYTES", 100)
    deferred = DeferredStats(ClassificationTask().stats_of)
    deferred.add(torch.zeros(2, 5), torch.zeros(2, dtype=torch.long))  # 56 bytes
    assert not deferred.full
    deferred.add(torch.zeros(2, 5), torch.zeros(2, dtype=torch.long))
    assert deferred.full


def test_logits_sliced_from_a_wider_output_count_all_they_keep_alive() -> None:
    wide = torch.zeros(32, 4096)  # 512 KiB; the task sees its first 10 columns
    deferred = DeferredStats(ClassificationTask().stats_of, max_bytes=256 << 10)
    deferred.add(wide[:, :10], torch.zeros(32, dtype=torch.long))
    assert deferred.full


def train_in_process(run_dir: Path) -> Path:
    from hpcdl.cli.compose import compose_config
    from hpcdl.job import run_job
    from hpcdl.rundir import create_run_dir

    cfg = compose_config(["cluster=debug", *RUN])
    _, run = create_run_dir(replace(cfg, run_dir=str(run_dir)))
    assert run_job(str(run.path)).completed
    return run.path


def record(run_dir: Path) -> tuple[list[str], dict[int, dict], str]:
    """The metrics rows without timing, each checkpoint's epoch sums, the final weights."""
    rows = [",".join(r.split(",")[:7]) for r in (run_dir / "metrics.csv").read_text().splitlines()]
    store = CheckpointStore(run_dir / "checkpoints")
    sums = {}
    for step, path in store.list_steps():
        progress = read_checkpoint(path)["progress"]
        sums[step] = {k: progress[k] for k in ("epoch_stats", "epoch_count", "epoch_loss_sum")}
    summary = json.loads((run_dir / "summary.json").read_text())
    return rows, sums, summary["weights_sha256"]


def test_deferred_counts_are_the_per_step_counts_in_rows_and_mid_epoch_checkpoints(
    tmp_path, monkeypatch
) -> None:
    per_step = tmp_path / "per_step"
    with monkeypatch.context() as m:
        m.setattr(ClassificationTask, "defers_stats", False)
        reference = record(train_in_process(per_step))
    rows, sums, _ = reference
    mid_epoch = [step for step in sums if step % 13]
    assert mid_epoch and all(sums[s]["epoch_stats"]["correct"] > 0 for s in mid_epoch)
    assert "train_accuracy" in rows[0]
    assert record(train_in_process(tmp_path / "deferred")) == reference
    # 32 x 2 fp32 logits and 32 int64 labels: 512 bytes a full batch; a take every 3 steps.
    monkeypatch.setattr(hpcdl.deferred_stats, "MAX_PENDING_BYTES", 3 * 512)
    assert record(train_in_process(tmp_path / "small_chunks")) == reference


@pytest.mark.parametrize("lagged", ["true", "false"])
def test_one_rank_defers_eager_or_lagged(tmp_path, lagged) -> None:
    from hpcdl.build import build_trainer
    from hpcdl.cli.compose import compose_config
    from hpcdl.env import rank_env_from
    from hpcdl.rundir import create_run_dir
    from hpcdl.signals import StopFlag

    cfg = compose_config(["cluster=debug", f"trainer.lagged_sync={lagged}"])
    _, run = create_run_dir(replace(cfg, run_dir=str(tmp_path / "run")))
    trainer = build_trainer(cfg, rank_env_from({}), run, torch.device("cpu"), StopFlag())
    assert trainer._deferred is not None
