"""Which samples each rank trains on at each step: one seeded permutation per epoch."""

from __future__ import annotations

import math
from typing import Optional

import torch

from hpcdl.errors import ConfigError

# Mixes seed and epoch into one generator seed (a prime, so nearby seeds do not collide for
# any realistic epoch count).
EPOCH_SEED_STRIDE = 1_000_003
GENERATOR_SEED_MODULUS = 2**63


class EpochSharder:
    """Global batches are consecutive slices of the epoch's permutation; rank r takes every
    world_size-th sample of a global batch. The permutation does not depend on world_size,
    so an epoch covers every sample exactly once for any number of ranks, and all ranks
    run the same number of steps (the last global batch may be short)."""

    def __init__(
        self, num_samples: int, global_batch_size: int, rank: int, world_size: int, seed: int
    ) -> None:
        if num_samples <= 0:
            raise ConfigError(f"num_samples={num_samples}: the training split is empty")
        if global_batch_size <= 0:
            raise ConfigError(f"trainer.batch_size={global_batch_size}: must be > 0")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} is outside [0, world_size={world_size})")
        if global_batch_size < world_size:
            raise ConfigError(
                f"trainer.batch_size={global_batch_size}: smaller than the {world_size} ranks; "
                "the batch size is global, give each rank at least one sample per step"
            )
        self.num_samples = num_samples
        self.global_batch_size = global_batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.num_steps_per_epoch = -(-num_samples // global_batch_size)
        self._cached_epoch: Optional[int] = None
        self._cached_permutation = torch.empty(0, dtype=torch.int64)

    def permutation(self, epoch: int) -> torch.Tensor:
        """The epoch's order of all sample indices (CPU int64), cached for the last epoch."""
        if epoch < 0:
            raise ValueError(f"epoch={epoch}: must be >= 0")
        if epoch != self._cached_epoch:
            seed = (self.seed * EPOCH_SEED_STRIDE + epoch) % GENERATOR_SEED_MODULUS
            generator = torch.Generator().manual_seed(seed)
            self._cached_permutation = torch.randperm(self.num_samples, generator=generator)
            self._cached_epoch = epoch
        return self._cached_permutation

    def global_batch(self, epoch: int, step_in_epoch: int) -> torch.Tensor:
        start, stop = self.batch_bounds(step_in_epoch)
        return self.permutation(epoch)[start:stop]

    def local_indices(self, epoch: int, step_in_epoch: int) -> torch.Tensor:
        return self.global_batch(epoch, step_in_epoch)[self.rank :: self.world_size]

    def global_batch_count(self, step_in_epoch: int) -> int:
        """Samples in the global batch of this step (global_batch_size but for the last)."""
        start, stop = self.batch_bounds(step_in_epoch)
        return stop - start

    def batch_bounds(self, step_in_epoch: int) -> tuple[int, int]:
        if not 0 <= step_in_epoch < self.num_steps_per_epoch:
            raise IndexError(
                f"step_in_epoch={step_in_epoch} is outside [0, {self.num_steps_per_epoch})"
            )
        start = step_in_epoch * self.global_batch_size
        return start, min(start + self.global_batch_size, self.num_samples)

    def step_starting_at(self, sample: int) -> Optional[int]:
        """The step of the epoch whose batch starts at this place of the permutation (the
        step count at its end for the end), or None when no batch starts there."""
        if sample >= self.num_samples:
            return self.num_steps_per_epoch
        step, rest = divmod(sample, self.global_batch_size)
        return None if rest else step

    def batch_sizes_starting_at(self, sample: int) -> list[int]:
        """The batch sizes next to this one (below, above) with a batch starting at sample,
        at least one sample per rank."""
        small = [d for d in range(1, math.isqrt(sample) + 1) if sample % d == 0]
        divisors = sorted({*small, *(sample // d for d in small)})  # O(sqrt) for large data
        fits = [b for b in divisors if b >= self.world_size]
        below = [b for b in fits if b < self.global_batch_size][-1:]
        above = [b for b in fits if b > self.global_batch_size][:1]
        return below + above
