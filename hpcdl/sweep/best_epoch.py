"""`hpcdl sweep summary --at best`: a trial's metric at its best epoch, the epoch its
best.pt was kept for (by its trainer.early_stopping.monitor), instead of its last epoch's.
Read from the run dir's records (checkpoint.json or summary.json for the epoch, metrics.csv
for the values), without torch (login node)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from hpcdl.rundir import RunDir

LAST = "last"
BEST = "best"
AT_CHOICES = (LAST, BEST)


@dataclass(frozen=True)
class BestEpoch:
    epoch: int  # 1-based, as metrics.csv's epoch column
    monitor: Optional[str]  # the metric it is best by


def best_epoch(run_dir: RunDir) -> Optional[BestEpoch]:
    """The newest checkpoint's best epoch (checkpoint.json: a trial still training, or
    resumed for more epochs since its summary.json), else summary.json's; None before the
    trial's first evaluation, or for an `hpcdl run` program (no early stopping)."""
    record = run_dir.read_checkpoint_record() or {}
    progress = record.get("progress")
    if isinstance(progress, dict) and _is_int(progress.get("best_epoch")):
        stopping = record.get("early_stopping")
        monitor = stopping.get("monitor") if isinstance(stopping, dict) else None
        return BestEpoch(progress["best_epoch"], monitor)
    summary = run_dir.read_summary() or {}
    if _is_int(summary.get("best_epoch")):
        return BestEpoch(summary["best_epoch"], summary.get("best_metric_name"))
    return None


def value_at_best(run_dir: RunDir, metric: str) -> Optional[float]:
    """`metric` in metrics.csv's row of the trial's best epoch; None where either is
    missing (a metric measured once, at the end, as test_accuracy, is in no row)."""
    best = best_epoch(run_dir)
    if best is None:
        return None
    rows = [row for row in run_dir.metrics.read() if row.get("epoch") == best.epoch]
    value = rows[-1].get(metric) if rows else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
