"""What each of hpcdl's speed options is worth: hpcdl with the option / hpcdl without it.

One row per (case, option): the same hpcdl run (benchmarks.overhead's cases, its step-time
hook, epoch 0 not counted) with one override changed, the two settings interleaved round
by round. A ratio under 1 means the option makes the loop faster on this machine; over 1,
slower (on a CPU several of them are: they are meant for GPUs, and the table says so).

    lagged_sync     trainer.lagged_sync=true / false (both optim.fused=true): no host sync
                    a step (docs/performance.md, "Lagged sync")
    fused           optim.fused=true / false (trainer.lagged_sync=false): one kernel a step
    resident        data.in_memory=true / false: rows on the device vs hpcdl's DataLoader
    bf16            trainer.precision=bf16 / fp32
    channels_last   trainer.channels_last=true / false (the CNN)
    compile         trainer.compile=true / false (not with --smoke: compiling takes long)

The async checkpoint's worth is P5's `checkpoint.stall` row.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import asdict, dataclass

from benchmarks import hooks
from benchmarks.base import Row, Settings
from benchmarks.inprocess import create_run, run_in_process
from benchmarks.lazy_epoch import compared, epoch_times
from benchmarks.overhead import FULL, SMOKE, Case, overrides_for
from benchmarks.timing import interleaved


@dataclass(frozen=True)
class Option:
    name: str
    on: tuple[str, ...]
    off: tuple[str, ...]
    what: str
    cases: tuple[str, ...] = ("mlp", "cnn")
    smoke: bool = True  # runs in --smoke too


OPTIONS = (
    Option(
        "lagged_sync",
        ("optim.fused=true", "trainer.lagged_sync=true"),
        ("optim.fused=true", "trainer.lagged_sync=false"),
        "the loss and flags read one step late, the non-finite skip on the device",
    ),
    Option(
        "fused",
        ("optim.fused=true", "trainer.lagged_sync=false"),
        ("optim.fused=false", "trainer.lagged_sync=false"),
        "torch's fused optimizer step",
    ),
    Option(
        "resident",
        ("data.in_memory=true",),
        ("data.in_memory=false",),
        "the training rows resident on the device, each batch an index (vs hpcdl's "
        "DataLoader with its workers)",
    ),
    Option("bf16", ("trainer.precision=bf16",), ("trainer.precision=fp32",), "bf16 autocast"),
    Option(
        "channels_last",
        ("trainer.channels_last=true",),
        ("trainer.channels_last=false",),
        "channels_last memory format for the model and its inputs",
        cases=("cnn",),
    ),
    Option(
        "compile",
        ("trainer.compile=true",),
        ("trainer.compile=false",),
        "torch.compile of the model (compilation in the warm-up epoch, not counted)",
        smoke=False,
    ),
)


def run(settings: Settings) -> list[Row]:
    settings.work_dir.mkdir(parents=True)
    rows: list[Row] = []
    for case in SMOKE if settings.smoke else FULL:
        for option in OPTIONS:
            if case.name in option.cases and (option.smoke or not settings.smoke):
                rows.append(measure(case, option, settings))
    return rows


def measure(case: Case, option: Option, settings: Settings) -> Row:
    counter = itertools.count()
    # Steps per epoch, from the first run's summary: from then on (the warm-up round is the
    # first) an epoch's last step is timed once the GPU has run it (benchmarks.hooks).
    known: dict[str, str] = {}

    def hpcdl_with(overrides: tuple[str, ...]) -> Callable[[], dict[str, float]]:
        def call() -> dict[str, float]:
            index = next(counter)
            times = settings.work_dir / f"{case.name}-{option.name}-{index}.times"
            run_dir = create_run(
                [*overrides_for(case), *overrides],
                settings.work_dir / f"{case.name}-{option.name}-{index}",
            )
            run_in_process(run_dir, settings.log, {hooks.TIMES_VAR: str(times), **known})
            steps = run_dir.read_summary() or {}
            per_epoch = int(steps.get("steps", 0)) // case.epochs
            known[hooks.STEPS_VAR] = str(per_epoch)
            return epoch_times(hooks.read_records(times), per_epoch)

        return call

    rounds = interleaved(
        {"on": hpcdl_with(option.on), "off": hpcdl_with(option.off)},
        settings.repeats,
        settings.warmup_rounds,
    )
    loop = compared(rounds["on"], rounds["off"], "loop")
    return Row(
        id=f"options.{case.name}.{option.name}",
        what=f"hpcdl's training loop over one epoch ({' '.join(case.overrides)}) with "
        f"{' '.join(option.on)}: {option.what}",
        baseline=f"the same with {' '.join(option.off)}",
        ratio=loop.pop("ratio"),
        goal=None,
        details={
            **loop,
            "step": compared(rounds["on"], rounds["off"], "step"),
            "case": asdict(case),
        },
    )
