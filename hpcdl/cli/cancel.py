"""`hpcdl cancel RUN_DIR|JOB_ID|SWEEP_DIR`. A run or job: hpcdl.launch.monitor.cancel. A
Slurm sweep: every trial that is queued or running, with one scancel (each running trial
saves a checkpoint and records its stop, as a cancelled run does; `hpcdl sweep rerun
--failed` or `hpcdl resume SWEEP_DIR/N` continues it). Never imports torch.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from hpcdl.errors import HpcdlError, plural
from hpcdl.exit_codes import EXIT_OK
from hpcdl.number_ranges import number_ranges


def cmd_cancel(args: argparse.Namespace) -> int:
    from hpcdl.launch.monitor import cancel
    from hpcdl.rundir import SweepDir

    path = Path(args.ref).expanduser()
    if path.is_dir() and SweepDir(path).ledger_file.is_file():
        return cancel_sweep(path.resolve())
    return cancel(args.ref)


def cancel_sweep(sweep_dir: Path) -> int:
    from hpcdl.launch.monitor import sweep_dir_hint, unanswered
    from hpcdl.launch.slurm_state import is_active
    from hpcdl.rundir import RunDir
    from hpcdl.sweep.ledger import load
    from hpcdl.sweep.report import refresh_states
    from hpcdl.sweep.states import queued_now

    if load(sweep_dir).launcher != "slurm":  # its pool runs in the foreground
        raise HpcdlError(sweep_dir_hint(sweep_dir, "cancel"))
    ledger, _, silent = refresh_states(sweep_dir)
    if silent is not None:
        raise HpcdlError(f"{sweep_dir}: {unanswered(silent, 'nothing was cancelled')}")
    busy = [t for t in ledger.trials if is_active(t.state)]
    if not busy:
        print(f"{sweep_dir}: no trial is queued or running; nothing to cancel")
        return EXIT_OK
    jobs = []
    for trial in busy:  # a chained trial's current job is in its run dir
        current = RunDir(Path(trial.run_dir)).read_submission() or {}
        jobs.append(str(current.get("job_id") or trial.job_id))
    queue = queued_now(jobs)  # right before scancel: the states above are the refresh's
    if queue is not None:  # a trial that completed meanwhile is not named as cancelled
        pairs = [(t, j) for t, j in zip(busy, jobs, strict=True) if is_active(queue.get(j, ""))]
        busy, jobs = [t for t, _ in pairs], [j for _, j in pairs]
    if not busy:
        print(f"{sweep_dir}: no trial is queued or running; nothing to cancel")
        return EXIT_OK
    try:
        out = subprocess.run(["scancel", *jobs], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise HpcdlError(f"scancel {' '.join(jobs)} failed: {err}; nothing was cancelled") from None
    if out.returncode != 0:
        said = out.stderr.strip().splitlines() or [f"exit status {out.returncode}"]
        raise HpcdlError(f"scancel {' '.join(jobs)} failed: {said[-1]}")
    print(
        f"cancelled {plural(len(busy), 'trial')} of {sweep_dir}: "
        f"{number_ranges([t.index for t in busy])} (jobs {job_ranges(jobs)}); `hpcdl sweep "
        f"rerun {sweep_dir} --failed` continues them"
    )
    return EXIT_OK


def job_ranges(jobs: list[str]) -> str:
    """Array tasks as Slurm writes them ('28_[1-999], 30_[0-2]'), other job ids as they are."""
    tasks: dict[str, list[int]] = {}
    words: list[str] = []
    for job in jobs:
        array, _, task = job.partition("_")
        if task.isdigit():
            if array not in tasks:
                tasks[array] = []
                words.append(array)
            tasks[array].append(int(task))
        else:
            words.append(job)
    return ", ".join(
        (f"{w}_{tasks[w][0]}" if len(tasks[w]) == 1 else f"{w}_[{number_ranges(tasks[w], ',')}]")
        if w in tasks
        else w
        for w in words
    )
