"""A run trained in the foreground (cluster=local, cluster=debug) records its attempts in
attempts.jsonl as a Slurm job's rank 0 does (hpcdl.launch.slurm_job): one start record,
and one end record unless it was killed. `hpcdl status`, `logs` and Job.status() then
report on a run's newest attempt, whichever launcher ran it. Stdlib only.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import time
from typing import Any, Optional

from hpcdl.exit_codes import EXIT_INTERRUPTED, EXIT_OK
from hpcdl.rundir import SWEEP_VAR, RunDir

# The `launcher` of a foreground attempt's records (a Slurm job's records have none).
FOREGROUND_LAUNCHERS = ("local", "debug")

# An end record's reason, by the attempt's exit status; any other status is "failed".
END_REASONS = {EXIT_OK: "completed", EXIT_INTERRUPTED: "interrupted"}


def _now() -> str:
    return dt.datetime.now().isoformat(timespec="seconds")


def record_start(run_dir: RunDir, launcher: str, job_id: Optional[str], world_size: int) -> None:
    """job_id: submitit's local job id (its rank logs are <job_id>_<rank>_log.out); None
    for a run in this process."""
    submission = run_dir.read_submission()
    run_dir.append_attempt(
        {
            "event": "start",
            "launcher": launcher,
            "job_id": job_id,
            # The Slurm job slurm.json named when this attempt started: a later submission
            # changes slurm.json, so which of the two is newer needs no clocks compared.
            "after_job": str(submission["job_id"]) if submission else None,
            "nodes": socket.gethostname(),
            "world_size": world_size,
            "start": _now(),
            "start_time_s": time.time(),  # fractions too: monitor.summary_written_since
            **({"sweep": True} if os.environ.get(SWEEP_VAR) else {}),
        }
    )


def record_end(
    run_dir: RunDir,
    launcher: str,
    job_id: Optional[str],
    exit_code: Optional[int],
    error: Optional[BaseException] = None,
) -> None:
    """exit_code: the attempt's exit status; None when it raised `error` (kept as its first
    line: `hpcdl status` shows it, a foreground run having no log to find it in)."""
    reason = END_REASONS.get(exit_code, "failed") if exit_code is not None else "failed"
    record: dict[str, Any] = {"event": "end", "launcher": launcher, "job_id": job_id}
    record.update(end=_now(), reason=reason)
    if reason == "failed" and exit_code is not None:
        record["exit_code"] = exit_code
    if error is not None:
        from hpcdl.launch.diagnose import error_line

        record["error"] = error_line(error)
    run_dir.append_attempt(record)
