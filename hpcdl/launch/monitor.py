"""`hpcdl status | logs | cancel`: one squeue (then sacct) call per refresh. Stdlib only.

Works on clusters without accounting: when sacct fails, the state comes from squeue and
the run dir (attempts.jsonl, summary.json).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any, Optional

from hpcdl.errors import HpcdlError
from hpcdl.exit_codes import EXIT_OK
from hpcdl.launch.diagnose import describe, root_cause
from hpcdl.launch.logtail import copy_new
from hpcdl.rundir import RunDir

# Polling interval floor: a busy scheduler should see at most one query per 10 s from us.
MIN_REFRESH_S = 10.0


NO_ACCOUNTING = "none (not queued; no accounting)"
NOT_IN_ACCOUNTING = "none (not queued; sacct does not know it)"

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


# Ended states whose cause is in the ranks' logs (not the scheduler's doing).
FAILED_STATES = ("FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL")


def is_active(state: str) -> bool:
    return state in ACTIVE_STATES


def resolve_job(ref: str) -> tuple[str, Optional[RunDir]]:
    """RUN_DIR (with a submission record) or a numeric JOB_ID -> (job id, run dir or None)."""
    path = Path(ref).expanduser()
    if path.is_dir():
        run_dir = RunDir(path.resolve())
        record = run_dir.read_submission()
        if record is None:
            raise HpcdlError(f"{ref}: no {RunDir.SUBMISSION}; this run was not submitted to Slurm")
        return str(record["job_id"]), run_dir
    if ref.replace("_", "").isdigit():
        return ref, None
    raise HpcdlError(f"{ref}: neither a run dir nor a Slurm job id")


def query(cmd: list[str]) -> Optional[str]:
    """A command's stdout, or None when it failed (no accounting, controller down)."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def job_state(job_id: str) -> dict[str, str]:
    """squeue while queued/running; sacct once it has left the queue (if accounting exists)."""
    out = query(["squeue", "-h", "-j", job_id, "-o", "%i|%T|%M|%l|%D|%R"])
    # squeue also fails ("Invalid job id") for a job the controller has purged (MinJobAge):
    # accounting still knows it, so ask sacct before giving up.
    if out is not None and out.strip():
        jid, state, elapsed, limit, nodes, where = out.strip().splitlines()[0].split("|")
        return {
            "job_id": jid,
            "state": state,
            "elapsed": elapsed,
            "time_limit": limit,
            "nodes": nodes,
            "where": where,
            "source": "squeue",
        }
    out = query(
        ["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State,Elapsed,ExitCode,NodeList"]
    )
    if out and out.strip():
        jid, state, elapsed, code, nodes = out.strip().splitlines()[-1].split("|")
        return {
            "job_id": jid,
            "state": state.split()[0],
            "elapsed": elapsed,
            "exit_code": code,
            "where": nodes,
            "source": "sacct",
        }
    if out is None and query(["squeue", "-h", "-o", "%i"]) is None:
        # The controller does not answer at all: say so, guess nothing.
        return {"job_id": job_id, "state": "UNKNOWN", "source": "none (squeue failed)"}
    # The controller answers but no longer knows the job: it left the queue, and either
    # there is no accounting (sacct failed) or accounting never had it (a wrong id).
    source = NO_ACCOUNTING if out is None else NOT_IN_ACCOUNTING
    return {"job_id": job_id, "state": "UNKNOWN", "source": source}


def job_report(job_id: str, run_dir: Optional[RunDir]) -> dict[str, Any]:
    """What `hpcdl status` prints (and Job.status() returns): the scheduler's view, the run
    dir's records, and the run dir's verdict once the scheduler has forgotten the job."""
    report = {**job_state(job_id), **run_status(run_dir)}
    if report["source"] not in (NO_ACCOUNTING, NOT_IN_ACCOUNTING):
        return report
    if run_dir is None:
        if report["source"] == NOT_IN_ACCOUNTING:
            raise HpcdlError(
                f"job {job_id}: neither squeue nor sacct knows it; check the id "
                "(`squeue --me` lists your queued jobs), or pass the run dir"
            )
        return report
    report["state"] = state_from_run_dir(run_dir)
    report["source"] = "run dir (" + report["source"].removeprefix("none (")
    return report


def state_from_run_dir(run_dir: RunDir) -> str:
    """A job that left the queue, judged by its run dir alone (no accounting): the last
    attempt's end record, or FAILED when it started and recorded no end (a crash, scancel,
    a node failure: rerunnable either way), or UNKNOWN when it never started."""
    if run_dir.is_complete():
        return "COMPLETED"
    events = run_dir.read_attempts()
    if not events:
        return "UNKNOWN"
    last = events[-1]
    if last.get("event") == "end" and last.get("reason") in ("timeout", "preempted"):
        return "TIMEOUT" if last["reason"] == "timeout" else "PREEMPTED"
    return "FAILED"


def run_status(run_dir: Optional[RunDir]) -> dict[str, Any]:
    if run_dir is None:
        return {}
    info: dict[str, Any] = {}
    attempts = run_dir.read_attempts()
    starts = [a for a in attempts if a.get("event") == "start"]
    info["attempts"] = len(starts)
    info["requeues"] = run_dir.requeues()
    ends = [a for a in attempts if a.get("event") == "end"]
    if ends:
        action = ends[-1].get("action")
        info["last_end"] = f"{ends[-1].get('reason')}" + (f" ({action})" if action else "")
    last = run_dir.metrics.last_row()
    if last is not None:
        info["last_epoch"] = last.get("epoch")
        info["last_metrics"] = {
            k: last[k] for k in ("train_loss", "val_loss", "val_accuracy") if k in last
        }
    for rank, record in sorted(run_dir.last_telemetry().items()):
        info[f"rank {rank}"] = describe_sample(record)
    summary = run_dir.read_summary()
    if summary is not None:
        info["test_accuracy"] = summary.get("test_accuracy")
        info["weights_sha256"] = summary.get("weights_sha256")
    return info


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
    job_id, run_dir = resolve_job(ref)
    while True:
        report = job_report(job_id, run_dir)
        if (
            run_dir is not None
            and report["state"] in FAILED_STATES
            and not stopped_itself(run_dir, job_id)
        ):
            log_dir = run_dir.rank_log(job_id, 0).parent
            report["cause"] = describe(root_cause(log_dir, job_id)) or (
                f"no error in the ranks' logs ({log_dir})"
            )
        for key, value in report.items():
            print(f"{key:>15}: {value}")
        if watch_s is None or not is_active(report["state"]):
            return EXIT_OK
        time.sleep(max(watch_s, MIN_REFRESH_S))
        print()


# End reasons of a job that stopped on a stop it recorded (hpcdl.launch.slurm_job).
STOPPED_ITSELF = ("timeout", "preempted", "cancelled", "requested", "requeued")


def stopped_itself(run_dir: RunDir, job_id: str) -> bool:
    """The job's last attempt ended on a stop it recorded (a time limit past
    cluster.max_requeues, a preemption, a cancel): `last_end` says why; its logs hold no
    error to look for (Slurm's banner of an earlier requeue is none)."""
    ends = [a for a in run_dir.read_attempts() if a.get("event") == "end"]
    last = ends[-1] if ends else {}
    return last.get("job_id") == job_id and last.get("reason") in STOPPED_ITSELF


def logs(ref: str, rank: int, follow: bool) -> int:
    job_id, run_dir = resolve_job(ref)
    if run_dir is None:
        raise HpcdlError(f"{ref}: give the run dir to read its logs (job ids carry no log path)")
    path = run_dir.rank_log(job_id, rank)
    if not follow:
        if not path.exists():
            raise HpcdlError(f"{path}: no log yet (job {job_id} may still be pending; try -f)")
        copy_new(path, 0)
        return EXIT_OK
    offset, last_query, active = 0, 0.0, True
    while active:
        offset = copy_new(path, offset)
        if time.monotonic() - last_query >= MIN_REFRESH_S:
            active, last_query = is_active(job_state(job_id)["state"]), time.monotonic()
        time.sleep(1.0)
    copy_new(path, offset)
    return EXIT_OK


def cancel(ref: str) -> int:
    job_id, _ = resolve_job(ref)
    state = job_state(job_id)["state"]
    if state != "UNKNOWN" and not is_active(state):  # scancel says nothing about those
        print(f"job {job_id} has already ended ({state}); nothing to cancel")
        return EXIT_OK
    out = subprocess.run(["scancel", job_id], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise HpcdlError(f"scancel {job_id} failed: {out.stderr.strip()}")
    print(f"cancelled job {job_id}")
    return EXIT_OK
