"""L2 resumed first step: the first optimizer step after a resume mid-epoch, against a
normal step, the first step of a new epoch, the first step of a new run, and the first step
of a plain script resumed the same way.

A resume must start with exactly the next batch without reading the consumed ones; a
loader that replayed (or skipped through) them would make this first step cost about as
many batch reads as the epoch had consumed. Each round trains a fresh run on the lazily
read dataset of L1 (benchmarks.lazy), stops it with SIGTERM from a step hook three
quarters into its second epoch, then resumes it in place. Each is a fresh process running
hpcdl's job payload (benchmarks.job_process), as a requeued job is: a process's first step
pays for memory it touches for the first time (page faults: about 7,500 of them for this
model's first step here, none in the next ones), which a process that had trained before
would not, and which forking the loader's workers after an earlier run in the same process
would turn into copy-on-write faults.

A first step is timed from the moment the trainer asks for the epoch's batches (after the
restore, for a resumed run) to the end of that step: it includes building the DataLoader
and starting its workers when the process has none yet, and reading the first batch. The
plain script (benchmarks.plain_resume) is timed from the moment it starts iterating its
DataLoader (after torch.load and load_state_dict) to the end of its first step.
"""

from __future__ import annotations

import itertools
import os
import statistics
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import benchmarks
from benchmarks import hooks
from benchmarks.base import Row, Settings
from benchmarks.inprocess import RANK_VARIABLES, create_run
from benchmarks.job_process import THREADS_VAR
from benchmarks.lazy_epoch import SMOKE, Sizes, hpcdl_overrides, prepare
from benchmarks.timing import interleaved, median_ratio, paired_ratios, summarize

if TYPE_CHECKING:
    from hpcdl.rundir import RunDir

HOOKS = "trainer.step_hooks=[benchmarks.hooks:record_time,benchmarks.hooks:stop_after_step]"
# The plain script's steps: its first, then enough for a normal step's median.
PLAIN_STEPS = 16
PLAIN_WARMUP_STEPS = 4  # intervals after the first steps (allocator, caches) are normal


def stop_step(sizes: Sizes) -> int:
    """The global step after which the hook sends SIGTERM: 3/4 into the second epoch. The
    trainer sees the flag at the next step's boundary and saves there."""
    return sizes.num_steps_per_epoch + (3 * sizes.num_steps_per_epoch) // 4


def fresh_process(module: str, args: list[str], env: dict[str, str], settings: Settings) -> int:
    """`python -m module args` in a new process (the rank variables of an enclosing job
    removed, torch's threads as in this one); its output goes to the suite's log."""
    import torch

    child_env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    root = str(Path(benchmarks.__file__).resolve().parent.parent)
    path = child_env.get("PYTHONPATH")
    child_env.update(
        env,
        PYTHONPATH=root if not path else f"{root}{os.pathsep}{path}",
        **{THREADS_VAR: str(torch.get_num_threads())},
    )
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    settings.log.write(done.stdout)
    return done.returncode


def run(settings: Settings) -> list[Row]:
    sizes, work, images = prepare(settings)
    # L1's data, model and sizes; a run's second epoch is its last (max_epochs=2).
    overrides = [*hpcdl_overrides(sizes, images), "trainer.max_epochs=2", HOOKS]
    counter = itertools.count()
    interrupted: list[tuple[int, RunDir]] = []  # the new run, for the resume that follows
    smoke = ["--smoke"] if sizes == SMOKE else []
    state = work / "plain-state.pt"
    if fresh_process(
        "benchmarks.plain_resume", [str(images), str(state), "1", *smoke, "--save"], {}, settings
    ):
        raise RuntimeError("benchmarks.plain_resume --save failed: see the log")

    def job(run_dir: RunDir, times: Path, env: dict[str, str], expected: int) -> list[hooks.Record]:
        env = {hooks.TIMES_VAR: str(times), **env}
        status = fresh_process("benchmarks.job_process", [str(run_dir.path)], env, settings)
        if status != expected:
            what = {0: "complete", 3: "be interrupted"}[expected]
            raise RuntimeError(f"{run_dir.path}: exit status {status}: did not {what}")
        return hooks.read_records(times)

    def new_run() -> dict[str, float]:
        index = next(counter)
        run_dir = create_run(overrides, work / f"run-{index}")
        env = {hooks.STOP_VAR: str(stop_step(sizes))}
        records = job(run_dir, work / f"new-{index}.times", env, expected=3)
        interrupted.append((index, run_dir))
        return new_run_times(records)

    def resumed_run() -> dict[str, float]:
        index, run_dir = interrupted.pop()
        records = job(run_dir, work / f"resumed-{index}.times", {}, expected=0)
        return resumed_run_times(records, sizes)

    def plain_resume() -> dict[str, float]:
        times = work / f"plain-{next(counter)}.times"
        steps = min(PLAIN_STEPS, sizes.num_steps_per_epoch)
        args = [str(images), str(state), str(steps), *smoke]
        if fresh_process("benchmarks.plain_resume", args, {hooks.TIMES_VAR: str(times)}, settings):
            raise RuntimeError("benchmarks.plain_resume failed: see the log")
        return plain_times(hooks.read_records(times))

    rounds = interleaved(
        {"new": new_run, "resumed": resumed_run, "plain": plain_resume},
        settings.repeats,
        settings.warmup_rounds,
    )
    return rows_from(rounds["new"], rounds["resumed"], sizes, rounds["plain"])


def _called(records: list[hooks.Record]) -> hooks.Record:
    called = [r for r in records if r.kind == "called"]
    if not called:
        raise RuntimeError("no `called` record: was the process started by fresh_process?")
    return called[0]


def _first_step_after(records: list[hooks.Record], start: hooks.Record) -> hooks.Record:
    return next(r for r in records if r.kind == "step" and r.t > start.t)


def new_run_times(records: list[hooks.Record]) -> dict[str, float]:
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
        "time_to_first_step": first.t - _called(records).t,
    }


def resumed_run_times(records: list[hooks.Record], sizes: Sizes) -> dict[str, float]:
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
        "time_to_first_step": first.t - _called(records).t,
        "step_in_epoch": float(first.step_in_epoch),
    }


def plain_times(records: list[hooks.Record]) -> dict[str, float]:
    """The plain script's first step (from iterating its loader), its normal step (the
    median interval after the first few), and the time from its start to its first step."""
    start = next(r for r in records if r.kind == "start")
    steps = [r.t for r in records if r.kind == "step"]
    if len(steps) < 2:
        raise RuntimeError(f"the plain script recorded {len(steps)} steps; 2 or more needed")
    intervals = [b - a for a, b in itertools.pairwise(steps)]
    return {
        "first_step": steps[0] - start.t,
        "step": statistics.median(intervals[PLAIN_WARMUP_STEPS - 1 :] or intervals),
        "time_to_first_step": steps[0] - _called(records).t,
    }


def rows_from(
    new_rounds: list[dict[str, float]],
    resumed_rounds: list[dict[str, float]],
    sizes: Sizes,
    plain_rounds: list[dict[str, float]],
) -> list[Row]:
    resumed = [r["first_step"] for r in resumed_rounds]
    consumed = int(resumed_rounds[0]["step_in_epoch"]) - 1
    setup = {
        "sizes": {k: v for k, v in asdict(sizes).items() if k != "measured_epochs"},
        "num_steps_per_epoch": sizes.num_steps_per_epoch,
        "resumed_at_step_in_epoch": consumed + 1,
        "batches_consumed_before_resume": consumed,
    }

    def row(
        id_: str,
        key: str,
        baseline: str,
        goal: float | None,
        rounds: list[dict[str, float]] = new_rounds,
        **extra: object,
    ) -> Row:
        theirs = [r[key] for r in rounds]
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
                "note": "from the start of the process: imports, build, restore, loader, step",
            },
        ),
        row(
            "resumed_step.vs_plain_resume",
            "first_step",
            "a plain script's first step after the same resume in a fresh process "
            "(torch.load, load_state_dict, DataLoader(shuffle=True, the same workers)), from "
            "iterating its loader to the end of the step",
            None,
            plain_rounds,
            # What any process pays for its first step, hpcdl or not: the plain script's
            # first step / its own normal step.
            plain_first_over_step=median_ratio(
                [r["first_step"] for r in plain_rounds], [r["step"] for r in plain_rounds]
            ),
            plain_step_s=summarize([r["step"] for r in plain_rounds]).as_dict(),
            time_to_first_step_s={
                "resumed": summarize(to_first).as_dict(),
                "plain": summarize([r["time_to_first_step"] for r in plain_rounds]).as_dict(),
                "note": "from the start of the process",
            },
        ),
    ]
