"""A task's training statistics counted a chunk of steps at a time.

Classification's one statistic (correct predictions) is three tiny ops a step (argmax, ==,
sum) and a read: about 14 us of a 420 us MLP step on a CPU, the largest single piece of
hpcdl's per-step overhead over a hand-written loop. Its sums are integer counts, the same for
any grouping of batches, so the trainer keeps each step's detached outputs and targets here
and counts them together when it needs the epoch's sums (the epoch's end, a checkpoint, a
train_* metric) or once what they keep alive passes MAX_PENDING_BYTES.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch

# The kept tensors are counted once the memory they keep alive passes this: 16 MiB (for
# example 64 steps of 256 samples x 256 classes in fp32, with their labels). What a tensor
# keeps alive is its whole storage: logits sliced from a wider output hold all of it.
MAX_PENDING_BYTES = 16 << 20

StatsOf = Callable[[torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]


class DeferredStats:
    def __init__(self, stats_of: StatsOf, max_bytes: Optional[int] = None) -> None:
        self._stats_of = stats_of
        self._max_bytes = MAX_PENDING_BYTES if max_bytes is None else max_bytes
        self._outputs: list[torch.Tensor] = []
        self._targets: list[torch.Tensor] = []
        self._num_bytes = 0

    def add(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        """One step's outputs and targets (a step that was taken: a skipped one adds none)."""
        outputs = outputs.detach()  # the step's graph is not kept alive
        self._outputs.append(outputs)
        self._targets.append(targets)
        self._num_bytes += _storage_bytes(outputs) + _storage_bytes(targets)

    @property
    def full(self) -> bool:
        return self._num_bytes >= self._max_bytes

    def take(self) -> dict[str, float]:
        """The statistics of every step added since the last take (empty: none added)."""
        if not self._outputs:
            return {}
        outputs, targets = self._outputs, self._targets
        if len(outputs) > 1:
            sums = self._stats_of(torch.cat(outputs), torch.cat(targets))
        else:
            sums = self._stats_of(outputs[0], targets[0])
        self._outputs, self._targets, self._num_bytes = [], [], 0
        return {name: float(value) for name, value in sums.items()}


def _storage_bytes(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().nbytes()
