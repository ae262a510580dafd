"""A task's training statistics counted a chunk of steps at a time.

Classification's one statistic (correct predictions) is three tiny ops a step (argmax, ==,
sum) and a read: about 14 us of a 420 us MLP step on a CPU, the largest single piece of
hpcdl's per-step overhead over a hand-written loop. Its sums are integer counts, the same for
any grouping of batches, so the trainer keeps each step's detached outputs and targets here
and counts them together when it needs the epoch's sums (the epoch's end, a checkpoint, a
train_* metric) or when the kept outputs pass MAX_PENDING_ELEMENTS.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch

# The kept outputs are counted once they hold this many elements: 16 MiB in fp32
# (for example 64 steps of 256 samples x 256 classes).
MAX_PENDING_ELEMENTS = 1 << 22

StatsOf = Callable[[torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]


class DeferredStats:
    def __init__(self, stats_of: StatsOf, max_elements: Optional[int] = None) -> None:
        self._stats_of = stats_of
        self._max_elements = MAX_PENDING_ELEMENTS if max_elements is None else max_elements
        self._outputs: list[torch.Tensor] = []
        self._targets: list[torch.Tensor] = []
        self._num_elements = 0

    def add(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        """One step's outputs and targets (a step that was taken: a skipped one adds none)."""
        outputs = outputs.detach()  # the step's graph is not kept alive
        self._outputs.append(outputs)
        self._targets.append(targets)
        self._num_elements += outputs.numel()

    @property
    def full(self) -> bool:
        return self._num_elements >= self._max_elements

    def take(self) -> dict[str, float]:
        """The statistics of every step added since the last take (empty: none added)."""
        if not self._outputs:
            return {}
        outputs, targets = self._outputs, self._targets
        if len(outputs) > 1:
            sums = self._stats_of(torch.cat(outputs), torch.cat(targets))
        else:
            sums = self._stats_of(outputs[0], targets[0])
        self._outputs, self._targets, self._num_elements = [], [], 0
        return {name: float(value) for name, value in sums.items()}
