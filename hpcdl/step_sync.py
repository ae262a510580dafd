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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Optional

import torch

from hpcdl.dist import all_reduce_sum
from hpcdl.step_sums import LOSS_SUM_INDEX, StepSums, Value


@dataclass
class InFlight:
    """One step's sums on their way to the host: all-reduced and packed (several ranks), or
    one rank's loss and tensor statistics only, ``fill`` adding the values the host knows."""

    step: int  # the global step they belong to
    host: torch.Tensor  # pinned memory on CUDA (filled once the event has passed)
    event: Optional[torch.cuda.Event] = None
    fill: Optional[Callable[[list[float]], StepSums]] = None  # None: ``host`` is packed
    # One rank deferring its task's statistics: the step's detached outputs and targets,
    # counted once its sums show it was taken.
    keep: Optional[tuple[torch.Tensor, torch.Tensor]] = None
    release: Optional[Callable[[torch.Tensor], None]] = None  # ``host`` back to its pool
    _sums: Optional[StepSums] = field(default=None, repr=False)

    def read(self) -> StepSums:
        """The sums (waits for this step's copy only, not for the kernels queued after it)."""
        if self._sums is None:
            if self.event is not None:
                self.event.synchronize()
            values = self.host.tolist()
            if self.release is not None:
                self.release(self.host)
            self._sums = StepSums.of_values(values) if self.fill is None else self.fill(values)
        return self._sums


def reduce_on_device(packed: torch.Tensor) -> torch.Tensor:
    """The all-reduce of one step's packed sums, and the float32 ``found_inf`` a fused
    optimizer reads: 1 where the global loss sum is not finite. With NCCL nothing here
    waits on the host: the collective and the test are queued behind the step's kernels."""
    all_reduce_sum(packed)
    return found_inf_of(packed[LOSS_SUM_INDEX])


def found_inf_of(loss_sum: torch.Tensor) -> torch.Tensor:
    """1.0 (float32, as a fused optimizer reads it) where ``loss_sum`` is not finite: x * 0 is
    0 for a finite x and NaN for inf or NaN, and an in-place != 0 keeps the float dtype. Two
    kernels for a float32 loss (isfinite alone is four on CUDA: abs, ==, != and &)."""
    found = loss_sum.detach() * 0
    found.ne_(0)
    return found if found.dtype == torch.float32 else found.float()


class HostCopies:
    """Copies of the steps' sums to the host, into pinned buffers reused once read: on a GPU
    a fresh pinned tensor each step costs more than the copy (every kernel launch counts
    for a tiny model). On the CPU the values are there already and nothing is copied."""

    def __init__(self) -> None:
        self._free: dict[tuple[int, torch.dtype], list[torch.Tensor]] = {}

    def send(
        self,
        step: int,
        values: torch.Tensor,
        fill: Optional[Callable[[list[float]], StepSums]] = None,
        keep: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    ) -> InFlight:
        """Start copying ``values`` (one dimension) to the host; read them with InFlight.read()."""
        if values.device.type != "cuda":
            return InFlight(step, values, fill=fill, keep=keep)
        key = (values.numel(), values.dtype)
        free = self._free.setdefault(key, [])
        host = free.pop() if free else torch.empty(key[0], dtype=key[1], pin_memory=True)
        host.copy_(values, non_blocking=True)
        event = torch.cuda.Event()
        # On the copy's stream (the sums' GPU), whichever device is current.
        event.record(torch.cuda.current_stream(values.device))
        return InFlight(step, host, event, fill, keep, release=free.append)


def solo_sums(
    loss_sum: torch.Tensor, values: Sequence[Value]
) -> tuple[torch.Tensor, Callable[[list[float]], StepSums]]:
    """One rank's sums without packing: nothing to all-reduce, so only the tensors (the loss,
    a step's tensor count, tensor statistics) go to the host; ``values`` follow the loss in
    StepSums' order (num_samples, loss_count, the flags, then the statistics), and the floats
    among them stay on the host. Returns the tensor to copy and the function that makes
    StepSums of its values."""
    loss = loss_sum.detach().reshape(1)
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if tensors:  # one float64 row with the loss
        row = torch.cat([loss.double(), *(t.detach().reshape(1).double() for t in tensors)])
    else:
        row = loss
    floats = [None if isinstance(v, torch.Tensor) else float(v) for v in values]

    def fill(read: list[float]) -> StepSums:
        rest = iter(read[1:])
        return StepSums.of_values([read[0], *(next(rest) if f is None else f for f in floats)])

    return row, fill


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
