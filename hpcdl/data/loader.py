"""Batches for the training loop: device-resident indexing, or a DataLoader with workers.

Tensors (the built-in sources) are indexed on the device, or served by a DataLoader;
map-style Datasets (data=custom, data=imagefolder) always come through a DataLoader with
workers, pinned memory, prefetch and persistent workers. Either way hpcdl's per-epoch
permutation decides the batches, so a rank reads only its shard and a resume at any step
starts with exactly the next batch without reading the consumed ones.
"""

from __future__ import annotations

import atexit
import itertools
import signal
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch.utils.data import DataLoader

from hpcdl.data.sharding import EpochSharder

Batch = tuple[int, torch.Tensor, torch.Tensor, int]

# QUIET_GENERATOR_NOTE: every DataLoader gets its own generator. Without one, starting an
# iteration draws the workers' base seed from the global torch RNG, so a run resumed
# mid-epoch (which starts a new iteration where the uninterrupted run did not) would draw
# different dropout masks from then on. hpcdl seeds each sample itself, so the workers'
# base seed does not matter.


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
        local = order[start:stop] if world_size == 1 else order[start:stop][rank::world_size]
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
    for step, (xb, yb) in zip(steps, start_iteration(loader), strict=True):
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
    before each iteration (a persistent DataLoader re-reads them each time). With
    with_epoch, each index comes as (epoch, index), for SeededSamples."""

    def __init__(self, sharder: EpochSharder, with_epoch: bool = False) -> None:
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
        self.with_epoch = with_epoch

    def __iter__(self) -> Iterator[list[Any]]:
        for step in range(self.start_step, self.sharder.num_steps_per_epoch):
            indices = self.sharder.local_indices(self.epoch, step).tolist()
            yield [(self.epoch, i) for i in indices] if self.with_epoch else indices

    def __len__(self) -> int:
        return self.sharder.num_steps_per_epoch - self.start_step


def worker_ignores_sigterm(_worker_id: int) -> None:
    """Every hpcdl DataLoader's worker_init_fn. Slurm's scancel, preemption and time limit
    send SIGTERM to every process of the job step; torch's workers die of one that is not
    their parent's, and their rank then fails at its next batch instead of stopping at the
    step boundary with a checkpoint. The rank stops them itself (its stop ends the loader:
    the workers leave as they do at the end of any run; one that does not is SIGKILLed by
    Slurm at the end of the step)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


# The iterators of hpcdl's DataLoaders and their worker processes, for kill_workers_at_exit.
# A process object outlives its iterator while the process runs (multiprocessing keeps it).
_ITERATORS: weakref.WeakSet[Any] = weakref.WeakSet()
_WORKERS: weakref.WeakSet[Any] = weakref.WeakSet()


def start_iteration(loader: DataLoader[Any]) -> Iterator[Any]:
    """iter(loader), remembered so that its workers can be stopped at exit."""
    iterator = iter(loader)
    workers = getattr(iterator, "_workers", None)
    if workers:
        if not _ITERATORS and not _WORKERS:  # the first: registered once, not at import
            atexit.unregister(kill_workers_at_exit)
            atexit.register(kill_workers_at_exit)
        _ITERATORS.add(iterator)
        _WORKERS.update(workers)
    return iterator


def kill_workers_at_exit() -> None:
    """At interpreter exit, SIGKILL the workers of hpcdl's DataLoaders that are still alive.
    A loader whose iteration ended in an error (an unreadable image, a sample that raises)
    can leave its workers running: kept with its iterator by the error's traceback, or left
    waiting by torch's shutdown of an iterator that ended so. multiprocessing's own exit
    hook then stops daemonic children with SIGTERM, which these workers ignore
    (worker_ignores_sigterm), and waits for them: the process hung there forever after
    printing its error. Registered as the first workers start, after multiprocessing's hook
    (registered as it was imported, before any worker), so atexit runs it first."""
    from torch.utils.data._utils import signal_handling

    for iterator in list(_ITERATORS):
        if getattr(iterator, "_worker_pids_set", False):
            # As torch's own shutdown does: else its SIGCHLD handler raises on these deaths.
            signal_handling._remove_worker_pids(id(iterator))
            iterator._worker_pids_set = False
    workers = [worker for worker in list(_WORKERS) if worker.is_alive()]
    for worker in workers:
        worker.kill()
    for worker in workers:
        worker.join(timeout=5)


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
        generator=torch.Generator(),  # see QUIET_GENERATOR_NOTE
        worker_init_fn=worker_ignores_sigterm,
    )
    _LOADERS[sharder] = _CachedLoader(loader, dataset, num_workers, pin_memory)
    return loader


# ----------------------------------------------------------------------------- Datasets
# Mixes (seed, epoch, index) into one RNG seed per sample; primes keep neighbours apart.
SAMPLE_SEED_STRIDE = 1_000_000_007


def sample_seed(seed: int, epoch: int, index: int) -> int:
    return ((seed * 1_000_003 + epoch) * SAMPLE_SEED_STRIDE + index) % 2**63


class SeededSamples(torch.utils.data.Dataset[Any]):
    """A user's dataset, indexed by (epoch, index): before each sample, Python's, NumPy's
    and torch's global RNGs are seeded from (seed, epoch, index), so random augmentation in
    __getitem__ is the same in any worker, on any number of ranks, and after a resume."""

    def __init__(self, dataset: Any, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        if torch.utils.data.get_worker_info() is not None:  # a worker: its RNGs are its own
            seed_rngs(sample_seed(self.seed, epoch, index))
            return self.dataset[index]
        # num_workers=0: in the training process, whose RNG streams (dropout) must not move.
        with kept_rng_states():
            seed_rngs(sample_seed(self.seed, epoch, index))
            return self.dataset[index]

    def __getitems__(self, keys: list[tuple[int, int]]) -> list[Any]:
        """A batch's samples (the DataLoader asks for them together): the same samples as
        one __getitem__ each, with the training process's RNG states kept once per batch,
        not per sample (~125 us a time, measured: 20-80x the cost of a cheap sample)."""
        if torch.utils.data.get_worker_info() is not None:
            return [self[key] for key in keys]
        with kept_rng_states():
            samples = []
            for epoch, index in keys:
                seed_rngs(sample_seed(self.seed, epoch, index))
                samples.append(self.dataset[index])
            return samples


@contextmanager
def kept_rng_states() -> Iterator[None]:
    """Python's, NumPy's and torch's CPU RNG states, put back when the block ends."""
    import random

    import numpy as np

    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def seed_rngs(seed: int) -> None:
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    # The CPU generator only: torch.manual_seed also queues lazy seeds for every device
    # type, at ~100-300 us a call (measured), which per sample would dominate data loading.
    torch.default_generator.manual_seed(seed)


def channels_last_inputs(batch: Any) -> Any:
    """4-D tensors of a batch in channels-last memory layout (conv nets on GPUs)."""
    if isinstance(batch, torch.Tensor):
        return batch.contiguous(memory_format=torch.channels_last) if batch.dim() == 4 else batch
    if isinstance(batch, dict):
        return {k: channels_last_inputs(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return type(batch)(channels_last_inputs(v) for v in batch)
    return batch


def move_to(batch: Any, device: torch.device) -> Any:
    """Tensors anywhere in tuples, lists and dicts, on the device (non-blocking from pinned
    memory); other values as they are."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: move_to(v, device) for k, v in batch.items()}
    if isinstance(batch, list):
        return [move_to(v, device) for v in batch]
    if isinstance(batch, tuple):
        moved = [move_to(v, device) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else tuple(moved)  # namedtuple
    return batch


@dataclass
class LoaderSettings:
    num_workers: int
    prefetch_factor: int
    collate_fn: Optional[Callable[[list[Any]], Any]]
    seed: int
    # Called with each batch on the host before it moves to the device (hpcdl.data.feed's
    # LabelCheck); raises to refuse it.
    check_batch: Optional[Callable[[Any], None]] = None


def dataset_batches(
    dataset: Any,
    sharder: EpochSharder,
    epoch: int,
    start_step: int,
    device: torch.device,
    settings: LoaderSettings,
) -> Iterator[tuple[int, Any, int]]:
    """(step_in_epoch, batch on the device, global_batch_count) for the steps
    [start_step, num_steps_per_epoch) of this epoch, read from a map-style dataset.

    Not lazy: the loader's iteration starts here (its workers start, or wake up, and read
    ahead), so a caller that asks early gets its first batch without waiting: the trainer
    asks before it builds the model, and for the next epoch before validating this one."""
    if len(dataset) != sharder.num_samples:
        raise ValueError(
            f"the dataset holds {len(dataset)} samples, the sharder {sharder.num_samples}"
        )
    loader = _dataset_loader_for(dataset, sharder, settings, pin_memory=device.type == "cuda")
    sampler = loader.batch_sampler
    assert isinstance(sampler, EpochBatchSampler)
    steps = range(start_step, sharder.num_steps_per_epoch)
    cold = settings.num_workers > 0 and loader not in _WARM_LOADERS
    _WARM_LOADERS.add(loader)
    if not cold or len(steps) < 2:
        sampler.epoch, sampler.start_step = epoch, start_step  # read when iteration starts
        return _on_device(start_iteration(loader), sharder, steps, device, settings.check_batch)
    # Workers that have yet to start (a new run, a resume) take ~10-50 ms per worker before
    # their first batch: they start on the second batch, and this process reads the first
    # meanwhile (the same samples and augmentation: SeededSamples seeds each one).
    sampler.epoch, sampler.start_step = epoch, start_step + 1
    rest = start_iteration(loader)
    first = read_batch(loader, sharder.local_indices(epoch, start_step).tolist(), epoch)
    return _on_device(itertools.chain([first], rest), sharder, steps, device, settings.check_batch)


def quiet_default_collate(samples: list[Any]) -> Any:
    """torch's default_collate without its warning that a read-only NumPy sample (a slice
    of a memory-mapped .npy) is not writable: it stacks copies of the samples into a new
    batch tensor, so nothing ever writes to the file's pages. torch gives that warning once
    per process, so a user's own torch.as_tensor of such an array elsewhere goes unwarned."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NOT_WRITABLE, category=UserWarning)
        return torch.utils.data.default_collate(samples)


_NOT_WRITABLE = "The given NumPy array is not writable"


# Loaders whose workers have started (persistent: they stay until the loader goes).
_WARM_LOADERS: weakref.WeakSet[DataLoader[Any]] = weakref.WeakSet()


def read_batch(loader: DataLoader[Any], indices: list[int], epoch: int) -> Any:
    """One batch read in this process the way the loader's workers read it."""
    samples = [loader.dataset[(epoch, i)] for i in indices]
    collate = loader.collate_fn or torch.utils.data.default_collate
    return collate(samples)


def _on_device(
    batches: Iterator[Any],
    sharder: EpochSharder,
    steps: range,
    device: torch.device,
    check: Optional[Callable[[Any], None]],
) -> Iterator[tuple[int, Any, int]]:
    for step, batch in zip(steps, batches, strict=True):
        if check is not None:
            check(batch)
        yield step, move_to(batch, device), sharder.global_batch_count(step)


_DATASET_LOADERS: weakref.WeakKeyDictionary[EpochSharder, tuple[Any, DataLoader[Any]]] = (
    weakref.WeakKeyDictionary()
)


def _dataset_loader_for(
    dataset: Any, sharder: EpochSharder, settings: LoaderSettings, pin_memory: bool
) -> DataLoader[Any]:
    cached = _DATASET_LOADERS.get(sharder)
    if cached is not None and cached[0] is dataset:
        return cached[1]
    workers = settings.num_workers
    loader = DataLoader(
        SeededSamples(dataset, settings.seed),
        batch_sampler=EpochBatchSampler(sharder, with_epoch=True),
        collate_fn=settings.collate_fn,
        num_workers=workers,
        pin_memory=pin_memory,
        persistent_workers=workers > 0,
        prefetch_factor=settings.prefetch_factor if workers > 0 else None,
        generator=torch.Generator(),  # see QUIET_GENERATOR_NOTE
        worker_init_fn=worker_ignores_sigterm,
    )
    _DATASET_LOADERS[sharder] = (dataset, loader)
    return loader


def dataset_eval_batches(
    dataset: Any,
    rank: int,
    world_size: int,
    batch_size: int,
    device: torch.device,
    settings: LoaderSettings,
) -> Iterator[Any]:
    """This rank's samples rank::world_size of a dataset, in order, in batches on the
    device (evaluation: no shuffling, epoch 0's per-sample seeds)."""
    indices = [(0, i) for i in range(rank, len(dataset), world_size)]
    batches = [indices[s : s + batch_size] for s in range(0, len(indices), batch_size)]
    if not batches:
        return
    loader = DataLoader(
        SeededSamples(dataset, settings.seed),
        batch_sampler=batches,
        collate_fn=settings.collate_fn,
        num_workers=min(settings.num_workers, len(batches)),
        pin_memory=device.type == "cuda",
        prefetch_factor=settings.prefetch_factor if settings.num_workers > 0 else None,
        generator=torch.Generator(),  # see QUIET_GENERATOR_NOTE
        worker_init_fn=worker_ignores_sigterm,
    )
    for batch in start_iteration(loader):
        if settings.check_batch is not None:
            settings.check_batch(batch)
        yield move_to(batch, device)
