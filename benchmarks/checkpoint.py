"""P5 checkpoints: CheckpointStore's save and load against bare torch.save / torch.load, and
how long a save holds up the training loop, written in the background or not.

The state is a ResNet-18's (hpcdl's CIFAR-style model, 11.2M parameters, 10 classes) after
one SGD step with momentum: the model's state_dict and the optimizer's, about 89 MB, as the
trainer saves them. The baselines are what a user writes by hand:

    torch.save(state, f); f.flush(); os.fsync(f.fileno())     # same folder, same state
    torch.load(path, weights_only=True)                       # that file

hpcdl's save adds the checksum, the header, the atomic rename with its directory fsync and
the purge; its load checks the checksum while torch.load parses.

The stall is timed from inside the trainer: a run of hpcdl's ResNet-18 on tiny synthetic
images (so that the optimizer step over 11.2M parameters is most of a step) saves every
SAVE_EVERY steps; benchmarks.hooks.record_time stamps every step. A save runs between one
step's hook and the next step, so the interval after a saving step holds the time the loop
was held up by it. One run with trainer.async_checkpoint=true, one with false, per round.
"""

from __future__ import annotations

import itertools
import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import hooks
from benchmarks.base import Row, Settings
from benchmarks.inprocess import create_run, run_in_process
from benchmarks.timing import compared, interleaved, summarize

# The first intervals of a run (first batches, allocator warm-up) are not normal steps.
WARMUP_STEPS = 3
# Intervals right after a saving step: with a background write they share the CPU with it
# (reported apart, in details, not counted as normal steps).
NUM_STEPS_AFTER_A_SAVE = 3
# A stall below this is timer noise; it is counted as this, so that a ratio stays defined.
MIN_STALL_S = 1e-3


@dataclass(frozen=True)
class Sizes:
    width: int  # ResNet-18's base width (64: the real one)
    io_rounds_per_round: int  # save/load pairs timed per round (each round one ratio)
    batch_size: int
    num_steps: int  # steps of a stall run (trainer.max_steps)
    save_every: int  # trainer.checkpoint_every_steps of a stall run
    image_size: int

    @property
    def num_samples(self) -> int:
        # 70% of the rows train (hpcdl's default 15% val, 15% test): room for num_steps.
        return -(-(self.num_steps + 1) * self.batch_size * 10 // 7)


FULL = Sizes(
    width=64, io_rounds_per_round=3, batch_size=16, num_steps=61, save_every=10, image_size=8
)
SMOKE = Sizes(
    width=4, io_rounds_per_round=1, batch_size=8, num_steps=16, save_every=8, image_size=8
)


# P5's "share of wall time at the default interval": hpcdl saves once an epoch by default;
# the reference epoch is CIFAR-10's 50,000 images at batch 128 (391 steps) of the stall
# run's own normal step. The goals: at most 2% of the time on a CPU, 1% on a GPU.
REFERENCE_EPOCH_STEPS = 391
SHARE_GOAL = {"cpu": 0.02, "cuda": 0.01}


def run(settings: Settings) -> list[Row]:
    sizes = SMOKE if settings.smoke else FULL
    work = settings.work_dir
    work.mkdir(parents=True)
    return [*save_and_load(sizes, settings, work), *stall(sizes, settings, work)]


# ----------------------------------------------------------------------------- save, load
def resnet18_parts(width: int) -> tuple[Any, Any]:
    """hpcdl's ResNet-18 and its default SGD with momentum."""
    import torch

    from hpcdl.config.schema import Resnet18Config, SgdConfig
    from hpcdl.models.resnet import build_resnet18

    model = build_resnet18(Resnet18Config(width=width), (3, 32, 32), 10)
    sgd = SgdConfig()
    return model, torch.optim.SGD(model.parameters(), lr=sgd.lr, momentum=sgd.momentum)


def resnet18_state(width: int) -> dict[str, Any]:
    """What the trainer saves of a ResNet-18 after one SGD step (momentum buffers exist)."""
    import torch

    torch.manual_seed(0)
    model, optimizer = resnet18_parts(width)
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    optimizer.step()
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "progress": {"global_step": 1, "epoch": 0},
    }


def save_and_load(sizes: Sizes, settings: Settings, work: Path) -> list[Row]:
    import time

    import torch

    from hpcdl.checkpoint import CheckpointStore, unmap

    state = resnet18_state(sizes.width)
    # What a resume loads into: on the GPU where there is one, as a training job's model.
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, optimizer = resnet18_parts(sizes.width)
    model.to(device)

    def synchronize() -> None:  # the copies to the GPU are queued: wait for them
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    store = CheckpointStore(work / "checkpoints", keep_last=1)
    plain = work / "plain.pt"
    steps = itertools.count(1)

    def timed(call: Any) -> Any:
        def candidate() -> float:
            started = time.perf_counter()
            call()
            return time.perf_counter() - started

        return candidate

    def torch_save() -> None:
        with open(plain, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())

    def load_latest() -> None:
        if store.load_latest() is None:
            raise RuntimeError(f"no checkpoint loaded from {store.directory}")

    def hpcdl_resume() -> None:  # as hpcdl's Trainer restores (hpcdl.trainer.restore)
        found = store.load_latest(mmap=True)
        if found is None:
            raise RuntimeError(f"no checkpoint loaded from {store.directory}")
        model.load_state_dict(found[1]["model"])
        optimizer.load_state_dict(found[1]["optimizer"])
        unmap(optimizer.state)
        synchronize()

    def torch_resume() -> None:
        loaded = torch.load(plain, weights_only=True)
        model.load_state_dict(loaded["model"])
        optimizer.load_state_dict(loaded["optimizer"])
        synchronize()

    rounds = interleaved(
        {
            "hpcdl_save": timed(lambda: store.save(state, next(steps))),
            "torch_save": timed(torch_save),
            "hpcdl_load": timed(load_latest),
            "torch_load": timed(lambda: torch.load(plain, weights_only=True)),
            "hpcdl_resume": timed(hpcdl_resume),
            "torch_resume": timed(torch_resume),
        },
        settings.repeats * sizes.io_rounds_per_round,
        settings.warmup_rounds,
    )
    payload = {
        "state_bytes": sum(t.nbytes for t in tensors(state)),
        "file_bytes": store.list_steps()[-1][1].stat().st_size,
        "torch_file_bytes": plain.stat().st_size,
        "sizes": asdict(sizes),
        "file_system": str(work),
    }
    save = compared(rounds["hpcdl_save"], rounds["torch_save"])
    load = compared(rounds["hpcdl_load"], rounds["torch_load"])
    resume = compared(rounds["hpcdl_resume"], rounds["torch_resume"])
    return [
        Row(
            id="checkpoint.save",
            what="CheckpointStore.save of a ResNet-18 state with SGD momentum: checksum while "
            "torch.save streams to a temporary file, trailer, fsync, rename, directory fsync, "
            "purge",
            baseline="torch.save of the same state to a file in the same folder, flush, fsync",
            ratio=save.pop("ratio"),
            goal=1.2,
            details={**save, **payload},
        ),
        Row(
            id="checkpoint.load_latest",
            what="CheckpointStore.load_latest of that checkpoint: trailer, the checksum over "
            "the mapped file's pieces (up to 4 threads), then torch.load (weights_only) of it",
            baseline="torch.load(weights_only=True) of the bare torch.save file",
            ratio=load.pop("ratio"),
            goal=1.5,
            details={**load, **payload},
        ),
        Row(
            id="checkpoint.resume",
            what="a resume as hpcdl's trainer does it: CheckpointStore.load_latest(mmap=True) "
            "(trailer, checksum, torch.load mapping the tensors), the model's and optimizer's "
            "load_state_dict (model on the GPU where there is one), the optimizer's state "
            "copied out of the mapping",
            baseline="torch.load(weights_only=True) of the bare file, the same two "
            "load_state_dict calls (the issue adds one training step to both; left out, "
            "which can only raise the ratio)",
            ratio=resume.pop("ratio"),
            goal=1.5,
            details={**resume, **payload, "device": device.type},
        ),
    ]


def tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors(v)]
    return []


# ----------------------------------------------------------------------------- stall
def stall_overrides(sizes: Sizes, async_checkpoint: bool) -> list[str]:
    return [
        "model=resnet18",
        f"model.width={sizes.width}",
        "data=synthetic",
        f"data.shape=[3,{sizes.image_size},{sizes.image_size}]",
        "data.num_classes=10",
        f"data.num_samples={sizes.num_samples}",
        "optim=sgd",
        f"trainer.batch_size={sizes.batch_size}",
        "trainer.max_epochs=1",
        f"trainer.max_steps={sizes.num_steps}",
        f"trainer.checkpoint_every_steps={sizes.save_every}",
        f"trainer.async_checkpoint={str(async_checkpoint).lower()}",
        "trainer.step_hooks=[benchmarks.hooks:record_time]",
        "trainer.log_every_steps=1000000",
    ]


def stall(sizes: Sizes, settings: Settings, work: Path) -> list[Row]:
    import torch

    counter = itertools.count()

    def stall_run(async_checkpoint: bool) -> Any:
        def candidate() -> dict[str, float]:
            index = next(counter)
            times = work / f"stall-{index}.times"
            run_dir = create_run(stall_overrides(sizes, async_checkpoint), work / f"run-{index}")
            run_in_process(run_dir, settings.log, {hooks.TIMES_VAR: str(times)})
            return step_intervals(hooks.read_records(times), sizes)

        return candidate

    rounds = interleaved(
        {"async": stall_run(True), "sync": stall_run(False)},
        settings.repeats,
        settings.warmup_rounds,
    )
    in_background, in_loop = rounds["async"], rounds["sync"]
    result = compared([r["stall"] for r in in_background], [r["stall"] for r in in_loop])
    # trainer.async_checkpoint=auto: in the background on CUDA, in the loop otherwise.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    default = in_background if device == "cuda" else in_loop
    shares = [r["stall"] / (REFERENCE_EPOCH_STEPS * r["normal_step"] + r["stall"]) for r in default]
    share = Row(
        id="checkpoint.share",
        what="the share of training time a save takes at the default interval (one save an "
        f"epoch; async_checkpoint=auto: {'in the background' if device == 'cuda' else 'in the loop'} "
        f"on this {device}): the stall of one save",
        baseline=f"an epoch of {REFERENCE_EPOCH_STEPS} of the stall run's normal steps "
        "(CIFAR-10 at batch 128) plus that stall",
        ratio=statistics.median(shares),
        goal=SHARE_GOAL[device],
        details={
            "measured_s": summarize([r["stall"] for r in default]).as_dict(),
            "baseline_s": summarize(
                [REFERENCE_EPOCH_STEPS * r["normal_step"] + r["stall"] for r in default]
            ).as_dict(),
            "shares": summarize(shares).as_dict(),
            "reference_epoch_steps": REFERENCE_EPOCH_STEPS,
            "async_checkpoint": device == "cuda",
            "device": device,
        },
    )
    return [
        Row(
            id="checkpoint.stall",
            what="training held up by a save with trainer.async_checkpoint=true (host copy, then "
            "a background write): the interval after a saving step minus a normal step's, median",
            baseline="the same with the save written in the loop (async_checkpoint=false)",
            ratio=result.pop("ratio"),
            goal=None,
            details={
                **result,
                **{
                    f"{key}_s": {
                        "async": summarize([r[key] for r in in_background]).as_dict(),
                        "sync": summarize([r[key] for r in in_loop]).as_dict(),
                    }
                    for key in ("saving_step", "normal_step", "after_save")
                },
                "min_stall_s": MIN_STALL_S,
                "sizes": asdict(sizes),
                "overrides": stall_overrides(sizes, True),
            },
        ),
        share,
    ]


def step_intervals(records: list[hooks.Record], sizes: Sizes) -> dict[str, float]:
    """Medians of one run, in seconds: saving_step (the interval after a step that saved),
    after_save (the next NUM_STEPS_AFTER_A_SAVE intervals), normal_step (the rest), and
    stall = saving_step - normal_step (at least MIN_STALL_S)."""
    times = {r.global_step: r.t for r in records if r.kind == "step"}
    if sorted(times) != list(range(1, sizes.num_steps + 1)):
        raise RuntimeError(
            f"expected step records 1..{sizes.num_steps}, got {sorted(times)}: did "
            "trainer.step_hooks run?"
        )
    # The interval after step s ends at step s + 1; the last step's save is the run's end.
    intervals = {s: times[s + 1] - times[s] for s in range(1, sizes.num_steps)}
    saving = [s for s in intervals if s % sizes.save_every == 0]
    after = [s + k for s in saving for k in range(1, NUM_STEPS_AFTER_A_SAVE + 1)]
    normal = [s for s in intervals if s > WARMUP_STEPS and s not in saving and s not in after]
    if not saving or not normal:
        raise RuntimeError(f"no saving or normal steps among {sorted(intervals)}: sizes {sizes}")
    median = {
        name: statistics.median(intervals[s] for s in steps if s in intervals)
        for name, steps in (("saving_step", saving), ("after_save", after), ("normal_step", normal))
    }
    median["stall"] = max(MIN_STALL_S, median["saving_step"] - median["normal_step"])
    return median
