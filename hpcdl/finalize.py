"""What a finished run leaves behind: summary.json, learning_curves.png, confusion_matrix.png."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcdl.report import (
    collect_versions,
    plot_confusion_matrix,
    plot_learning_curves,
    weights_sha256,
    write_json_atomic,
)
from hpcdl.trainer import FitResult, Trainer


def write_curves(trainer: Trainer, run_dir: Path) -> None:
    rows = trainer.p.metrics.read()
    if rows:
        plot_learning_curves(rows, run_dir / "learning_curves.png")


def finalize_run(
    trainer: Trainer, result: FitResult, run_dir: Path, wall_s: float
) -> dict[str, Any]:
    """Test-set evaluation (all ranks) and the run's summary files (rank 0)."""
    test = trainer.evaluate_split("test") if trainer.p.data.y_test.numel() else None
    if not trainer.env.is_main:
        return {}
    pr = result.progress
    d = trainer.p.data
    summary: dict[str, Any] = {
        "outcome": result.outcome.value,
        "test_loss": test.loss if test else None,
        "test_accuracy": test.accuracy if test else None,
        "num_test_samples": test.num_samples if test else 0,
        "best_metric_name": trainer.t.early_stopping.monitor,
        "best_metric": pr.best_metric,
        "best_epoch": pr.best_epoch,
        "early_stopped": pr.early_stopped,
        "steps": pr.global_step,
        "epochs": pr.epoch,
        "num_skipped_steps": pr.num_skipped_steps,
        "world_size": trainer.env.world_size,
        "train_s": pr.train_s,
        "wall_s": wall_s,
        "samples_per_s": pr.num_samples_seen / pr.train_s if pr.train_s > 0 else 0.0,
        "num_samples_seen": pr.num_samples_seen,
        "weights_sha256": weights_sha256(trainer.p.raw_model.state_dict()),
        "checkpoint": str(result.checkpoint) if result.checkpoint else None,
        "versions": collect_versions(),
    }
    write_json_atomic(run_dir / "summary.json", summary)
    write_curves(trainer, run_dir)
    if test is not None:
        plot_confusion_matrix(test.confusion, list(d.class_names), run_dir / "confusion_matrix.png")
    return summary
