"""L1 lazy data epoch: hpcdl's epoch on a lazily read dataset vs a plain DataLoader loop.

Both train benchmarks.lazy's SmallCnn with SGD (hpcdl's optim=sgd defaults) on the same
LazyImages rows, with the same batch size and number of workers, in this process, on the
device hpcdl picks (trainer.device=auto). The plain loop is what a user writes by hand:

    DataLoader(dataset, batch_size, shuffle=True, num_workers=N, pin_memory=on_cuda)
    for x, y in loader: zero_grad, cross_entropy, backward, step, loss.item()

A step hook (benchmarks.hooks.record_time) stamps the time after every optimizer step, in
hpcdl's loop and in the plain loop alike. Epoch 0 of each run is warm-up and not counted.
A third pair reads the same epochs without a model (hpcdl's DataLoader, as the trainer
drives it, vs the plain one), to tell the data path's share from the step's.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import hooks, lazy, timing
from benchmarks.base import Row, Settings
from benchmarks.inprocess import create_run, environ, run_in_process
from benchmarks.timing import interleaved

WARMUP_EPOCHS = 1


@dataclass(frozen=True)
class Sizes:
    num_train: int
    num_val: int
    image_size: int
    batch_size: int
    num_workers: int
    measured_epochs: int  # after the warm-up epoch; >= 2, for an epoch boundary to time

    @property
    def num_steps_per_epoch(self) -> int:
        return -(-self.num_train // self.batch_size)

    @property
    def num_epochs(self) -> int:
        return WARMUP_EPOCHS + self.measured_epochs


# 64 steps an epoch: short rounds, so that more of them fit in a few minutes (on a shared
# machine, more rounds beat longer ones).
FULL = Sizes(
    num_train=4096, num_val=512, image_size=32, batch_size=64, num_workers=2, measured_epochs=2
)
SMOKE = Sizes(
    num_train=128, num_val=32, image_size=8, batch_size=16, num_workers=1, measured_epochs=2
)


def prepare(settings: Settings) -> tuple[Sizes, Path, Path]:
    """The sizes for this run, its work folder, and the images both benchmarks read."""
    sizes = SMOKE if settings.smoke else FULL
    work = settings.work_dir
    work.mkdir(parents=True)
    images = lazy.write_images(
        work / "images.npy", sizes.num_train + sizes.num_val, sizes.image_size
    )
    return sizes, work, images


def run(settings: Settings) -> list[Row]:
    sizes, work, images = prepare(settings)
    counter = itertools.count()

    def timed(name: str, loop: Any) -> Any:
        """A candidate: run `loop(times_path)` and return its epoch times."""

        def candidate() -> dict[str, float]:
            times = work / f"{name}-{next(counter)}.times"
            loop(times)
            return epoch_times(hooks.read_records(times), sizes.num_steps_per_epoch)

        return candidate

    def records(times: Path) -> dict[str, str]:
        return {hooks.TIMES_VAR: str(times), hooks.STEPS_VAR: str(sizes.num_steps_per_epoch)}

    def hpcdl_run(times: Path) -> None:
        run_dir = create_run(hpcdl_overrides(sizes, images), work / times.stem)
        run_in_process(run_dir, settings.log, records(times))

    def in_this_process(loop: Any) -> Any:
        def call(times: Path) -> None:
            with environ(records(times)):
                loop(sizes, images)

        return call

    rounds = interleaved(
        {
            "hpcdl": timed("hpcdl", hpcdl_run),
            "plain": timed("plain", in_this_process(plain_loop)),
            "hpcdl_data": timed("hpcdl-data", in_this_process(hpcdl_data_only)),
            "plain_data": timed("plain-data", in_this_process(plain_data_only)),
        },
        settings.repeats,
        settings.warmup_rounds,
    )
    return rows_from(rounds, sizes)


def hpcdl_overrides(sizes: Sizes, images: Path) -> list[str]:
    return [
        "model=custom",
        "model.target=benchmarks.lazy:SmallCnn",
        "data=custom",
        "data.target=benchmarks.lazy:build",
        f"data.kwargs.path='{images}'",
        f"data.kwargs.num_train={sizes.num_train}",
        f"data.kwargs.num_val={sizes.num_val}",
        f"data.num_workers={sizes.num_workers}",
        f"trainer.batch_size={sizes.batch_size}",
        f"trainer.max_epochs={sizes.num_epochs}",
        "trainer.step_hooks=[benchmarks.hooks:record_time]",
        "trainer.log_every_steps=1000000",  # no progress lines: the log is not read here
    ]


def plain_loader(sizes: Sizes, images: Path) -> Any:
    """DataLoader(shuffle=True) over the training rows; pin_memory only where there is an
    accelerator to pin for (elsewhere torch ignores it, with a warning)."""
    from torch.utils.data import DataLoader

    from hpcdl.dist import pick_device

    train, _ = lazy.build(str(images), sizes.num_train, sizes.num_val)
    return DataLoader(
        train,
        batch_size=sizes.batch_size,
        shuffle=True,
        num_workers=sizes.num_workers,
        pin_memory=pick_device("auto", 0).type == "cuda",
    )


def plain_loop(sizes: Sizes, images: Path) -> None:
    """The hand-written loop hpcdl's epoch is compared with."""
    import torch
    import torch.nn.functional as F

    from hpcdl.config.schema import SgdConfig
    from hpcdl.dist import pick_device

    device = pick_device("auto", 0)
    loader = plain_loader(sizes, images)
    torch.manual_seed(0)
    shape = (3, sizes.image_size, sizes.image_size)
    model = lazy.SmallCnn(shape, lazy.NUM_CLASSES).to(device)
    sgd = SgdConfig()
    optimizer = torch.optim.SGD(model.parameters(), lr=sgd.lr, momentum=sgd.momentum)
    global_step, loss_sum = 0, 0.0
    for epoch in range(sizes.num_epochs):
        for step_in_epoch, (x, y) in enumerate(loader, start=1):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item()
            global_step += 1
            hooks.write_record("step", global_step, epoch, step_in_epoch, 0)


def plain_data_only(sizes: Sizes, images: Path) -> None:
    """The plain loop's batches, read and moved to the device, no model."""
    from hpcdl.dist import pick_device

    device = pick_device("auto", 0)
    loader = plain_loader(sizes, images)
    global_step = 0
    for epoch in range(sizes.num_epochs):
        for step_in_epoch, (x, y) in enumerate(loader, start=1):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            global_step += 1
            hooks.write_record("step", global_step, epoch, step_in_epoch, 0)


def hpcdl_data_only(sizes: Sizes, images: Path) -> None:
    """hpcdl's training batches as its trainer gets them (data=custom's loader: per-epoch
    permutation, per-sample seeding, persistent workers), no model."""
    from hpcdl.config.schema import CustomDataConfig
    from hpcdl.data.loader import LoaderSettings, dataset_batches
    from hpcdl.data.sharding import EpochSharder
    from hpcdl.dist import pick_device

    device = pick_device("auto", 0)
    train, _ = lazy.build(str(images), sizes.num_train, sizes.num_val)
    sharder = EpochSharder(len(train), sizes.batch_size, rank=0, world_size=1, seed=0)
    loader_settings = LoaderSettings(
        num_workers=sizes.num_workers,
        prefetch_factor=CustomDataConfig.prefetch_factor,
        collate_fn=None,
        seed=0,
    )
    global_step = 0
    for epoch in range(sizes.num_epochs):
        for step, _batch, _count in dataset_batches(
            train, sharder, epoch, 0, device, loader_settings
        ):
            global_step += 1
            hooks.write_record("step", global_step, epoch, step + 1, 0)


def epoch_times(records: list[hooks.Record], num_steps_per_epoch: int) -> dict[str, float]:
    """Medians over the measured epochs of one run, in seconds:
    loop: first to last step of an epoch, scaled to the epoch's steps (no epoch boundary);
    period: last step of the previous epoch to the last step of this one (a whole epoch,
    its boundary included: hpcdl's validation, checkpoint and loader restart);
    boundary: last step of the previous epoch to the first of this one;
    step: one step inside an epoch."""
    by_epoch: dict[int, list[float]] = defaultdict(list)
    for record in records:
        if record.kind == "step":
            by_epoch[record.epoch].append(record.t)
    epochs = sorted(e for e in by_epoch if e >= WARMUP_EPOCHS)
    if len(epochs) < 2 or any(len(by_epoch[e]) != num_steps_per_epoch for e in epochs):
        counts = {e: len(ts) for e, ts in sorted(by_epoch.items())}
        raise RuntimeError(
            f"expected {num_steps_per_epoch} step records in each of >= 2 measured epochs, "
            f"got {counts}: did trainer.step_hooks run?"
        )
    scale = num_steps_per_epoch / (num_steps_per_epoch - 1)
    loops = [(by_epoch[e][-1] - by_epoch[e][0]) * scale for e in epochs]
    periods = [by_epoch[e][-1] - by_epoch[e - 1][-1] for e in epochs[1:]]
    boundaries = [by_epoch[e][0] - by_epoch[e - 1][-1] for e in epochs[1:]]
    steps = [b - a for e in epochs for a, b in itertools.pairwise(by_epoch[e])]
    return {
        "loop": statistics.median(loops),
        "period": statistics.median(periods),
        "boundary": statistics.median(boundaries),
        "step": statistics.median(steps),
    }


def compared(
    measured: list[dict[str, float]], baseline: list[dict[str, float]], key: str
) -> dict[str, Any]:
    """timing.compared over one of the epoch_times values."""
    return timing.compared([r[key] for r in measured], [r[key] for r in baseline])


def rows_from(rounds: dict[str, list[dict[str, float]]], sizes: Sizes) -> list[Row]:
    setup = {"sizes": asdict(sizes), "num_steps_per_epoch": sizes.num_steps_per_epoch}
    hpcdl, plain = rounds["hpcdl"], rounds["plain"]
    loop, period = compared(hpcdl, plain, "loop"), compared(hpcdl, plain, "period")
    data = compared(rounds["hpcdl_data"], rounds["plain_data"], "loop")
    return [
        Row(
            id="lazy_epoch.loop",
            what="hpcdl's training loop over one epoch of a lazily read dataset: first to "
            "last step, no epoch boundary (validation, checkpoint excluded)",
            baseline="plain DataLoader(shuffle=True) loop, same data, model, optimizer, "
            "batch size and workers, timed the same way",
            ratio=loop.pop("ratio"),
            goal=1.10,
            details={**loop, "step": compared(hpcdl, plain, "step"), **setup},
        ),
        Row(
            id="lazy_epoch.epoch_overhead",
            what="a whole hpcdl epoch, last step to last step: the loop plus the epoch end "
            "(validation pass, checkpoint, metrics row, loader restart)",
            baseline="a whole plain-loop epoch: its loop plus its loader restart (workers "
            "start again: not persistent)",
            ratio=period.pop("ratio"),
            goal=None,
            details={**period, "boundary": compared(hpcdl, plain, "boundary"), **setup},
        ),
        Row(
            id="lazy_epoch.data_only",
            what="one epoch of hpcdl's training batches, no model: its DataLoader as the "
            "trainer drives it (permutation, per-sample seeding, persistent workers)",
            baseline="one epoch of the plain DataLoader(shuffle=True), no model",
            ratio=data.pop("ratio"),
            goal=None,
            details={**data, **setup},
        ),
    ]
