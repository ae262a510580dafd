"""Inside a Slurm job: record the attempt, run the payload, requeue after a warning signal.

Used by submitit (the pickled callable is `main`) and by slurm/train.sbatch
(`srun python -m hpcdl.launch.slurm_job RUN_DIR`). Resume always comes from the run dir on
disk: an outside `scontrol requeue` kills the job without any handler running, and the
requeued job restarts this same callable.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from hpcdl.config.schema import Requeue
from hpcdl.env import RankEnv, rank_env_from, slurm_job_ref
from hpcdl.exit_codes import EXIT_BAD_INPUT, EXIT_INTERRUPTED
from hpcdl.launch.diagnose import error_line
from hpcdl.requeue import requeue

if TYPE_CHECKING:
    from hpcdl.config.schema import Config
    from hpcdl.rundir import RunDir

# A warning signal with at most signal_delay_s + this many seconds left before the time
# limit is the time-limit warning; with more left it is a preemption. sbatch(1): "the
# signal may be sent up to 60 seconds earlier than specified", hence the slack.
TIMEOUT_SLACK_S = 90
# A SIGTERM with at most this many seconds left is Slurm ending the job at its time limit
# (it kills at the limit or, checking periodically, after it: the dev cluster's came 24 s
# past a 1-minute limit); the slack is for the node's clock against the controller's.
TERM_AT_LIMIT_S = 10


def _now() -> str:
    return dt.datetime.now().isoformat(timespec="seconds")


def _gpu_name() -> str | None:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def start_record(env: RankEnv, world_size: int) -> dict[str, Any]:
    """world_size: the training processes (under torchrun, its workers, not the Slurm
    tasks)."""
    import hpcdl
    from hpcdl.launch.snapshot import code_revision
    from hpcdl.provenance import collect_versions

    return {
        "event": "start",
        "job_id": env.job_id,
        "array_job": os.environ.get("SLURM_ARRAY_JOB_ID"),
        "array_task": os.environ.get("SLURM_ARRAY_TASK_ID"),
        "restart_count": env.restart_count,
        "nodes": os.environ.get("SLURM_JOB_NODELIST", socket.gethostname()),
        "world_size": world_size,
        "start": _now(),
        "git_revision": code_revision(Path(hpcdl.__file__).resolve().parent),
        "versions": collect_versions(),
        "gpu": _gpu_name(),
    }


def seconds_left(job_id: str) -> float | None:
    """Seconds until the job's time limit (start + limit, from squeue); None when unknown.

    Not squeue's EndTime: on preemption Slurm moves EndTime to now + GraceTime, which would
    make every preemption look like a time limit.
    """
    from hpcdl.launch.preflight import slurm_minutes

    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", slurm_job_ref(os.environ, job_id), "-o", "%S|%l"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        start, _, limit = out.partition("|")
        minutes = slurm_minutes(limit)
        if minutes is None:
            return None
        end = dt.datetime.fromisoformat(start) + dt.timedelta(minutes=minutes)
        return (end - dt.datetime.now()).total_seconds()
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def restarts_now(job_id: str) -> int | None:
    """Slurm's count of the job's restarts as it stands now (`scontrol show job`); None when
    unknown. While an outside `scontrol requeue` is ending the job, it is already one more
    than the SLURM_RESTART_COUNT the job started with (measured on Slurm 22.05); after a
    scancel it is unchanged."""
    try:
        out = subprocess.run(
            ["scontrol", "-o", "show", "job", slurm_job_ref(os.environ, job_id)],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"\bRestarts=(\d+)", out)
    return int(found.group(1)) if found else None


def classify(
    signal_name: str | None,
    warning: str,
    job_id: str,
    signal_delay_s: int,
    started_restarts: int = 0,
    limit_left_s: float | None = None,
) -> str:
    """Why the job stopped. started_restarts: SLURM_RESTART_COUNT when the job started;
    limit_left_s: the seconds to the time limit by the job's own clock (the attempt's start
    plus cluster.timeout_min), for where squeue cannot say (a container without Slurm's
    commands): without it every time-limit warning there was a preemption, requeued
    whatever cluster.max_requeues said, for ever."""
    if signal_name is None:
        return "requested"  # `hpcdl run`: the program exited with EXIT_INTERRUPTED itself
    if signal_name != warning:
        # SIGTERM/SIGINT: scancel, a kill, or an outside `scontrol requeue`, which Slurm
        # counts as a restart before the job has ended.
        restarts = restarts_now(job_id) if job_id else None
        if restarts is not None and restarts > started_restarts:
            return "requeued"
        # Slurm's own SIGTERM at the time limit, the warning not acted on before it (it
        # came too late: cluster.signal_delay_s=0, or a step longer than the delay). Saved
        # within KillWait, the job still requeues itself: Slurm 22.05 takes `scontrol
        # requeue` from a job it is ending for its time limit (REQUEUED, then it runs again).
        left = _time_left(job_id, limit_left_s)
        if left is not None and left <= TERM_AT_LIMIT_S:
            return "timeout"
        return "cancelled"
    left = _time_left(job_id, limit_left_s)
    if left is not None and left <= signal_delay_s + TIMEOUT_SLACK_S:
        return "timeout"
    return "preempted"


def _time_left(job_id: str, limit_left_s: float | None) -> float | None:
    """Seconds to the time limit: squeue's, else the job's own clock's."""
    left = seconds_left(job_id) if job_id else None
    return limit_left_s if left is None else left


def should_requeue(reason: str, num_timeouts_before: int, max_requeues: int) -> bool:
    """Preemptions always come back; timeouts (and a program's own requests to be
    requeued) only max_requeues times; cancels never."""
    if reason == "preempted":
        return True
    return reason in LIMITED_REASONS and num_timeouts_before < max_requeues


# Stops that count against cluster.max_requeues.
LIMITED_REASONS = ("timeout", "requested")


@contextmanager
def hold_or_exit(path: RunDir, env: RankEnv) -> Iterator[None]:
    from hpcdl.runlock import RunDirBusy, hold

    try:
        with hold(path):  # only the lock raises RunDirBusy; the job's errors pass through
            yield
    except RunDirBusy as err:
        path.append_attempt(
            {
                "event": "end",
                "job_id": env.job_id,
                "end": _now(),
                "reason": "busy",
                "action": "exit",
            }
        )
        print(f"hpcdl: error: {err}", flush=True)
        sys.exit(EXIT_BAD_INPUT)


def come_back(cfg: Config, path: RunDir, env: RankEnv, job_id: str) -> str:
    """Requeue this job, or submit its continuation (cluster.requeue=chain)."""
    if cfg.cluster.requeue == Requeue.chain:
        from hpcdl.launch.chain import submit_continuation

        return submit_continuation(cfg, path, env, job_id)
    return requeue(job_id, path)


def failed_record(job_id: str | None, err: BaseException) -> dict[str, Any]:
    """The end record of an attempt that raised: its error's first line, as status shows it."""
    return {
        "event": "end",
        "job_id": job_id,
        "end": _now(),
        "reason": "failed",
        "error": error_line(err),
        "action": "exit",
    }


def main(run_dir: str) -> dict[str, Any]:
    from hpcdl.job import run_job, stop_signal_names
    from hpcdl.rundir import RunDir
    from hpcdl.signals import stop_on_signals
    from hpcdl.workdir import in_workdir

    started = time.monotonic()  # the attempt's start, within the seconds srun takes
    path = RunDir(Path(run_dir))
    cfg = path.load_config()
    # First thing, before torch is imported: the warning signal may already be on its way.
    with stop_on_signals(stop_signal_names(cfg.cluster.signal)) as stop:
        env = rank_env_from(os.environ)
        if env.is_main:
            path.append_attempt(start_record(env, cfg.world_size))
        # Rank 0 holds the run dir's lock for the job: a second writer is refused.
        with hold_or_exit(path, env) if env.is_main else nullcontext():
            try:
                # Slurm starts the job where sbatch ran (a resume's folder, say): it runs in
                # the run's own, as its first attempt did (hpcdl.workdir).
                with in_workdir(cfg.workdir):
                    outcome = run_job(run_dir, stop)
            except Exception as err:  # the attempt's end, then the error as it would go
                if env.is_main:
                    path.append_attempt(failed_record(env.job_id, err))
                raise
    if outcome.completed:
        if env.is_main:
            path.append_attempt(
                {"event": "end", "job_id": env.job_id, "end": _now(), "reason": "completed"}
            )
        return outcome.summary
    if outcome.failed_exit_code is not None:  # `hpcdl run`: the program failed on its own
        if env.is_main:
            path.append_attempt(
                {
                    "event": "end",
                    "job_id": env.job_id,
                    "end": _now(),
                    "reason": "failed",
                    "exit_code": outcome.failed_exit_code,
                    "action": "exit",
                }
            )
        sys.exit(outcome.failed_exit_code)
    warning = stop_signal_names(cfg.cluster.signal)[-1]
    started_restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    limit_left_s = cfg.cluster.timeout_min * 60 - (time.monotonic() - started)
    reason = classify(
        outcome.signal_name,
        warning,
        env.job_id or "",
        cfg.cluster.signal_delay_s,
        started_restarts,
        limit_left_s,
    )
    if env.is_main:
        num_timeouts = sum(
            1 for a in path.attempts_of_submission() if a.get("reason") in LIMITED_REASONS
        )
        if should_requeue(reason, num_timeouts, cfg.cluster.max_requeues) and env.job_id:
            action = come_back(cfg, path, env, env.job_id)
        elif reason == "requeued":
            action = stall_requeue(path) or (
                "requeued by Slurm (an outside scontrol requeue, or a failed node)"
            )
        elif reason in LIMITED_REASONS:
            action = (
                f"not requeued: cluster.max_requeues={cfg.cluster.max_requeues} timeouts reached"
            )
        else:
            action = "exit"
        path.append_attempt(
            {
                "event": "end",
                "job_id": env.job_id,
                "end": _now(),
                "reason": reason,
                "signal": outcome.signal_name,
                "global_step": outcome.global_step,
                "action": action,
            },
        )
        print(f"hpcdl: stopped ({reason}, {outcome.signal_name}); {action}", flush=True)
    sys.exit(EXIT_INTERRUPTED)


def stall_requeue(path: RunDir) -> Optional[str]:
    """The requeue this attempt's stalled rank asked for (cluster.requeue_on_stall), as an
    end record says it; None when no stall of this attempt requeued the job (it was
    called an outside scontrol requeue)."""
    for record in reversed(path.newest_attempt_records()):
        if record.get("event") == "stall" and str(record.get("action", "")).startswith(
            "requeued"
        ):
            return f"requeued after rank {record.get('rank')} stalled (cluster.requeue_on_stall)"
    return None


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m hpcdl.launch.slurm_job RUN_DIR")
    from hpcdl.launch.rank_main import exit_status, leave

    try:
        main(sys.argv[1])
    except SystemExit as stop:  # leave as a submitit rank does (hpcdl.launch.rank_main)
        leave(exit_status(stop.code))
    leave(0)
