"""Batches for the training loop: device-resident indexing, or a DataLoader with workers."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from hpcdl.data.sharding import EpochSharder

Batch = tuple[int, torch.Tensor, torch.Tensor, int]


def iterate_batches(
    x: torch.Tensor,
    y: torch.Tensor,
    sharder: EpochSharder,
    epoch: int,
    start_step: int,
    device: torch.device,
    in_memory: bool = True,
    num_workers: int = 0,
) -> Iterator[Batch]:
    """Yields (step_in_epoch, x_local, y_local, global_batch_count) for the steps
    [start_step, num_steps_per_epoch) of this epoch; global_batch_count is the number of
    samples in the global batch over all ranks (for the loss scale of a short last batch).

    in_memory=True: x and y already live on the training device; each step only indexes.
    in_memory=False: x and y are CPU tensors served by a DataLoader (workers, pinned
    memory), with the same batches.
    """
    if not 0 <= start_step <= sharder.num_steps_per_epoch:
        raise ValueError(f"start_step={start_step} is outside [0, {sharder.num_steps_per_epoch}]")
    if x.shape[0] != sharder.num_samples or y.shape[0] != sharder.num_samples:
        raise ValueError(
            f"x/y hold {x.shape[0]}/{y.shape[0]} samples, the sharder {sharder.num_samples}"
        )
    if in_memory:
        return _indexed_batches(x, y, sharder, epoch, start_step)
    if x.device.type != "cpu" or y.device.type != "cpu":
        raise ValueError("in_memory=False serves CPU tensors; keep x and y off the device")
    return _loader_batches(x, y, sharder, epoch, start_step, device, num_workers)


def _indexed_batches(
    x: torch.Tensor, y: torch.Tensor, sharder: EpochSharder, epoch: int, start_step: int
) -> Iterator[Batch]:
    # One host->device copy of the permutation per epoch; each step slices it on the device.
    order = sharder.permutation(epoch).to(x.device, non_blocking=True)
    rank, world_size = sharder.rank, sharder.world_size
    for step in range(start_step, sharder.num_steps_per_epoch):
        start, stop = sharder.batch_bounds(step)
        local = order[start:stop][rank::world_size]
        yield step, x[local], y[local], stop - start


def _loader_batches(
    x: torch.Tensor,
    y: torch.Tensor,
    sharder: EpochSharder,
    epoch: int,
    start_step: int,
    device: torch.device,
    num_workers: int,
) -> Iterator[Batch]:
    loader = _loader_for(x, y, sharder, num_workers, pin_memory=device.type == "cuda")
    sampler = loader.batch_sampler
    assert isinstance(sampler, EpochBatchSampler)
    sampler.epoch, sampler.start_step = epoch, start_step  # read when iteration starts
    steps = range(start_step, sharder.num_steps_per_epoch)
    for step, (xb, yb) in zip(steps, loader, strict=True):
        count = sharder.global_batch_count(step)
        yield step, xb.to(device, non_blocking=True), yb.to(device, non_blocking=True), count


# ----------------------------------------------------------------------------- DataLoader
class PairDataset(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """x, y indexed a whole batch at a time (__getitems__), not sample by sample."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.int64)
        return self.x[idx], self.y[idx]


def keep_batch(batch: Any) -> Any:
    """collate_fn: __getitems__ already returns the batch (module level: workers pickle it)."""
    return batch


class EpochBatchSampler:
    """This rank's index lists for one epoch from start_step on; set epoch and start_step
    before each iteration (a persistent DataLoader re-reads them each time)."""

    def __init__(self, sharder: EpochSharder) -> None:
        # A copy: the loader cache below is keyed weakly by the caller's sharder.
        self.sharder = EpochSharder(
            sharder.num_samples,
            sharder.global_batch_size,
            sharder.rank,
            sharder.world_size,
            sharder.seed,
        )
        self.epoch = 0
        self.start_step = 0

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.start_step, self.sharder.num_steps_per_epoch):
            yield self.sharder.local_indices(self.epoch, step).tolist()

    def __len__(self) -> int:
        return self.sharder.num_steps_per_epoch - self.start_step


@dataclass
class _CachedLoader:
    loader: DataLoader[tuple[torch.Tensor, torch.Tensor]]
    dataset: PairDataset
    num_workers: int
    pin_memory: bool


# One DataLoader per sharder, so persistent workers survive from epoch to epoch; the entry
# goes when the trainer drops its sharder.
_LOADERS: weakref.WeakKeyDictionary[EpochSharder, _CachedLoader] = weakref.WeakKeyDictionary()


def _loader_for(
    x: torch.Tensor, y: torch.Tensor, sharder: EpochSharder, num_workers: int, pin_memory: bool
) -> DataLoader[tuple[torch.Tensor, torch.Tensor]]:
    cached = _LOADERS.get(sharder)
    if (
        cached is not None
        and cached.dataset.x is x
        and cached.dataset.y is y
        and cached.num_workers == num_workers
        and cached.pin_memory == pin_memory
    ):
        return cached.loader
    dataset = PairDataset(x, y)
    loader = DataLoader(
        dataset,
        batch_sampler=EpochBatchSampler(sharder),
        collate_fn=keep_batch,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
    )
    _LOADERS[sharder] = _CachedLoader(loader, dataset, num_workers, pin_memory)
    return loader
