"""The values every rank contributes to the one all-reduce per step, by name."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Union

import torch

Value = Union[float, torch.Tensor]


@dataclass(frozen=True)
class StepSums:
    """Summed over ranks: each rank's share of the global batch, and the agreed flags.
    The task's statistics (e.g. correct predictions) follow in the task's order."""

    loss_sum: float = 0.0  # sum (not mean) of per-sample losses
    num_samples: float = 0.0
    # What loss_sum sums over: the samples, or a custom step's count (its unpadded tokens).
    loss_count: float = 0.0
    num_stop: float = 0.0  # ranks that got a stop signal: all stop at this step
    eval_due: float = 0.0  # rank 0's clock: evaluate now (trainer.eval_every_s)
    save_due: float = 0.0  # rank 0's clock: save now (trainer.checkpoint_every_s)
    stats: tuple[float, ...] = ()  # the task's statistics

    @property
    def nonfinite(self) -> bool:
        """Some rank's loss was NaN or inf (a sum with one in it is not finite): every rank
        skips the step."""
        return not math.isfinite(self.loss_sum)

    @staticmethod
    def pack(device: torch.device, stats: Sequence[Value] = (), **values: Value) -> torch.Tensor:
        """This rank's values as one float64 tensor (fields in order, then stats); tensors
        (still on the device, not synced) are copied in by index."""
        names = _checked_names(values)
        ordered = [values.get(name, 0.0) for name in names] + list(stats)
        host = torch.tensor(
            [0.0 if isinstance(v, torch.Tensor) else float(v) for v in ordered],
            dtype=torch.float64,
            pin_memory=device.type == "cuda",
        )
        # From pinned memory without blocking: a copy from pageable memory would wait for
        # every kernel queued before it (a host sync each step).
        packed = host.to(device, non_blocking=True)
        for index, value in enumerate(ordered):
            if isinstance(value, torch.Tensor):
                packed[index] = value
        return packed

    @property
    def mean_loss(self) -> float:
        return mean_of(self.loss_sum, self.loss_count)

    @classmethod
    def unpack(cls, reduced: torch.Tensor) -> StepSums:
        """The all-reduced tensor back to named values (one host sync)."""
        return cls.of_values(reduced.tolist())

    @classmethod
    def of_values(cls, values: list[float]) -> StepSums:
        """Packed values (as pack() orders them) back to named values."""
        names = _field_names()
        named = dict(zip(names, values[: len(names)], strict=True))
        return cls(**named, stats=tuple(values[len(names) :]))


def _checked_names(values: Mapping[str, Value]) -> tuple[str, ...]:
    """The field names, after refusing any value that names no field."""
    names = _field_names()
    unknown = values.keys() - set(names)
    if unknown:
        raise TypeError(f"StepSums has no fields {sorted(unknown)}")
    return names


@functools.cache
def _field_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(StepSums) if f.name != "stats")


LOSS_SUM_INDEX = 0  # where pack() puts loss_sum (the first field)


def mean_of(loss_sum: float, count: float) -> float:
    """A summed loss's mean over its count (0.0 for nothing counted: an all-padding batch)."""
    return loss_sum / count if count > 0 else 0.0
