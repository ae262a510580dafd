"""Training progress counters: everything besides tensors that exact resume needs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Optional


@dataclass
class Progress:
    epoch: int = 0  # the current epoch, 0-based (= completed epochs)
    step_in_epoch: int = 0  # the next step to run inside the current epoch
    global_step: int = 0  # optimizer steps taken, skipped (non-finite) steps included
    num_bad_steps_in_row: int = 0
    num_skipped_steps: int = 0
    best_metric: Optional[float] = None
    best_epoch: Optional[int] = None
    num_evals_without_improvement: int = 0
    early_stopped: bool = False
    train_s: float = 0.0  # training wall time summed over attempts
    # The attempts' wall time, each from its job's start to its last save, summed: what the
    # weights at this point took (the time after a killed attempt's last save is not in it).
    wall_s: float = 0.0
    num_samples_seen: int = 0
    # This epoch's running sums (summed over ranks), so a mid-epoch resume logs the same row.
    epoch_loss_sum: float = 0.0
    epoch_stats: dict[str, float] = field(default_factory=dict)  # the task's statistics
    epoch_count: float = 0.0
    epoch_loss_count: float = 0.0  # what epoch_loss_sum sums over (samples, or a step's count)
    epoch_s: float = 0.0

    def position(self) -> str:
        """Where training stands, as every message says it: the epoch counted from 1."""
        return (
            f"epoch {self.epoch + 1}, step {self.step_in_epoch} of the epoch, "
            f"global step {self.global_step}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Progress:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in known}
        if "epoch_correct" in raw:  # saved before tasks: classification's one statistic
            values["epoch_stats"] = {"correct": raw["epoch_correct"]}
        if "epoch_loss_count" not in raw:  # saved before a step's own count: the samples
            values["epoch_loss_count"] = raw.get("epoch_count", 0.0)
        return cls(**values)

    def start_epoch_sums(self) -> None:
        self.epoch_loss_sum = self.epoch_count = self.epoch_loss_count = self.epoch_s = 0.0
        self.epoch_stats = {}
