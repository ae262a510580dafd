"""Per-step hooks: user functions the loop calls after every optimizer step, on every rank.

    trainer.step_hooks=[mylab.monitoring:after_step]

A hook gets a StepEvent (what just happened) and returns nothing. It runs after the step's
all-reduce and before the loop logs, evaluates, stops or saves, so a hook that raises or
sends a signal acts at an exact step (the tests inject their faults this way).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hpcdl.targets import resolve_callable


@dataclass(frozen=True)
class StepEvent:
    global_step: int  # optimizer steps taken so far, this one included
    epoch: int  # the current epoch, 0-based
    step_in_epoch: int  # steps taken in the current epoch, this one included
    rank: int
    world_size: int
    read_loss: Callable[[], float] = field(repr=False, compare=False)

    @property
    def loss(self) -> float:
        """This step's mean loss over the global batch. With trainer.lagged_sync the host
        reads it only when asked: a hook that never asks keeps the GPU queue full."""
        return self.read_loss()


StepHook = Callable[[StepEvent], None]


def load_step_hooks(targets: Sequence[str]) -> list[StepHook]:
    return [resolve_callable(f"trainer.step_hooks[{i}]", t) for i, t in enumerate(targets)]
