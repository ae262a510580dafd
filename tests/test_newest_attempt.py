"""A completed run resumed for more epochs (`hpcdl resume RUN trainer.max_epochs=N`) keeps
its first attempt's summary.json: the newest attempt's end record, not that file, says how
the run stands, whichever launcher ran it. The records are written by the code that writes
them in a job (hpcdl.launch.slurm_job.main, hpcdl.launch.foreground); the scheduler's
answers are scripted."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hpcdl.cli.compose import compose_config
from hpcdl.cli.expand import plan_sweep
from hpcdl.cli.main import main
from hpcdl.launch.foreground import SWEEP_VAR, record_end, record_start
from hpcdl.launch.slurm_state import ENDED_UNFINISHED
from hpcdl.rundir import RunDir, create_run_dir


class Killed(BaseException):
    """The job killed mid-attempt (SIGKILL, a node failure): slurm_job.main writes no end."""


def slurm_job(
    run: RunDir, monkeypatch, job_id: str, ends: Callable[[RunDir], Any], array: str = ""
) -> None:
    """One attempt of Slurm job `job_id` (array task `array`, "52_0") as its rank 0 records
    it: `ends(run_dir)` is what training did (a JobOutcome, or an exception raised)."""
    from hpcdl.launch import slurm_job as job

    variables = ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID")
    for name in (*variables, "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", job_id)
    monkeypatch.setenv("SLURM_PROCID", "0")
    if array:
        array_job, task = array.split("_")
        monkeypatch.setenv("SLURM_ARRAY_JOB_ID", array_job)
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", task)
    monkeypatch.setattr(job, "seconds_left", lambda job_id: 3000.0)  # not a time limit
    monkeypatch.setattr(job, "restarts_now", lambda job_id: None)  # scontrol: none
    # The real record but for its versions and GPU (they import torch).
    monkeypatch.setattr(
        job,
        "start_record",
        lambda env, n: {
            "event": "start",
            "job_id": env.job_id,
            "array_job": os.environ.get("SLURM_ARRAY_JOB_ID"),
            "array_task": os.environ.get("SLURM_ARRAY_TASK_ID"),
            "restart_count": env.restart_count,
            "start": job._now(),
        },
    )
    monkeypatch.setattr("hpcdl.job.run_job", lambda run_dir, stop: ends(RunDir(Path(run_dir))))
    with contextlib.suppress(SystemExit, RuntimeError, Killed):  # as the job would leave
        job.main(str(run.path))


def completes(run_dir: RunDir) -> Any:
    from hpcdl.job import JobOutcome

    summary = {"test_accuracy": 0.9}
    run_dir.write_summary(summary)  # as the trainer's rank 0 does (hpcdl.finalize)
    return JobOutcome(0, completed=True, signal_name=None, summary=summary, global_step=10)


def cancelled(run_dir: RunDir) -> Any:
    from hpcdl.job import JobOutcome

    return JobOutcome(0, completed=False, signal_name="SIGTERM", summary={}, global_step=12)


def fails(run_dir: RunDir) -> Any:
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def killed(run_dir: RunDir) -> Any:
    raise Killed


def status_lines(ref: str, capsys) -> dict[str, str]:
    """`hpcdl status`'s lines; exit status 1 for a run that ended without completing."""
    code = main(["status", ref])
    lines = capsys.readouterr().out.splitlines()
    report = {k.strip(): v.strip() for k, _, v in (line.partition(": ") for line in lines)}
    assert code == (1 if report["state"] in ENDED_UNFINISHED else 0), report
    return report


@pytest.mark.parametrize(
    ("ends", "state", "last_end"),
    [
        (cancelled, "CANCELLED", "cancelled"),
        (fails, "FAILED", "failed: RuntimeError: CUDA error: an illegal memory access"),
        (killed, "FAILED", "none recorded: killed"),  # not the first attempt's completed
    ],
)
def test_a_completed_slurm_run_resumed_then_stopped_is_not_completed(
    tmp_path, monkeypatch, capsys, ends, state, last_end
) -> None:
    run = create_run_dir(compose_config([f"run_dir={tmp_path / 'run'}", "cluster=devcluster"]))[1]
    run.record_submission("22", "devcluster", run.log_dir)
    slurm_job(run, monkeypatch, "22", completes)
    run.record_submission("23", "devcluster", run.log_dir)  # resumed for more epochs
    slurm_job(run, monkeypatch, "23", ends)
    assert run.is_complete()  # the first attempt's summary.json is still there
    # No accounting: once squeue no longer lists job 23, its run dir decides.
    monkeypatch.setattr(
        "hpcdl.launch.slurm_state.query", lambda cmd: "" if "squeue" in cmd else None
    )
    report = status_lines(str(run.path), capsys)
    assert (report["job_id"], report["state"]) == ("23", state)  # was COMPLETED
    assert report["last_end"].startswith(last_end) and report["attempts"] == "2"
    assert report["source"] == "run dir (not queued; no accounting)"


def test_a_completed_run_is_completed_and_a_run_dir_without_records_by_its_summary(
    tmp_path, monkeypatch, capsys
) -> None:
    from hpcdl.launch.monitor import state_from_run_dir

    run = create_run_dir(compose_config([f"run_dir={tmp_path / 'run'}", "cluster=devcluster"]))[1]
    run.record_submission("22", "devcluster", run.log_dir)
    slurm_job(run, monkeypatch, "22", cancelled)
    run.record_submission("23", "devcluster", run.log_dir)
    slurm_job(run, monkeypatch, "23", completes)  # resumed after the cancel: completed
    assert state_from_run_dir(run) == "COMPLETED"
    old = create_run_dir(compose_config([f"run_dir={tmp_path / 'old'}"]))[1]
    old.write_summary({"test_accuracy": 0.9})  # trained before hpcdl recorded attempts
    assert state_from_run_dir(old) == "COMPLETED"


def test_a_foreground_resume_of_a_completed_run_is_judged_by_its_own_end(tmp_path, capsys) -> None:
    run = create_run_dir(compose_config([f"run_dir={tmp_path / 'run'}"]))[1]
    record_start(run, "local", "4711", 1)
    run.write_summary({"test_accuracy": 0.9})
    record_end(run, "local", "4711", 0)
    for launcher, job_id, code, state in [
        ("local", "4712", 3, "INTERRUPTED"),  # Ctrl-C
        ("debug", None, 1, "FAILED"),
        ("local", "4713", 0, "COMPLETED"),
    ]:
        record_start(run, launcher, job_id, 1)
        record_end(run, launcher, job_id, code)
        assert status_lines(str(run.path), capsys)["state"] == state


def test_a_foreground_run_killed_after_its_summary_is_completed(tmp_path, capsys) -> None:
    """Killed after it trained to the end and wrote summary.json, before its end record
    (while it plotted, or closed its trackers): COMPLETED, with its test metrics, and a
    last_end that says so (was FAILED). A summary from before the attempt started is an
    earlier attempt's: the run stays FAILED."""
    run = create_run_dir(compose_config([f"run_dir={tmp_path / 'run'}"]))[1]
    record_start(run, "local", "4711", 1)
    run.write_summary({"test_accuracy": 0.9, "weights_sha256": "ab"})  # then SIGKILL
    report = status_lines(str(run.path), capsys)
    assert report["state"] == "COMPLETED"
    assert report["last_end"] == (
        "none recorded: killed after it completed (its summary.json is there)"
    )
    assert (report["test_metrics"], report["weights_sha256"]) == ("test_accuracy 0.9", "ab")

    old = time.time() - 3600  # resumed for more epochs, killed: the summary is older
    os.utime(run.summary_file, (old, old))
    report = status_lines(str(run.path), capsys)
    assert report["state"] == "FAILED"
    assert report["last_end"].startswith("none recorded: killed (SIGKILL")
    assert "test_metrics" not in report


def _slurm_sweep(tmp_path: Path) -> Path:
    """Two trials of array 52, both completed by their first job."""
    from hpcdl.sweep import launch
    from hpcdl.sweep import ledger as ledger_mod

    sweep = tmp_path / "sw"
    launch.create_sweep(plan_sweep(["optim.lr=0.1,0.01", f"hydra.sweep.dir={sweep}"]))
    with ledger_mod.locked(sweep) as led:
        led.launcher = "slurm"
        led.submissions.append({"array_job_id": "52", "trials": [0, 1], "time": 0.0})
        for t in led.trials:
            t.job_id, t.attempts = f"52_{t.index}", 1
    return sweep


@pytest.mark.parametrize("accounting", [True, False])
def test_a_completed_trial_resumed_then_cancelled_is_cancelled(
    tmp_path, monkeypatch, accounting
) -> None:
    from hpcdl.sweep import report, states

    sweep = _slurm_sweep(tmp_path)
    for index in (0, 1):
        trial = RunDir(sweep / str(index))
        trial.record_submission(f"52_{index}", "devcluster", trial.log_dir)
        slurm_job(trial, monkeypatch, str(53 + index), completes, array=f"52_{index}")
    # `hpcdl resume SWEEP/0 trainer.max_epochs=N` submitted job 60, then `scancel 60`.
    trial = RunDir(sweep / "0")
    trial.record_submission("60", "devcluster", trial.log_dir)
    slurm_job(trial, monkeypatch, "60", cancelled)
    # Job 53 (trial 1) aborted in its teardown after finishing: sacct's FAILED.
    sacct = "52_0|COMPLETED\n52_1|FAILED\n60|CANCELLED by 1000\n" if accounting else None
    monkeypatch.setattr(states, "query", lambda cmd: sacct if cmd[0] == "sacct" else "")
    ledger, _ = report.refresh(sweep)
    assert [(t.job_id, t.state) for t in ledger.trials] == [
        ("60", "CANCELLED"),  # was COMPLETED: the first job's summary.json
        ("52_1", "COMPLETED"),  # its newest attempt completed: the run dir's last word
    ]


def test_a_local_trial_resumed_by_hand_then_interrupted_is_interrupted(tmp_path, monkeypatch):
    from hpcdl.sweep import launch, report
    from hpcdl.sweep import ledger as ledger_mod

    sweep = tmp_path / "sw"
    plan = ["cluster=local", "optim.lr=0.1,0.01", f"hydra.sweep.dir={sweep}"]
    launch.create_sweep(plan_sweep(plan))
    with ledger_mod.locked(sweep) as led:
        assert led.launcher == "local"
        for t in led.trials:  # the pool's attempts, both completed
            t.state, t.attempts = "COMPLETED", 1
    for index in (0, 1):
        trial = RunDir(sweep / str(index))
        monkeypatch.setenv(SWEEP_VAR, "1")
        record_start(trial, "local", str(4700 + index), 1)
        trial.write_summary({"test_accuracy": 0.9})
        record_end(trial, "local", str(4700 + index), 0)
    monkeypatch.delenv(SWEEP_VAR)
    # `hpcdl resume SWEEP/0 trainer.max_epochs=N cluster=local`, stopped with Ctrl-C.
    record_start(RunDir(sweep / "0"), "local", "4711", 1)
    record_end(RunDir(sweep / "0"), "local", "4711", 3)
    ledger, _ = report.refresh(sweep)
    assert [t.state for t in ledger.trials] == ["INTERRUPTED", "COMPLETED"]  # was COMPLETED


def test_a_resume_the_job_refused_at_once_leaves_a_completed_run_completed(
    tmp_path, capsys
) -> None:
    """A resume whose job refused at once (a checkpoint that does not fit a changed model,
    exit 2) left config.yaml as it was, yet the run became FAILED (helper B); it stays
    COMPLETED. A refused attempt that wrote a checkpoint first did change the run: FAILED."""
    run = str(tmp_path / "run")
    assert main(["train", f"run_dir={run}", "trainer.max_epochs=1"]) == 0
    assert main(["resume", run, "trainer.max_epochs=2", "model.hidden_sizes=[8]"]) == 2
    capsys.readouterr()
    end = RunDir(Path(run)).read_attempts()[-1]
    assert (end["reason"], end.get("exit_code")) == ("failed", 2)  # cluster=debug says why
    status = status_lines(run, capsys)
    assert (status["state"], status["last_end"], status["attempts"]) == (
        "COMPLETED",
        "completed",
        "2",
    )
    newest = max(Path(run, "checkpoints").glob("step_*.pt"))
    os.utime(newest)  # as if the refused attempt had saved it
    assert status_lines(run, capsys)["state"] == "FAILED"
