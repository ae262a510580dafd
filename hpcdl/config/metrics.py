"""The built-in tasks' metrics and which way each is better: the one table that the tasks
(hpcdl.tasks), the check of trainer.early_stopping.monitor and sweep rankings read.
Stdlib only (login node)."""

from __future__ import annotations

from typing import Optional

from hpcdl.config.schema import Mode

# Every task's loss: lower is better.
LOSS = "loss"
# Besides the loss, what each built-in task reports, in the order it reports them (a custom
# task's metrics are known only once its function has run).
TASK_METRICS: dict[str, dict[str, Mode]] = {
    "classification": {"accuracy": Mode.max},
    "regression": {"mae": Mode.min, "rmse": Mode.min, "r2": Mode.max},
}
# The prefixes of a metric's name in metrics.csv and summary.json: val_mae, test_accuracy.
SPLITS = ("train", "val", "test")


def unprefixed(metric: str) -> str:
    """The metric without its split: val_mae -> mae, test_loss -> loss, wall_s -> wall_s."""
    split, _, name = metric.partition("_")
    return name if split in SPLITS and name else metric


def builtin_mode(metric: str) -> Optional[Mode]:
    """min or max for the loss or a built-in task's metric on any split (val_mae,
    test_accuracy); None for any other name."""
    name = unprefixed(metric)
    if name == LOSS:
        return Mode.min
    for metrics in TASK_METRICS.values():
        if name in metrics:
            return metrics[name]
    return None
