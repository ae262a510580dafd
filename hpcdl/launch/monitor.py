"""`hpcdl status | logs | cancel`: one squeue (then sacct) call per refresh
(hpcdl.launch.slurm_state), joined with the run dir's records. Stdlib only.

Works on clusters without accounting: when sacct fails, the state comes from squeue and
the run dir (attempts.jsonl, summary.json). A run whose newest attempt was trained in the
foreground (cluster=local, cluster=debug) is judged by its run dir alone: its attempt
records (hpcdl.launch.foreground) and the process holding its lock (hpcdl.runlock).
"""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hpcdl.errors import HpcdlError
from hpcdl.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from hpcdl.launch.diagnose import PEER_GONE, clipped, describe, root_cause
from hpcdl.launch.foreground import FOREGROUND_LAUNCHERS
from hpcdl.launch.logtail import copy_new
from hpcdl.launch.slurm_state import (
    ARRAY_RECORD,
    ENDED_UNFINISHED,
    NO_ACCOUNTING,
    NO_SLURM,
    NOT_IN_ACCOUNTING,
    SQUEUE_FAILED,
    elapsed_text,
    is_active,
    job_state,
    query,
)
from hpcdl.rundir import PROGRAM_END, RUN_BOOKKEEPING, RunDir, SweepDir

# Polling interval floor: a busy scheduler should see at most one query per 10 s from us.
MIN_REFRESH_S = 10.0


# Ended states whose cause is in the ranks' logs (not the scheduler's doing).
FAILED_STATES = ("FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL")


@dataclass(frozen=True)
class Launch:
    """A run's newest attempt and who ran it: a Slurm job (`launcher` "slurm"), or a run in
    the foreground ("local", "debug": `start` and, once it ended, `end` are its records;
    `job_id` is submitit's local job id, None in-process). Launcher "" when no record says:
    a run dir not launched yet, or trained in the foreground before hpcdl recorded that."""

    launcher: str
    job_id: Optional[str]
    start: Optional[dict[str, Any]] = None
    end: Optional[dict[str, Any]] = None

    @property
    def in_foreground(self) -> bool:
        return self.launcher != "slurm"


def newest_launch(run_dir: RunDir) -> Launch:
    """The newest of the run's Slurm submission (slurm.json) and its foreground attempts."""
    record = run_dir.read_submission()
    submitted = str(record["job_id"]) if record else None
    events = run_dir.read_attempts()
    starts = judged_starts(events, run_dir)
    if starts:
        start = events[starts[-1]]
        launcher = start.get("launcher")
        # A foreground attempt is the newest unless a job was submitted after it started.
        if launcher in FOREGROUND_LAUNCHERS and start.get("after_job") == submitted:
            later = events[starts[-1] + 1 :]
            end = next((e for e in later if e.get("event") == "end"), None)
            job_id = start.get("job_id")
            return Launch(launcher, None if job_id is None else str(job_id), start, end)
        if submitted is None and launcher is None:  # `sbatch slurm/train.sbatch RUN_DIR`
            return Launch("slurm", str(start.get("job_id")))
    if submitted is not None:
        return Launch("slurm", submitted)
    return Launch("", newest_local_job(run_dir))


def newest_local_job(run_dir: RunDir) -> Optional[str]:
    """The job id of the newest rank log in the run dir (a cluster=local run's), if any."""
    found = sorted(run_dir.log_dir.glob("*_*_log.out"), key=lambda p: p.stat().st_mtime)
    return found[-1].name.split("_")[0] if found else None


def resolve(ref: str, command: str) -> tuple[Optional[RunDir], Launch]:
    """RUN_DIR or a Slurm JOB_ID -> (the run dir or None, its newest launch)."""
    path = Path(ref).expanduser()
    if path.is_dir():
        if SweepDir(path).ledger_file.is_file():
            raise HpcdlError(sweep_dir_hint(path.resolve(), command))
        run_dir = RunDir(path.resolve())
        if not run_dir.is_run_dir():
            raise HpcdlError(
                f"{ref}: not an hpcdl run dir (no {RunDir.CONFIG}); pass a run dir or a "
                "Slurm job id"
            )
        return run_dir, newest_launch(run_dir)
    if re.fullmatch(r"\d+(_\d+)?", ref):  # a job, an array, or one of its tasks
        found = run_dir_of_job(ref)
        if found is not None:  # the run's report: attempts, cause, metrics
            return found, newest_launch(found)
        return None, Launch("slurm", ref)
    raise HpcdlError(
        f"{ref}: neither a run dir nor a Slurm job id (JOBID, ARRAYID or ARRAYID_TASKID)"
    )


def run_dir_of_job(job_id: str) -> Optional[RunDir]:
    """The run dir whose newest job `job_id` is, from the job's log path as the controller
    has it (`scontrol show job`: StdOut=RUN_DIR/logs/...), while it knows the job (until
    MinJobAge after its end); None otherwise, or for a job of another run's history."""
    out = query(["scontrol", "show", "job", job_id, "-o"]) or ""
    found = re.search(r"(?:^|\s)StdOut=(\S+)", out)
    if found is None:
        return None
    run_dir = RunDir(Path(found.group(1)).parent.parent)
    if not run_dir.is_run_dir():
        return None
    names = {job_id}  # a task's own job id, and the ARRAYID_TASKID hpcdl records
    array, task = re.search(r"ArrayJobId=(\d+)", out), re.search(r"ArrayTaskId=(\d+)\b", out)
    if array and task:
        names.add(f"{array.group(1)}_{task.group(1)}")
    return run_dir if newest_launch(run_dir).job_id in names else None


def sweep_dir_hint(sweep_dir: Path, command: str) -> str:
    """`hpcdl status|logs SWEEP_DIR`, and `cancel` of a local sweep: where to go instead, in
    one line (a Slurm sweep's trials are cancelled by hpcdl.cli.cancel)."""
    one_trial = f"`hpcdl {command} {sweep_dir}/N` for trial N"
    if command != "cancel":
        return (
            f"{sweep_dir} is a sweep dir: `hpcdl sweep status {sweep_dir}` shows its "
            f"trials; {one_trial}"
        )
    return (
        f"{sweep_dir} is a local sweep: its trials run under the `hpcdl train -m` that "
        "started it; stop them with Ctrl-C there"
    )


def attempt_elapsed(start: dict[str, Any], end: Optional[dict[str, Any]]) -> Optional[str]:
    """An attempt's elapsed time from its records' times (whole seconds): start to end, or
    to now while it runs (end None); None where a record has no readable time."""
    try:
        began = dt.datetime.fromisoformat(str(start["start"]))
        ended = dt.datetime.fromisoformat(str(end["end"])) if end else dt.datetime.now()
    except (KeyError, ValueError):
        return None
    return elapsed_text((ended - began).total_seconds())


def last_attempt(run_dir: RunDir) -> tuple[Optional[dict[str, Any]], Optional[dict[str, Any]]]:
    """The run's newest start record and the end that followed it (None: none yet)."""
    events = run_dir.read_attempts()
    starts = judged_starts(events, run_dir)
    if not starts:
        return None, None
    later = events[starts[-1] + 1 :]
    return events[starts[-1]], next((e for e in later if e.get("event") == "end"), None)


def job_report(job_id: str, run_dir: Optional[RunDir]) -> dict[str, Any]:
    """What `hpcdl status` prints (and Job.status() returns): the scheduler's view, the run
    dir's records, and the run dir's verdict once the scheduler has forgotten the job."""
    report = {**job_state(job_id), **run_status(run_dir)}
    if run_dir is not None and is_active(report["state"]) and requeue_pending(run_dir, job_id):
        report["requeues"] += 1  # requeued (or chained), not started again yet
    if run_dir is not None and left_the_queue_unrun(report, run_dir):
        return {**report, "state": "CANCELLED", "source": f"{report['source']}; cancelled"}
    if run_dir is not None and report["state"] == "FAILED":
        # Past cluster.max_requeues a job at its time limit saves, records the stop and
        # exits 3, which Slurm calls FAILED (hpcdl.launch.slurm_job): it timed out, as
        # `hpcdl sweep status` says of such a trial.
        end = own_stop_record(run_dir, str(report["job_id"]))
        if end is not None and end.get("reason") == "timeout":
            report["state"] = "TIMEOUT"
    if run_dir is None and report["source"] in (SQUEUE_FAILED, NO_SLURM):
        raise no_scheduler_error(job_id, report["source"])
    if report["source"] not in (NO_ACCOUNTING, NOT_IN_ACCOUNTING):
        return report
    if run_dir is None:
        if report["source"] == NOT_IN_ACCOUNTING:
            raise HpcdlError(
                f"job {job_id}: neither squeue nor sacct knows it; check the id "
                "(`squeue --me` lists your queued jobs), or pass the run dir"
            )
        # No accounting: a job that left the queue, or no Slurm job at all (a cluster=local
        # run's `local job <id>`); either way only its run dir can tell how it ended.
        raise HpcdlError(
            f"job {job_id}: not known to this Slurm (squeue does not list it; no accounting, "
            "sacct failed); for a run trained with cluster=local or debug (`local job <id>`), "
            "or a job that has ended, pass its run dir instead: hpcdl status RUN_DIR"
        )
    verdict = {"job_id": report["job_id"], "state": state_from_run_dir(run_dir)}
    start, end = last_attempt(run_dir)
    if start is not None and end is not None:  # a killed attempt's is unknown
        verdict["elapsed"] = attempt_elapsed(start, end)
    report["source"] = "run dir (" + report["source"].removeprefix("none (")
    report = {**verdict, **{k: v for k, v in report.items() if k not in verdict}}
    return with_killed_line(report) if verdict["state"] == "FAILED" else report


def left_the_queue_unrun(report: dict[str, Any], run_dir: RunDir) -> bool:
    """An array task cancelled while it waited: squeue no longer lists it, sacct has only
    its array's record (still PENDING while other tasks wait) or none, and the run dir
    never saw it start. `hpcdl sweep status` judges such a task the same way."""
    job_id, source = str(report["job_id"]), str(report["source"])
    if "_" not in job_id or ran_as(run_dir, job_id):
        return False
    return source == NOT_IN_ACCOUNTING or (
        source.startswith(ARRAY_RECORD) and is_active(report["state"])
    )


def ran_as(run_dir: RunDir, job_id: str) -> bool:
    """Whether the run dir records a start of job `job_id` (ARRAYID_TASKID or a job id)."""
    return any(a.get("event") == "start" and job_id in job_refs(a) for a in run_dir.read_attempts())


def unanswered(source: str, what: str = "the job's state is not known") -> str:
    """Why a state shown is not Slurm's, and the fix: one line."""
    if source == NO_SLURM:
        why = "Slurm's commands are not on PATH here"
    else:
        why = "Slurm does not answer here (squeue and sacct failed)"
    return (
        f"{why}, so {what}; run this where Slurm answers (is SLURM_CONF set? for the dev "
        'cluster: eval "$(slurm/devcluster env)")'
    )


def no_scheduler_error(job_id: str, source: str) -> HpcdlError:
    """`hpcdl status JOB_ID` where no Slurm answers: often the id of a run trained in the
    foreground (cluster=local prints `local job <pid>`), which no scheduler knows."""
    if source == NO_SLURM:
        why = "Slurm's commands (squeue, sacct) are not on PATH here"
    else:
        why = "squeue failed: no Slurm controller answers here"
    return HpcdlError(
        f"job {job_id}: {why}; for a run trained with cluster=local or debug (`local job "
        "<id>`), pass its run dir instead: hpcdl status RUN_DIR"
    )


def run_report(run_dir: RunDir) -> dict[str, Any]:
    """What `hpcdl status RUN_DIR` prints (and Job.status() returns), for the run's newest
    attempt, whichever launcher ran it."""
    launch = newest_launch(run_dir)
    if launch.in_foreground:
        report = foreground_report(run_dir, launch)
    else:
        assert launch.job_id is not None
        report = job_report(launch.job_id, run_dir)
    if report.get("state") == "RUNNING" and _runs_a_program(run_dir):
        report.update(last_outputs(run_dir, launch))
    return report


def last_outputs(run_dir: RunDir, launch: Launch, now: Optional[float] = None) -> dict[str, str]:
    """A running `hpcdl run` program's ranks (under launcher=torchrun, its nodes: one log
    each), each with how long ago its log last grew: `rank 1: last output 14 min ago`, so
    that a rank that hangs shows, stall_timeout_s or not. None for cluster=debug (no log)."""
    if launch.job_id is None:
        return {}
    now = time.time() if now is None else now
    folder = log_file(run_dir, launch, 0).parent
    what = "node" if _runs_torchrun(run_dir) else "rank"
    found: dict[int, float] = {}
    for path in folder.glob(f"{launch.job_id}_*_log.out"):
        middle = path.name.removeprefix(f"{launch.job_id}_").removesuffix("_log.out")
        if middle.isdigit():  # not an array task's log ("<job>_<task>_<rank>")
            try:
                found[int(middle)] = path.stat().st_mtime
            except OSError:
                continue
    return {
        f"{what} {rank}": f"last output {ago_text(now - found[rank])} ago" for rank in sorted(found)
    }


def ago_text(seconds: float) -> str:
    """`40 s`, `14 min`, `2.5 h`."""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def foreground_report(run_dir: RunDir, launch: Launch) -> dict[str, Any]:
    from hpcdl.runlock import describe as describe_holder
    from hpcdl.runlock import last_holder

    state = foreground_state(run_dir, launch)
    how = f"cluster={launch.launcher}, " if launch.launcher else ""
    source = f"run dir ({how}run in the foreground, not on Slurm)"
    if state == "UNKNOWN" and not run_dir.has_started():
        state, source = "NOT_STARTED", "run dir (no attempt has started)"
    report: dict[str, Any] = {"job_id": launch.job_id, "state": state}
    if launch.start is not None and (launch.end is not None or state == "RUNNING"):
        report["elapsed"] = attempt_elapsed(launch.start, launch.end)
    report["source"] = source
    if state == "RUNNING":
        holder = last_holder(run_dir)
        if holder:
            report["where"] = describe_holder(holder)
    killed = launch.start is not None and launch.end is None and state != "RUNNING"
    report.update(run_status(run_dir, completed_unrecorded=killed and state == "COMPLETED"))
    return with_killed_line(report) if killed and state == "FAILED" else report


# An attempt's state by its end record's reason: every reason hpcdl.launch.foreground (a
# run in the foreground) and hpcdl.launch.slurm_job (a Slurm job's rank 0) write. Any other
# reason, or no end record at all (killed), is FAILED.
END_STATES = {
    "completed": "COMPLETED",
    "failed": "FAILED",
    "busy": "FAILED",  # another process held the run dir: this job did not train
    "interrupted": "INTERRUPTED",  # stopped on a signal in the foreground, checkpoint saved
    "requested": "INTERRUPTED",  # `hpcdl run`'s program stopped itself (exit 3), not requeued
    "cancelled": "CANCELLED",  # scancel, or a kill, on Slurm: checkpoint saved
    "timeout": "TIMEOUT",
    "preempted": "PREEMPTED",
    # "requeued" (an outside `scontrol requeue`) is left to FAILED: the job comes back
    # under its id, so one gone from the queue without a new start was ended by something
    # the run dir cannot tell.
}


def foreground_state(run_dir: RunDir, launch: Launch) -> str:
    """RUNNING while a process holds the run dir's lock; once ended, its end record's
    verdict; FAILED when it recorded no end (killed)."""
    from hpcdl.runlock import is_held

    if launch.end is not None:
        return END_STATES.get(str(launch.end.get("reason")), "FAILED")
    if is_held(run_dir):
        return "RUNNING"
    if launch.start is not None:  # killed
        return "COMPLETED" if summary_written_since(run_dir, launch.start) else "FAILED"
    # Trained before hpcdl recorded foreground attempts: only a summary tells.
    return "COMPLETED" if run_dir.is_complete() else "UNKNOWN"


def summary_written_since(run_dir: RunDir, start: dict[str, Any]) -> bool:
    """Whether the attempt that `start` began wrote summary.json: it trained to the end and
    was killed after (while it plotted, or closed its trackers), before its end record.
    An older summary.json is an earlier attempt's (a completed run resumed for more
    epochs). For runs in the foreground: the start time and the file's are this machine's
    clock. Start records written before they held start_time_s: not known, False."""
    started = start.get("start_time_s")
    if not isinstance(started, (int, float)):
        return False
    try:
        return run_dir.summary_file.stat().st_mtime >= started
    except OSError:
        return False


def state_from_run_dir(run_dir: RunDir) -> str:
    """A job that left the queue, judged by its run dir alone (no accounting): the newest
    attempt's end record (END_STATES), or FAILED when it started and recorded no end (a
    crash, a node failure, a kill: rerunnable either way), or UNKNOWN when it never
    started. summary.json decides only for a run dir with no start record (trained before
    hpcdl recorded attempts): one an earlier attempt left says nothing of the newest (a
    completed run resumed for more epochs, then cancelled, is CANCELLED)."""
    events = run_dir.read_attempts()
    starts = [i for i, e in enumerate(events) if e.get("event") == "start"]
    if not starts and run_dir.is_complete():
        return "COMPLETED"
    if not events:
        return "UNKNOWN"
    newest = events[starts[-1] + 1 :] if starts else events
    ends = [e for e in newest if e.get("event") == "end"]
    return END_STATES.get(str(ends[-1].get("reason")), "FAILED") if ends else "FAILED"


def with_killed_line(report: dict[str, Any]) -> dict[str, Any]:
    """The report of a run whose newest attempt ended without recording an end, with a
    last_end that says so, after `requeues`."""
    if "last_end" in report:
        return report
    out: dict[str, Any] = {}
    for key, value in report.items():
        out[key] = value
        if key == "requeues":
            out["last_end"] = "none recorded: killed (SIGKILL, out of memory, a node lost)"
    return out


def run_status(run_dir: Optional[RunDir], completed_unrecorded: bool = False) -> dict[str, Any]:
    """completed_unrecorded: the newest attempt wrote its summary, then was killed before
    its end record (summary_written_since)."""
    if run_dir is None:
        return {}
    info: dict[str, Any] = {}
    attempts = run_dir.read_attempts()
    starts = [a for a in attempts if a.get("event") == "start"]
    info["attempts"] = len(starts)
    info["requeues"] = run_dir.requeues()
    # the newest attempt's end only: an earlier attempt's 'completed' says nothing of a
    # resume that was killed since (no end of its own: SIGKILL, out of memory, a node lost)
    first = _newest_start(attempts, run_dir)
    after = [i for i, a in enumerate(attempts) if i > first and a.get("event") == "start"]
    newest = attempts[first : after[0] if after else None]  # a refused attempt's aside
    ends = [a for a in newest if a.get("event") == "end"]
    if ends:
        info["last_end"] = end_text(ends[-1])
    elif completed_unrecorded:
        info["last_end"] = "none recorded: killed after it completed (its summary.json is there)"
    last = run_dir.metrics.last_row()
    if last is not None:
        info["last_epoch"] = last.get("epoch")
        # the training loss and every validation metric: a regression's val_mae and val_r2,
        # a custom task's own, not only a classifier's accuracy
        info["last_metrics"] = {
            k: v for k, v in last.items() if k == "train_loss" or k.startswith("val_")
        }
    for rank, record in sorted(run_dir.last_telemetry().items()):
        info[f"rank {rank}"] = describe_sample(record)
    summary = run_dir.read_summary()
    completed = bool(ends) and ends[-1].get("reason") == "completed"
    if summary is not None and (not starts or completed or completed_unrecorded):
        # an earlier attempt's summary.json describes weights a resume has trained on since
        if _is_program_run(run_dir):  # its metrics file's numbers; no test set, no weights
            info["metrics"] = {
                k: v for k, v in summary.items() if _is_number(v) and k not in RUN_BOOKKEEPING
            }
            return info
        info["test_metrics"] = {
            k: v for k, v in summary.items() if k.startswith("test_") and _is_number(v)
        }
        info["weights_sha256"] = summary.get("weights_sha256")
    return info


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_program_run(run_dir: RunDir) -> bool:
    """An `hpcdl run` run (a config that cannot be read: not one)."""
    try:
        return run_dir.load_config().script is not None
    except HpcdlError:
        return False


def requeue_pending(run_dir: RunDir, job_id: str) -> bool:
    """Job `job_id` is the newest attempt's come back (an outside `scontrol requeue`, its
    own requeue after a warning signal or a stall, under the same id; the next job of a
    chain, which the stop record names), but has not started since: while it is queued,
    a requeue the run dir's start records do not count yet (RunDir.requeues()). Slurm
    counts it at once (`Restarts=1` in `scontrol show job`), and so does `hpcdl status`.
    Another job (`sweep rerun`, `hpcdl resume` after the requeued job was cancelled) is
    no requeue."""
    attempts = run_dir.read_attempts()
    if not any(a.get("event") == "start" for a in attempts):
        return False
    started_as = job_refs(attempts[_newest_start(attempts)])
    for record in attempts[_newest_start(attempts) :]:
        action = str(record.get("action", ""))
        if record.get("event") not in ("end", "stall"):
            continue
        if action.startswith("chained:"):
            return action.startswith(f"chained: job {job_id} ")
        requeued = record.get("reason") == "requeued" or action.startswith("requeue")
        if requeued and not action.startswith("requeue failed"):
            return job_id in started_as
    return False


def end_text(end: dict[str, Any]) -> str:
    """An end record as `last_end` shows it: `timeout (not requeued: ...)`, `failed:
    DataError: ...` (an end whose job simply exited says no more than its reason)."""
    action, error = end.get("action"), end.get("error")
    if action == "exit":
        action = None
    if error is None and isinstance(end.get("exit_code"), int) and end.get("reason") == "failed":
        error = f"exit status {end['exit_code']}"  # a foreground run's: it has no log to read
    return (
        f"{end.get('reason')}"
        + (f" ({action})" if action else "")
        + (f": {error}" if error else "")
    )


def _newest_start(attempts: list[dict[str, Any]], run_dir: Optional[RunDir] = None) -> int:
    """Where the newest attempt's records begin in attempts.jsonl (0 without a start); with
    run_dir, the newest that counts (judged_starts)."""
    starts = judged_starts(attempts, run_dir) if run_dir is not None else None
    if starts is None:
        starts = [i for i, a in enumerate(attempts) if a.get("event") == "start"]
    return starts[-1] if starts else 0


def judged_starts(attempts: list[dict[str, Any]], run_dir: RunDir) -> list[int]:
    """The start records that judge the run: all but newest ones of attempts in the
    foreground that the job refused at once (exit 2: a checkpoint that does not fit a
    changed model, say) and that wrote nothing. `hpcdl resume` then left config.yaml as it
    was, and the run is as it was: a completed run stays COMPLETED, not FAILED."""
    starts = [i for i, a in enumerate(attempts) if a.get("event") == "start"]
    while len(starts) > 1 and _refused_unchanged(attempts, starts[-1], run_dir):
        starts.pop()
    return starts


def _refused_unchanged(attempts: list[dict[str, Any]], index: int, run_dir: RunDir) -> bool:
    start = attempts[index]
    end = next((a for a in attempts[index + 1 :] if a.get("event") == "end"), None)
    if start.get("launcher") not in FOREGROUND_LAUNCHERS or end is None:
        return False
    if end.get("reason") != "failed" or end.get("exit_code") != EXIT_BAD_INPUT:
        return False
    started = start.get("start_time_s")
    if not isinstance(started, (int, float)):
        return False  # an older record: not known
    return not run_dir.wrote_since(started)


def shown(value: Any) -> str:
    """A report value as `hpcdl status` prints it: metrics as `name value` pairs with 4
    significant digits (the dict keeps every digit for the Python API)."""
    if not isinstance(value, dict):
        return str(value)
    return "  ".join(
        f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in value.items()
    )


def describe_sample(record: dict[str, Any]) -> str:
    """A rank's last telemetry sample (hpcdl.telemetry) in one line."""
    parts = [f"step {record.get('global_step')}"]
    if "step_s" in record:
        parts.append(f"{record['step_s'] * 1e3:.1f} ms/step")
    if "gpu_util_pct" in record:
        parts.append(f"GPU {record['gpu_util_pct']:g}%")
    if "gpu_mem_used_mib" in record:
        parts.append(f"{record['gpu_mem_used_mib'] / 1024:.1f} GiB used")
    if "gpu_mem_peak_mib" in record:
        parts.append(f"peak {record['gpu_mem_peak_mib'] / 1024:.2f} GiB allocated")
    if "gpu_power_w" in record:
        parts.append(f"{record['gpu_power_w']:g} W")
    if "time" in record:
        parts.append(f"{max(0.0, time.time() - float(record['time'])):.0f}s ago")
    return ", ".join(parts)


def status(ref: str, watch_s: Optional[float] = None) -> int:
    run_dir, launch = resolve(ref, "status")
    while True:
        if run_dir is None:
            assert launch.job_id is not None
            report = job_report(launch.job_id, None)
        else:
            launch = newest_launch(run_dir)
            report = run_report(run_dir)
            cause = failure_cause(run_dir, launch, report["state"])
            if cause:
                report["cause"] = cause
                report["last_end"] = as_consequence(report.get("last_end"))
            hint = next_step(run_dir, report)
            if hint:
                report["next"] = hint
        for key, value in report.items():
            if value is not None and value != {}:
                print(f"{key:>15}: {shown(value)}")
        if report.get("source") in (SQUEUE_FAILED, NO_SLURM):
            print(f"warning: {unanswered(report['source'])}", file=sys.stderr, flush=True)
            return EXIT_FAILED  # the state is not known: a script must not read it as RUNNING
        if watch_s is None or not is_active(report["state"]):  # a script polling the run:
            return EXIT_FAILED if report["state"] in ENDED_UNFINISHED else EXIT_OK  # 1: failed
        time.sleep(max(watch_s, MIN_REFRESH_S))
        print()


def as_consequence(last_end: Any) -> Any:
    """The newest end record's error, when it is a rank's loss of a peer (a collective timed
    out, a connection reset) and `cause` names the rank that failed: said to be the
    consequence (it read as the failure itself, beside a cause naming another rank)."""
    if not isinstance(last_end, str) or not last_end.startswith("failed: "):
        return last_end
    if not any(marker in last_end for marker in PEER_GONE):
        return last_end
    return f"failed, a consequence of the cause below: {clipped(last_end[8:], 120)}"


# The end reasons after which the run holds a checkpoint saved as it stopped.
RESUMABLE_ENDS = ("timeout", "preempted", "cancelled", "interrupted", "requested", "requeued")


def next_step(run_dir: RunDir, report: dict[str, Any]) -> Optional[str]:
    """What to type next for a run that has stopped short of its end: a stop it saved for
    (a time limit with no requeue left, a cancel), or a failure (once its cause is fixed)."""
    if is_active(report["state"]) or report["state"] == "COMPLETED":
        return None
    command = f"hpcdl resume {run_dir.path}"
    if not run_dir.step_files():
        if report["state"] != "TIMEOUT":
            return None
        if _runs_a_program(run_dir):  # its checkpoints are its own, wherever it keeps them
            return (
                f"{command} cluster.timeout_min=MINUTES (a longer limit; the program "
                "continues from what it saved, if anything)"
            )
        return (
            f"{command} cluster.timeout_min=MINUTES (no checkpoint was saved before the "
            "limit: it starts again from the beginning, so give it a longer one)"
        )
    reason = str(report.get("last_end", "")).split(" ", 1)[0].rstrip(":,")
    if reason == "timeout" and report["state"] == "TIMEOUT":  # out of requeues
        return (
            f"{command} (continues from the checkpoint saved as it stopped; add "
            "cluster.timeout_min=MINUTES for a longer limit)"
        )
    if reason in RESUMABLE_ENDS:
        status = unconfirmed_program_stop(run_dir)
        if status is not None:  # an `hpcdl run` program that did not say it saved
            return (
                f"{command} (continues from the newest checkpoint; the program ended with "
                f"status {status} when asked to stop, not 3, so it may have saved nothing "
                "then: docs/scripts.md#stop-and-requeue)"
            )
        return f"{command} (continues from the checkpoint saved as it stopped)"
    if report["state"] in FAILED_STATES:
        return f"{command} once the cause is fixed (continues from the newest checkpoint)"
    return None


def unconfirmed_program_stop(run_dir: RunDir) -> Optional[int]:
    """An `hpcdl run` program's exit status in the newest attempt when it was asked to stop
    and did not confirm a save with status 3 (EXIT_INTERRUPTED), e.g. 143 for a program
    that SIGTERM ended; None for hpcdl train's runs and for confirmed stops."""
    if not _runs_a_program(run_dir):
        return None
    ends = [a for a in run_dir.newest_attempt_records() if a.get("event") == PROGRAM_END]
    status = ends[-1].get("exit_code") if ends else None
    return status if isinstance(status, int) and status != EXIT_INTERRUPTED else None


def failure_cause(run_dir: RunDir, launch: Launch, state: str) -> Optional[str]:
    """Why a failed run failed, from its ranks' logs (none for a stop it recorded itself)."""
    if state not in FAILED_STATES or launch.job_id is None:
        return None
    if launch.in_foreground:
        log_dir = run_dir.log_dir
    elif stopped_itself(run_dir, launch.job_id):
        return None
    else:
        log_dir = run_dir.rank_log(launch.job_id, 0).parent
    found = describe(root_cause(log_dir, launch.job_id))
    return found or f"no error in the ranks' logs ({log_dir})"


# End reasons of a job that stopped on a stop it recorded (hpcdl.launch.slurm_job).
STOPPED_ITSELF = ("timeout", "preempted", "cancelled", "requested", "requeued")


def stopped_itself(run_dir: RunDir, job_id: str) -> bool:
    """The job's last attempt ended on a stop it recorded (a time limit past
    cluster.max_requeues, a preemption, a cancel): `last_end` says why; its logs hold no
    error to look for (Slurm's banner of an earlier requeue is none)."""
    return own_stop(run_dir, job_id) is not None


def own_stop(run_dir: RunDir, job_id: str) -> Optional[str]:
    """The last end record of job `job_id` (a job id, or an array task's ARRAYID_TASKID)
    as `last_end` shows it, when it is a stop the job recorded (STOPPED_ITSELF); None
    when its last attempt recorded none, or another job's attempt came after."""
    end = own_stop_record(run_dir, job_id)
    return None if end is None else end_text(end)


def own_stop_record(run_dir: RunDir, job_id: str) -> Optional[dict[str, Any]]:
    """own_stop()'s end record itself (its `reason`: timeout, preempted, ...)."""
    attempts = run_dir.read_attempts()
    ends = [i for i, a in enumerate(attempts) if a.get("event") == "end"]
    if not ends:
        return None
    last = attempts[ends[-1]]
    if last.get("reason") not in STOPPED_ITSELF:
        return None
    refs = {str(last.get("job_id"))}  # Slurm's own id; an array task's from its start
    starts = [a for a in attempts[: ends[-1]] if a.get("event") == "start"]
    if starts:
        refs.update(job_refs(starts[-1]))
    return last if job_id in refs else None


def job_refs(start: dict[str, Any]) -> tuple[str, str]:
    """The ids a start record's job goes by: Slurm's own id, and for an array task
    ARRAYID_TASKID (its records carry the first beside the array and the task)."""
    return str(start.get("job_id")), f"{start.get('array_job')}_{start.get('array_task')}"


def log_file(run_dir: RunDir, launch: Launch, rank: int) -> Path:
    """A rank's log of the run's newest attempt (may not exist yet). A run in-process
    (cluster=debug) has none: one line says so."""
    if not launch.in_foreground:
        assert launch.job_id is not None
        return run_dir.rank_log(launch.job_id, rank)
    if launch.job_id is not None:  # cluster=local, as submitit's local executor names it
        return run_dir.log_dir / f"{launch.job_id}_{rank}_log.out"
    if rank == 0 and run_dir.trial_log.is_file():  # a local sweep's trial: its console output
        return run_dir.trial_log
    if launch.launcher == "" and not run_dir.has_started():
        raise HpcdlError(f"{run_dir.path}: not launched yet; no log to show")
    raise HpcdlError(
        f"{run_dir.path}: no log file for rank {rank}; a cluster=debug run prints to the "
        "console only (the terminal that ran it)"
    )


def is_running(run_dir: RunDir, launch: Launch) -> tuple[bool, str]:
    """Whether the newest attempt is queued or running (one squeue/sacct call for a Slurm
    job), and its state."""
    if launch.in_foreground:
        state = foreground_state(run_dir, launch)
    else:
        assert launch.job_id is not None
        state = job_state(launch.job_id)["state"]
    return is_active(state), state


def no_such_log(run_dir: RunDir, launch: Launch, rank: int, state: str) -> HpcdlError:
    """An ended job's rank without a log: the ranks it had, in one line."""
    path = log_file(run_dir, launch, rank)
    ranks = []
    for other in path.parent.glob(f"{launch.job_id}_*_log.out"):
        middle = other.name.removeprefix(f"{launch.job_id}_").removesuffix("_log.out")
        if middle.isdigit():  # not an array task's log ("<job>_<task>_<rank>")
            ranks.append(int(middle))
    ranks.sort()
    job = f"job {launch.job_id}" if launch.job_id else "the run"
    if not ranks:
        return HpcdlError(
            f"{path}: no log; {job} ended ({state}) before any rank wrote one; "
            f"`hpcdl status {run_dir.path}` says how it ended"
        )
    if ranks == list(range(len(ranks))):
        return HpcdlError(
            f"--rank {rank}: {job} ({state}) had world size {len(ranks)}, ranks 0-{ranks[-1]}; "
            f"pass one of those"
        )
    listed = ", ".join(map(str, ranks))
    return HpcdlError(
        f"--rank {rank}: {job} ({state}) left logs of ranks {listed} only ({path.parent})"
    )


def started_world_size(run_dir: RunDir, launch: Launch) -> Optional[int]:
    """The world size this job's newest start record gives (None: not started yet)."""
    starts = [
        a
        for a in run_dir.read_attempts()
        if a.get("event") == "start" and str(launch.job_id) in job_refs(a)
    ]
    size = starts[-1].get("world_size") if starts else None
    return int(size) if isinstance(size, int) else None


def logs(ref: str, rank: int, follow: bool, job: Optional[str] = None) -> int:
    run_dir, launch = resolve(ref, "logs")
    if run_dir is None:
        raise HpcdlError(f"{ref}: give the run dir to read its logs (job ids carry no log path)")
    if job is not None:  # an earlier job of the run (before a resume, a chain's link)
        jobs = [str(h["job_id"]) for h in (run_dir.read_submission() or {}).get("history", [])]
        local = [  # cluster=local attempts: submitit's local job ids, one per attempt
            str(a["job_id"])
            for a in run_dir.read_attempts()
            if a.get("event") == "start" and a.get("launcher") == "local" and a.get("job_id")
        ]
        if job not in jobs and job not in local:
            known = [*jobs, *(f"{j} (local)" for j in dict.fromkeys(local))]
            raise HpcdlError(
                f"--job {job}: not a job of {run_dir.path}; its jobs: "
                f"{', '.join(known) if known else 'none'}"
            )
        launch = Launch("slurm" if job in jobs else "local", job)
    path = log_file(run_dir, launch, rank)
    if not path.exists():
        active, state = is_running(run_dir, launch)
        if not active and state != "UNKNOWN":  # UNKNOWN: squeue failed, nothing to go by
            raise no_such_log(run_dir, launch, rank, state)
        world = started_world_size(run_dir, launch)
        if world is not None and rank >= world:  # running: its ranks are known
            raise HpcdlError(
                f"--rank {rank}: job {launch.job_id} ({state}) has world size {world}, ranks "
                f"0-{world - 1}; pass one of those"
            )
        if not follow:
            who = f"job {launch.job_id}" if launch.job_id else "the run"
            raise HpcdlError(f"{path}: no log yet ({who} may still be pending; try -f)")
    if not follow:
        copy_new(path, 0)
        return EXIT_OK
    # Slurm is asked at most every MIN_REFRESH_S; a foreground run's lock every second.
    refresh_s = 1.0 if launch.in_foreground else MIN_REFRESH_S
    offset, last_query, active = 0, 0.0, True
    while active:
        offset = copy_new(path, offset)
        if time.monotonic() - last_query >= refresh_s:
            active, last_query = is_running(run_dir, launch)[0], time.monotonic()
        time.sleep(1.0)
    copy_new(path, offset)
    return EXIT_OK


def cancel(ref: str) -> int:
    run_dir, launch = resolve(ref, "cancel")
    if run_dir is not None and launch.in_foreground:
        return cancel_foreground(run_dir, launch)
    assert launch.job_id is not None
    job_id = launch.job_id
    known = job_state(job_id)
    state, source = known["state"], known["source"]
    if source in (SQUEUE_FAILED, NO_SLURM):
        raise HpcdlError(f"job {job_id}: {unanswered(source, 'nothing was cancelled')}")
    if state == "UNKNOWN":  # the controller answers, and has no such job in its queue
        if run_dir is None and source == NOT_IN_ACCOUNTING:
            raise HpcdlError(
                f"job {job_id}: neither squeue nor sacct knows it; nothing to cancel (check "
                "the id: `squeue --me` lists your jobs)"
            )
        why = "it has ended" if run_dir is not None else "it has ended, or the id is wrong"
        print(f"job {job_id} is not in Slurm's queue ({why}); nothing to cancel")
        return EXIT_OK
    if state == "COMPLETING":  # cancelled a moment ago, say
        print(f"job {job_id} is ending (COMPLETING); nothing to cancel")
        return EXIT_OK
    if not is_active(state):  # scancel says nothing about those
        print(f"job {job_id} has already ended ({state}); nothing to cancel")
        return EXIT_OK
    try:
        out = subprocess.run(["scancel", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise HpcdlError(f"scancel {job_id} failed: {err}; run it where Slurm answers") from None
    if out.returncode != 0:
        said = out.stderr.strip().splitlines() or [f"exit status {out.returncode}"]
        raise HpcdlError(f"scancel {job_id} failed: {said[-1]}")  # its last word: the cause
    print(f"cancelled job {job_id}")
    return EXIT_OK


def cancel_foreground(run_dir: RunDir, launch: Launch) -> int:
    """Not a Slurm job: a running one is stopped where it runs (nothing is killed from here
    on the word of a pid file); an ended one needs nothing."""
    from hpcdl.runlock import describe as describe_holder
    from hpcdl.runlock import last_holder

    state = foreground_state(run_dir, launch)
    if state == "RUNNING":
        holder = last_holder(run_dir) or {}
        what = (
            "its program gets SIGTERM, and a second kill ends it"
            if _runs_a_program(run_dir)
            else "it saves a checkpoint"
        )
        raise HpcdlError(
            f"{run_dir.path} is trained in the foreground by {describe_holder(holder)}, not "
            f"by a Slurm job: stop it with Ctrl-C in its terminal, or `kill {holder.get('pid')}` "
            f"on its host ({what}; `hpcdl resume` continues it)"
        )
    if launch.launcher == "" and not run_dir.has_started():
        print(f"{run_dir.path}: not launched yet; nothing to cancel")
        return EXIT_OK
    print(
        f"{run_dir.path}: its last run, in the foreground, has ended ({state}); nothing to cancel"
    )
    return EXIT_OK


def _runs_a_program(run_dir: RunDir) -> bool:
    """An `hpcdl run` run: its config.yaml's `script:` is a mapping, not null."""
    return _config_has(run_dir, r"^script:\s*$")


def _runs_torchrun(run_dir: RunDir) -> bool:
    """An `hpcdl run` run with launcher=torchrun: one Slurm task, and log, per node."""
    return _config_has(run_dir, r"^\s+launcher: torchrun\s*$")


def _config_has(run_dir: RunDir, line: str) -> bool:
    """Whether config.yaml has a line matching `line` (read as text: the login node's
    commands load no config schema for this)."""
    try:
        text = run_dir.config_file.read_text()
    except OSError:
        return False
    return re.search(line, text, re.M) is not None
