"""Lagged step sums (trainer.lagged_sync): a step's all-reduced sums are read one step late.

In the eager mode every step ends with the host reading its all-reduced sums (the loss, the
agreed stop/eval/save flags), so on a GPU the host waits for the step to finish before it
can queue the next one. Here the sums stay on the device: the step's skip decision (a
non-finite loss on any rank) is made there (a fused optimizer's ``found_inf``), the sums are
copied to pinned host memory behind an event, and the host reads them after it has queued
the next step. The flags of step k act at the boundary after step k+1 on every rank alike;
a boundary where something must happen (save, evaluate, stop, epoch end) first reads all
the steps still in flight, so a checkpoint always holds every step's sums.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from hpcdl.dist import all_reduce_sum
from hpcdl.step_sums import LOSS_SUM_INDEX, StepSums


@dataclass
class InFlight:
    """One step's all-reduced sums on their way to the host."""

    step: int  # the global step they belong to
    host: torch.Tensor  # pinned memory on CUDA (filled once the event has passed)
    event: Optional[torch.cuda.Event] = None
    _sums: Optional[StepSums] = field(default=None, repr=False)

    def read(self) -> StepSums:
        """The sums (waits for this step's copy only, not for the kernels queued after it)."""
        if self._sums is None:
            if self.event is not None:
                self.event.synchronize()
            self._sums = StepSums.unpack(self.host)
        return self._sums


def reduce_on_device(packed: torch.Tensor) -> torch.Tensor:
    """The all-reduce of one step's packed sums, and the float32 ``found_inf`` a fused
    optimizer reads: 1 where the global loss sum is not finite. With NCCL nothing here
    waits on the host: the collective and the test are queued behind the step's kernels."""
    all_reduce_sum(packed)
    return (~torch.isfinite(packed[LOSS_SUM_INDEX])).to(torch.float32)


def send_to_host(step: int, reduced: torch.Tensor) -> InFlight:
    """Start copying the reduced sums to the host; read them later with InFlight.read()."""
    if reduced.device.type != "cuda":
        return InFlight(step, reduced)  # on the CPU the values are already there
    host = torch.empty(reduced.shape, dtype=reduced.dtype, pin_memory=True)
    host.copy_(reduced, non_blocking=True)
    event = torch.cuda.Event()
    # On the copy's stream (the sums' GPU), whichever device is current.
    event.record(torch.cuda.current_stream(reduced.device))
    return InFlight(step, host, event)


def skip_on_device(optimizer: torch.optim.Optimizer, found_inf: torch.Tensor) -> None:
    """Hand ``found_inf`` to a fused optimizer's next step(), which then leaves the weights
    and its state as they are when it is 1 (as torch's GradScaler does)."""
    if not getattr(optimizer, "_step_supports_amp_scaling", False):
        raise TypeError(
            f"{type(optimizer).__name__} cannot skip a step on the device: "
            "trainer.lagged_sync needs a fused optimizer (optim=sgd, adam or adamw)"
        )
    optimizer.grad_scale = None  # type: ignore[attr-defined]
    optimizer.found_inf = found_inf  # type: ignore[attr-defined]
