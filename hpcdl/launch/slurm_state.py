"""Slurm's view of a job: squeue while it is queued or running, sacct once it has left the
queue (where accounting exists), arrays as a whole. Stdlib only; one query per call of
job_state for a job, more for an array or its task: sacct for the tasks that have left the
queue, and the array's batch script for the tasks it was submitted with (a task cancelled
while it waited is in no other record)."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Optional

from hpcdl.number_ranges import number_spans

NO_ACCOUNTING = "none (not queued; no accounting)"
NOT_IN_ACCOUNTING = "none (not queued; sacct does not know it)"
# No answer at all: the controller does not answer, or this machine has no Slurm.
SQUEUE_FAILED = "none (squeue failed)"
NO_SLURM = "none (Slurm's commands are not on PATH)"

ACTIVE_STATES = (
    "PENDING",
    "RUNNING",
    "REQUEUED",
    "CONFIGURING",
    "COMPLETING",
    "RESIZING",
    "SUSPENDED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "STOPPED",
    "SIGNALING",
    "STAGE_OUT",
)


# Ended without completing: `hpcdl status` and `hpcdl sweep status` exit 1 (what `sweep
# rerun --failed` reruns, but UNKNOWN and NOT_STARTED: nothing says those failed).
ENDED_UNFINISHED = (
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "OUT_OF_MEMORY",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "INTERRUPTED",
)


def is_active(state: str) -> bool:
    return state in ACTIVE_STATES


def query(cmd: list[str]) -> Optional[str]:
    """A command's stdout, or None when it failed (no accounting, controller down)."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def elapsed_text(seconds: float) -> str:
    """`[D-]HH:MM:SS`, sacct's Elapsed format: the one format hpcdl shows an elapsed time in
    (squeue's `0:06` normalized, a foreground attempt's from its records)."""
    days, rest = divmod(max(0, int(seconds)), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{days}-" if days else "") + f"{hours:02d}:{minutes:02d}:{secs:02d}"


def normalized_elapsed(slurm: str) -> str:
    """squeue's %M (`0:06`, `1:02:03`, `1-02:03:04`) or sacct's Elapsed (`00:00:06`) as
    elapsed_text(); anything else (`INVALID`) as Slurm wrote it."""
    days, _, clock = slurm.strip().rpartition("-")
    parts = clock.split(":")
    if not (days.isdigit() or days == "") or len(parts) > 3:
        return slurm
    if not all(part.isdigit() for part in parts):
        return slurm
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    return elapsed_text(int(days or 0) * 86400 + seconds)


# squeue's reason for a pending job (%R, in parentheses), in words: those that mean it
# will not start as it is say what to change. By prefix, the longest that matches.
PENDING_REASONS = {
    "Priority": "waiting behind jobs of higher priority",
    "Resources": "waiting for nodes with the requested resources to free up",
    "Dependency": "waiting for the job it depends on to end",
    "DependencyNeverSatisfied": "never starts: the job it depends on did not end as "
    "required; cancel it",
    "BeginTime": "waiting for its start time (--begin, or the delay Slurm gives a requeued job)",
    "QOSMaxWallDurationPerJobLimit": "never starts: cluster.timeout_min is over the QOS's "
    "MaxWall; resubmit with a lower cluster.timeout_min or another cluster.qos",
    "PartitionTimeLimit": "never starts: cluster.timeout_min is over the partition's MaxTime; "
    "resubmit with a lower cluster.timeout_min",
    "AssocGrp": "waiting for the account's group limit (its other jobs to end)",
    "AssocMax": "waiting for the account's per-user or per-job limit",
    "QOSMax": "waiting for the QOS's per-user limit (your other jobs in it to end)",
    "QOSGrp": "waiting for the QOS's group limit",
    "ReqNodeNotAvail": "waiting for requested nodes that are down, drained or reserved",
    "JobHeld": "held: `scontrol release JOBID` lets it go",
    "InvalidAccount": "never starts: the account is not valid here (cluster.account)",
    "InvalidQOS": "never starts: the QOS is not valid for the account (cluster.qos)",
    "BadConstraints": "never starts: no node has the requested features (cluster.constraint)",
}
# An account's or QOS's *Minutes limit used up (AssocGrpCPUMinutesLimit): its allocation.
USED_UP = (
    "waits until the allocation ({what}-minutes) is renewed: it is used up; ask your site, "
    "or use another cluster.account"
)


def pending_reason(where: str) -> Optional[str]:
    """'waiting behind jobs of higher priority (Priority)' for squeue's `(Priority)`; None
    for a reason not known here."""
    reason = where.strip().strip("()")
    minutes = re.match(r"(?:Assoc|QOS)Grp(\w+?)(?:Run)?MinutesLimit", reason)
    if minutes:
        return f"{USED_UP.format(what=minutes.group(1))} ({reason})"
    known = [prefix for prefix in PENDING_REASONS if reason.startswith(prefix)]
    if not known:
        return None
    return f"{PENDING_REASONS[max(known, key=len)]} ({reason})"


# What sacct tells of a job that has left the queue, before where it was charged.
SACCT_FIELDS = "JobID,State,Elapsed,ExitCode,NodeList"


def job_state(job_id: str) -> dict[str, str]:
    """squeue while queued/running; sacct once it has left the queue (if accounting exists)."""
    out = query(["squeue", "-h", "-j", job_id, "-o", "%i|%T|%M|%l|%D|%R|%P|%a|%q"])
    queue_answered = out is not None  # "" for a task of a queued array that it does not list
    # squeue also fails ("Invalid job id") for a job the controller has purged (MinJobAge):
    # accounting still knows it, so ask sacct before giving up.
    if out is not None and out.strip():
        lines = out.strip().splitlines()
        jid, state, elapsed, limit, nodes, where, *charged = lines[0].split("|")
        with_finished, accounted = _with_finished_tasks(job_id, lines)
        tasks = _array_tasks(job_id, with_finished)
        if tasks:  # the array as a whole, not whichever task squeue listed first
            # Without accounting a task that has ended is in no record either: not added.
            tasks = _with_unrecorded_tasks(job_id, tasks) if accounted else tasks
            return {
                "job_id": job_id,
                "state": array_state(tasks),
                "time_limit": normalized_elapsed(limit),
                "source": "squeue",
                "array_tasks": shown_tasks(tasks),
            }
        explained = pending_reason(where) if state == "PENDING" else None
        return {
            "job_id": jid,
            "state": state,
            "elapsed": normalized_elapsed(elapsed),
            "time_limit": normalized_elapsed(limit),  # 10:00 is ten minutes: 00:10:00
            "nodes": nodes,
            "where": where,
            **({"pending": explained} if explained else {}),
            **_charged_to(charged),
            "source": "squeue",
        }
    out = query(
        ["sacct", "-n", "-P", "-X", "-j", job_id, "-o", f"{SACCT_FIELDS},Partition,Account,QOS"]
    )
    if out and out.strip():
        lines = out.strip().splitlines()
        tasks = _array_tasks(job_id, lines)
        if tasks:
            tasks = _with_unrecorded_tasks(job_id, tasks)
            return {
                "job_id": job_id,
                "state": array_state(tasks),
                "source": "sacct",
                "array_tasks": shown_tasks(tasks),
            }
        jid, state, elapsed, code, nodes, *charged = lines[-1].split("|")
        return {
            "job_id": jid,
            "state": state.split()[0],
            "elapsed": normalized_elapsed(elapsed),
            "exit_code": code,
            "where": nodes,
            **_charged_to(charged),
            "source": "sacct",
        }
    if out is not None and not out.strip() and "_" in job_id:
        grouped = _in_array_record(job_id, queue_answered)
        if grouped is not None:
            return grouped
    if out is None and query(["squeue", "-h", "-o", "%i"]) is None:
        # The controller does not answer at all: say so, guess nothing.
        source = NO_SLURM if shutil.which("squeue") is None else SQUEUE_FAILED
        return {"job_id": job_id, "state": "UNKNOWN", "source": source}
    # The controller answers but no longer knows the job: it left the queue, and either
    # there is no accounting (sacct failed) or accounting never had it (a wrong id).
    source = NO_ACCOUNTING if out is None else NOT_IN_ACCOUNTING
    return {"job_id": job_id, "state": "UNKNOWN", "source": source}


def _charged_to(fields: list[str]) -> dict[str, str]:
    """The job's partition, account and QOS (squeue's %P %a %q, sacct's Partition, Account,
    QOS): which of a user's accounts or QOS a job charges, where it waits. Empty ones (no
    accounting: account `(null)`) are left out."""
    names = ("partition", "account", "qos")
    # An older answer (or a test's) without them: zip stops at the shorter.
    pairs = zip(names, fields, strict=False)
    return {k: v for k, v in pairs if v and v not in ("(null)", "N/A")}


# The source of an array task's state read from its array's sacct record.
ARRAY_RECORD = "sacct (the array's record"


def _in_array_record(job_id: str, queue_answered: bool) -> Optional[dict[str, str]]:
    """An array task that never ran as a job of its own (cancelled while it waited): sacct
    has no record of it, at most its array's for such tasks (`52_[1-2%1] CANCELLED`, or
    `52_[1-4%1] PENDING` until accounting catches up with squeue), and Slurm none at all
    once it dropped the task from the array's pending record (`scancel 52_3`: `52_[2-3%1]`
    becomes `52_[2%1]`); only the array's batch script still names it then."""
    array = job_id.partition("_")[0]
    out = query(["sacct", "-n", "-P", "-X", "-j", array, "-o", "JobID,State"]) or ""
    for line in out.strip().splitlines():
        record, _, state = line.partition("|")
        if record != job_id and job_id in task_ids(record):
            state = state.split()[0] if state.strip() else "UNKNOWN"
            if is_active(state) and queue_answered:  # squeue would list a waiting task
                return {
                    "job_id": job_id,
                    "state": "CANCELLED",
                    "source": f"{ARRAY_RECORD} {record}, still {state}: squeue does not list "
                    "the task, so it was cancelled before it ran)",
                }
            return {
                "job_id": job_id,
                "state": state,
                "source": f"{ARRAY_RECORD} {record}: it never ran)",
            }
    spec = submitted_spec(array)
    if spec is not None and job_id in task_ids(f"{array}_[{spec}]"):
        return {
            "job_id": job_id,
            "state": "CANCELLED",
            "source": f"the array's batch script (--array={spec}); no record of the task: it "
            "was cancelled before it ran",
        }
    return None


# sacct's one record for an array's tasks that have not run as their own job:
# 52_[1-2%1], 52_[1,3,5-7]. Cancelling the array ends them all under that record.
# sbatch's --array also takes steps (0-15:4), read as such in a batch script.
_SPEC = r"(?:\d+(?:-\d+(?::\d+)?)?,)*\d+(?:-\d+(?::\d+)?)?(?:%\d+)?"
_ARRAY_TASKS = re.compile(rf"^(\d+)_\[({_SPEC})\]$")


def task_ids(record: str) -> list[str]:
    """The tasks a sacct record stands for: 52_[1-2%1] -> 52_1, 52_2; 52_0 -> 52_0."""
    match = _ARRAY_TASKS.match(record)
    if match is None:
        return [record]
    array, spec = match.groups()
    tasks: list[str] = []
    for part in spec.partition("%")[0].split(","):
        span, _, step = part.partition(":")
        first, _, last = span.partition("-")
        numbers = range(int(first), int(last or first) + 1, max(1, int(step or 1)))
        tasks += [f"{array}_{k}" for k in numbers]
    return tasks


# `#SBATCH --array=0-3%2` (submitit writes it so), `--array 0-3`, `-a 0-3`.
_ARRAY_OPTION = re.compile(r"^#SBATCH\s+(?:--array[=\s]\s*|-a\s*)(\S+)", flags=re.M)


def submitted_spec(array_id: str) -> Optional[str]:
    """The --array an array was submitted with (`0-3%2`), from the batch script the
    controller keeps while any of its tasks is queued or running (and MinJobAge after);
    None once it has forgotten the array, or for a script without --array (an --array on
    sbatch's command line: only sacct's SubmitLine has it)."""
    script = query(["scontrol", "write", "batch_script", array_id, "-"]) or ""
    match = _ARRAY_OPTION.search(script)
    return match.group(1) if match and re.fullmatch(_SPEC, match.group(1)) else None


def _with_unrecorded_tasks(job_id: str, tasks: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """An array's tasks, with those it was submitted with that no record lists: cancelled
    before they ran (`scancel 52_3` while it waited drops it from the array's pending
    record, and Slurm keeps none of its own), one line per run (`52_3 CANCELLED`)."""
    spec = submitted_spec(job_id)
    if spec is None:
        return tasks
    listed = {task for jid, _ in tasks for task in task_ids(jid)}
    missing = [int(t.partition("_")[2]) for t in task_ids(f"{job_id}_[{spec}]") if t not in listed]
    cancelled = [
        (f"{job_id}_{a}" if a == b else f"{job_id}_[{a}-{b}]", "CANCELLED")
        for a, b in number_spans(missing)
    ]
    return sorted(tasks + cancelled, key=lambda task: _task_order(task[0]))


def _with_finished_tasks(job_id: str, queued: list[str]) -> tuple[list[str], bool]:
    """An array asked for by its own id while some of its tasks are still queued: squeue
    lists only those, so add the tasks that have left the queue from sacct (squeue's line
    wins for a task both list); and whether sacct answered."""
    if "_" in job_id or not any(line.startswith(f"{job_id}_") for line in queued):
        return queued, False
    answer = query(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State"])
    done = answer or ""
    in_queue = {line.split("|")[0] for line in queued}
    # Only task records: for its first seconds of running, sacct still lists the array as
    # `52|PENDING` (accounting not yet told that its tasks started), which is no task. Nor
    # is its pending record, which squeue's replaces: sacct's lags behind (`52_[1-4%1]`
    # after `scancel 52_2`, while squeue lists 52_[1,3-4%1]).
    finished = [
        line
        for line in done.strip().splitlines()
        if line.startswith(f"{job_id}_")
        and line.split("|")[0] not in in_queue
        and not ("[" in line and is_active(line.split("|")[1].split(" ")[0]))
    ]
    return sorted(finished + queued, key=_task_order), answer is not None


def _task_order(line: str) -> tuple[int, str]:
    """Array task lines in task order: 52_2 before 52_10, a range (52_[3-5%1]) at its first
    task, after that task's own line."""
    task = line.split("|")[0].partition("_")[2]
    first = re.match(r"\[?(\d+)", task)
    return (int(first.group(1)), "" if task.isdigit() else task) if first else (1 << 30, task)


def _array_tasks(job_id: str, lines: list[str]) -> list[tuple[str, str]]:
    """A job array asked for by its own id (`hpcdl status 52`): every task's id and state
    (a pending range as squeue or sacct writes it, `52_[3-5%1]`); [] for any other job."""
    tasks = [(jid, state.split()[0]) for jid, state, *_ in (line.split("|") for line in lines)]
    if "_" in job_id or not tasks or not all(t[0].startswith(f"{job_id}_") for t in tasks):
        return []
    return tasks


def shown_tasks(tasks: list[tuple[str, str]]) -> str:
    """`52_0 COMPLETED, 52_1 FAILED, ...`: the first 8 lines (a sweep's every trial: `hpcdl
    sweep status SWEEP_DIR`)."""
    shown = ", ".join(f"{jid} {state}" for jid, state in tasks[:8])
    return shown + (f", ... ({len(tasks)} lines)" if len(tasks) > 8 else "")


def array_state(tasks: list[tuple[str, str]]) -> str:
    """A job array's state from its tasks': while any is queued or running, RUNNING if one
    runs, else the first such task's (PENDING); once all have ended, COMPLETED only if every
    task completed, else the first other end (FAILED, CANCELLED, TIMEOUT, ...). Never one
    task's state for the whole: an array whose task 0 failed is not COMPLETED because its
    last task completed."""
    states = [state for _, state in tasks]
    active = [state for state in states if is_active(state)]
    if active:
        return "RUNNING" if "RUNNING" in active else active[0]
    return next((state for state in states if state != "COMPLETED"), "COMPLETED")
