"""L2 resumed first step: the first optimizer step after a resume mid-epoch, against a
normal step, the first step of a new epoch, and the first step of a new run.

A resume must start with exactly the next batch without reading the consumed ones; a
loader that replayed (or skipped through) them would make this first step cost about as
many batch reads as the epoch had consumed. Each round trains a fresh run on the lazily
read dataset of L1 (benchmarks.lazy), stops it with SIGTERM from a step hook three
quarters into its second epoch, then resumes it in place: two in-process calls of hpcdl's
job payload on one run dir, as a requeued job does.

A first step is timed from the moment the trainer asks for the epoch's batches (after the
restore, for a resumed run) to the end of that step: it includes building the DataLoader
and starting its workers when the process has none yet, and reading the first batch.
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import asdict
from typing import TYPE_CHECKING

from benchmarks import hooks
from benchmarks.base import Row, Settings
from benchmarks.inprocess import create_run, run_in_process
from benchmarks.lazy_epoch import Sizes, hpcdl_overrides, prepare
from benchmarks.timing import interleaved, median_ratio, paired_ratios, summarize

if TYPE_CHECKING:
    from hpcdl.rundir import RunDir

HOOKS = "trainer.step_hooks=[benchmarks.hooks:record_time,benchmarks.hooks:stop_after_step]"


def stop_step(sizes: Sizes) -> int:
    """The global step after which the hook sends SIGTERM: 3/4 into the second epoch. The
    trainer sees the flag at the next step's boundary and saves there."""
    return sizes.num_steps_per_epoch + (3 * sizes.num_steps_per_epoch) // 4


def run(settings: Settings) -> list[Row]:
    sizes, work, images = prepare(settings)
    # L1's data, model and sizes; a run's second epoch is its last (max_epochs=2).
    overrides = [*hpcdl_overrides(sizes, images), "trainer.max_epochs=2", HOOKS]
    counter = itertools.count()
    interrupted: list[tuple[int, RunDir]] = []  # the new run, for the resume that follows

    def new_run() -> dict[str, float]:
        index = next(counter)
        run_dir = create_run(overrides, work / f"run-{index}")
        times = work / f"new-{index}.times"
        env = {hooks.TIMES_VAR: str(times), hooks.STOP_VAR: str(stop_step(sizes))}
        called = time.perf_counter()
        with hooks.loop_starts():
            outcome = run_in_process(run_dir, settings.log, env)
        if outcome.completed:
            raise RuntimeError(f"{run_dir.path}: not interrupted after step {stop_step(sizes)}")
        interrupted.append((index, run_dir))
        return new_run_times(hooks.read_records(times), called)

    def resumed_run() -> dict[str, float]:
        index, run_dir = interrupted.pop()
        times = work / f"resumed-{index}.times"
        called = time.perf_counter()
        with hooks.loop_starts():
            outcome = run_in_process(run_dir, settings.log, {hooks.TIMES_VAR: str(times)})
        if not outcome.completed:
            raise RuntimeError(f"{run_dir.path}: the resumed run did not complete")
        return resumed_run_times(hooks.read_records(times), called, sizes)

    rounds = interleaved(
        {"new": new_run, "resumed": resumed_run}, settings.repeats, settings.warmup_rounds
    )
    return rows_from(rounds["new"], rounds["resumed"], sizes)


def _first_step_after(records: list[hooks.Record], start: hooks.Record) -> hooks.Record:
    return next(r for r in records if r.kind == "step" and r.t > start.t)


def new_run_times(records: list[hooks.Record], called: float) -> dict[str, float]:
    """A fresh run: its first step (epoch 0: DataLoader built, workers started), the first
    step of epoch 1 (persistent workers: already there), and a normal step (the median
    interval between consecutive steps of epoch 1)."""
    starts = [r for r in records if r.kind == "start"]
    if len(starts) < 2:
        raise RuntimeError(
            f"{len(starts)} loop-start records: did hooks.loop_starts wrap Trainer.batches?"
        )
    first = _first_step_after(records, starts[0])
    epoch_1 = [r.t for r in records if r.kind == "step" and r.epoch == 1]
    return {
        "run_first_step": first.t - starts[0].t,
        "epoch_first_step": _first_step_after(records, starts[1]).t - starts[1].t,
        "step": statistics.median(b - a for a, b in itertools.pairwise(epoch_1)),
        "time_to_first_step": first.t - called,
    }


def resumed_run_times(records: list[hooks.Record], called: float, sizes: Sizes) -> dict[str, float]:
    starts = [r for r in records if r.kind == "start"]
    if not starts:
        raise RuntimeError("no loop-start record: did hooks.loop_starts wrap Trainer.batches?")
    first = _first_step_after(records, starts[0])
    # The stop hook fires after stop_step; the trainer stops (and saves) at a step boundary
    # after it, so the resumed run starts later in the same epoch.
    if first.global_step <= stop_step(sizes) or first.step_in_epoch <= 1:
        raise RuntimeError(
            f"the resumed run's first step is global step {first.global_step} (step "
            f"{first.step_in_epoch} of epoch {first.epoch}): not mid-epoch after step "
            f"{stop_step(sizes)}"
        )
    return {
        "first_step": first.t - starts[0].t,
        "time_to_first_step": first.t - called,
        "step_in_epoch": float(first.step_in_epoch),
    }


def rows_from(
    new_rounds: list[dict[str, float]], resumed_rounds: list[dict[str, float]], sizes: Sizes
) -> list[Row]:
    resumed = [r["first_step"] for r in resumed_rounds]
    consumed = int(resumed_rounds[0]["step_in_epoch"]) - 1
    setup = {
        "sizes": {k: v for k, v in asdict(sizes).items() if k != "measured_epochs"},
        "num_steps_per_epoch": sizes.num_steps_per_epoch,
        "resumed_at_step_in_epoch": consumed + 1,
        "batches_consumed_before_resume": consumed,
    }

    def row(id_: str, key: str, baseline: str, goal: float | None, **extra: object) -> Row:
        theirs = [r[key] for r in new_rounds]
        return Row(
            id=id_,
            what="the first optimizer step after resuming mid-epoch, from the trainer asking "
            "for batches (after the restore) to the end of the step",
            baseline=baseline,
            ratio=median_ratio(resumed, theirs),
            goal=goal,
            details={
                "measured_s": summarize(resumed).as_dict(),
                "baseline_s": summarize(theirs).as_dict(),
                "round_ratios": [round(r, 4) for r in paired_ratios(resumed, theirs)],
                **extra,
                **setup,
            },
        )

    to_first = [r["time_to_first_step"] for r in resumed_rounds]
    new_to_first = [r["time_to_first_step"] for r in new_rounds]
    return [
        row(
            "resumed_step.vs_step",
            "step",
            "a normal step: median interval between consecutive steps inside an epoch",
            1.5,
        ),
        row(
            "resumed_step.vs_new_epoch",
            "epoch_first_step",
            "the first step of a new epoch in a running job (persistent workers: none to "
            "start), timed the same way",
            None,
        ),
        row(
            "resumed_step.vs_new_run",
            "run_first_step",
            "the first step of a new run (epoch 0: DataLoader built, workers started, as "
            "after a resume), timed the same way",
            None,
            time_to_first_step_s={
                "resumed": summarize(to_first).as_dict(),
                "new_run": summarize(new_to_first).as_dict(),
                "note": "from the call of hpcdl.job.run_job: build, restore, loader, step",
            },
        ),
    ]
