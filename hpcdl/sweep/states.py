"""A sweep's trial states from the scheduler: one squeue and one sacct call for all of its
job arrays, each task then judged as `hpcdl status` judges a job (hpcdl.launch.monitor),
with what is particular to arrays: sacct's one record for the tasks that never ran, and
tasks cancelled while queued. No torch (login node)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hpcdl.launch.monitor import (
    foreground_state,
    newest_launch,
    own_stop_record,
    ran_as,
    state_from_run_dir,
)
from hpcdl.launch.slurm_state import is_active, query, task_ids
from hpcdl.rundir import RunDir
from hpcdl.sweep.ledger import CANCELLED, COMPLETED, FAILED, TIMEOUT, Ledger


def parse_states(out: str) -> dict[str, str]:
    states: dict[str, str] = {}
    grouped: dict[str, str] = {}
    for line in out.splitlines():  # a requeued task has one sacct row per run: last wins
        job, _, state = line.partition("|")
        state = state.split()[0] if state.strip() else "UNKNOWN"
        for task in task_ids(job.strip()):
            (states if task == job.strip() else grouped)[task] = state
    return {**grouped, **states}  # a task's own record wins over its array's


@dataclass
class SchedulerView:
    queued: Optional[dict[str, str]]  # squeue: ARRAYID_TASKID -> state; None if it failed
    accounted: Optional[dict[str, str]]  # sacct, the same; None without accounting


def slurm_states(array_ids: list[str]) -> SchedulerView:
    """One sacct call (finished tasks) and one squeue call (queued/running tasks)."""
    if not array_ids:
        return SchedulerView({}, {})
    ids = ",".join(array_ids)
    accounting = query(["sacct", "-n", "-P", "-X", "-j", ids, "-o", "JobID,State"])
    queue = query(["squeue", "-h", "-r", "-j", ids, "-o", "%i|%T"])
    if queue is None:  # also when the controller has purged every one of the ids
        queue = query(["squeue", "--me", "-h", "-r", "-o", "%i|%T"])
    return SchedulerView(
        None if queue is None else parse_states(queue),
        None if accounting is None else parse_states(accounting),
    )


def queued_now(job_ids: list[str]) -> Optional[dict[str, str]]:
    """squeue's states of these jobs or array tasks (ARRAYID_TASKID) now, one call: a job
    that has left the queue is not in it. None when squeue does not answer."""
    arrays = sorted({job.split("_")[0] for job in job_ids})
    queue = query(["squeue", "-h", "-r", "-j", ",".join(arrays), "-o", "%i|%T"])
    if queue is None:  # also when the controller has purged every one of the ids
        queue = query(["squeue", "--me", "-h", "-r", "-o", "%i|%T"])
    return None if queue is None else parse_states(queue)


def task_state(view: SchedulerView, job_id: str, run_dir: RunDir) -> Optional[str]:
    """A task's state, or None where the scheduler cannot tell (keep the ledger's).

    Queued or running: squeue's state. Once it has left the queue: sacct's, unless sacct
    still calls it pending or running (a task cancelled while pending keeps its array's
    PENDING record, or none at all), then the run dir decides: CANCELLED if it never ran
    as this job, else as on a cluster without accounting (state_from_run_dir)."""
    if view.queued is None:  # the controller does not answer
        return (view.accounted or {}).get(job_id)
    if job_id in view.queued:
        return view.queued[job_id]
    accounted = (view.accounted or {}).get(job_id)
    if accounted is not None and not is_active(accounted):
        return accounted
    if view.accounted is not None and not ran_as(run_dir, job_id):
        return CANCELLED
    return state_from_run_dir(run_dir)


def settled_state(state: str, run_dir: RunDir, job_id: Optional[str] = None) -> str:
    """The run dir has the last word once a trial is neither queued nor running: COMPLETED
    when its newest attempt recorded a completed end (state_from_run_dir), whatever the
    scheduler says (sacct's FAILED for a job whose ranks aborted in their teardown after
    finishing). A summary.json an earlier attempt left does not count: a trial resumed for
    more epochs keeps its new job's state (PENDING, CANCELLED, FAILED, ...).

    TIMEOUT for Slurm's FAILED of array task `job_id` whose own end record says it stopped
    at its time limit: past cluster.max_requeues it saves, records the stop and exits 3,
    which Slurm calls FAILED (hpcdl.launch.slurm_job)."""
    if is_active(state):
        return state
    if state_from_run_dir(run_dir) == COMPLETED:
        return COMPLETED
    if state == FAILED and job_id is not None:
        end = own_stop_record(run_dir, job_id)
        if end is not None and end.get("reason") == "timeout":
            return TIMEOUT
    return state


def submissions(ledger: Ledger, index: int) -> int:
    """A trial's submissions: the sweep's (its arrays and `sweep rerun`'s on Slurm, each
    start of its local pool) and, once they have started, those of `hpcdl resume
    SWEEP_DIR/<index>` (a start under a job the sweep did not submit, or, locally, one the
    pool did not mark; requeues and a chain's next links are no submission)."""
    ours = [s for s in ledger.submissions if index in s["trials"]]
    arrays = {str(s["array_job_id"]) for s in ours if "array_job_id" in s}
    return len(ours) + len(resumed_by_hand(RunDir(Path(ledger.trial(index).run_dir)), arrays))


def resumed_by_hand(run_dir: RunDir, arrays: set[str]) -> list[dict[str, Any]]:
    """The start records of a trial's `hpcdl resume SWEEP_DIR/<index>` runs: neither under
    one of the sweep's `arrays` nor marked as the local pool's (hpcdl.launch.foreground.
    SWEEP_VAR), nor a requeue's restart."""
    return [
        a
        for a in run_dir.read_attempts()
        if a.get("event") == "start"
        and not a.get("restart_count")
        and not a.get("sweep")
        and str(a.get("array_job") or a.get("job_id")) not in arrays
    ]


def local_state(run_dir: RunDir) -> Optional[str]:
    """A local sweep's trial whose newest attempt is a `hpcdl resume SWEEP_DIR/<index>` by
    hand in the foreground: its state as `hpcdl status` judges it (RUNNING while it holds
    the run dir's lock, then its end record's). None while the newest is the pool's: the
    pool records its trials' ends in the ledger itself."""
    starts = [a for a in run_dir.read_attempts() if a.get("event") == "start"]
    if not starts or starts[-1].get("sweep"):
        return None
    launch = newest_launch(run_dir)
    return foreground_state(run_dir, launch) if launch.in_foreground else None


def current_job(run_dir: RunDir) -> Optional[str]:
    """The job the trial's run dir last recorded: its array task, or the newest link of
    its chain."""
    record = run_dir.read_submission() or {}
    return str(record["job_id"]) if record.get("job_id") else None
