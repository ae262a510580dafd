"""hpcdl.launch.rank_main: a rank whose job has returned exits without the process
teardown that, with DDP's process group still alive, aborts now and then.

Each job here registers os.abort as an exit handler: a stand-in for that teardown which
aborts every time. Through submitit's own entry (the control) the process dies of SIGABRT;
through ours it exits with the job's status, after its non-daemon threads have finished.
"""

from __future__ import annotations

import atexit
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from submitit.core.utils import DelayedSubmission

ROOT = Path(__file__).resolve().parents[1]
JOB_ID = "42"
OPEN_POOLS: list[ThreadPoolExecutor] = []


def finish_with_a_late_thread(marker: str) -> int:
    """Returns 7; a non-daemon thread writes marker 0.5 s later; teardown aborts."""

    def late() -> None:
        time.sleep(0.5)
        Path(marker).write_text("written")

    threading.Thread(target=late).start()
    # An executor left open: its idle worker is a non-daemon thread that ends only when
    # threading's exit hook tells it to (a plain join of every thread would hang here).
    OPEN_POOLS.append(ThreadPoolExecutor(max_workers=1))
    OPEN_POOLS[-1].submit(print, "pool task ran")
    atexit.register(os.abort)
    return 7


def stop_with(code: int) -> None:
    atexit.register(os.abort)
    sys.exit(code)


def fail() -> None:
    raise ValueError("the job's own error")


def return_a_failure() -> object:
    """What `hpcdl run`'s job returns for a program that failed: an outcome, not a raise."""
    from hpcdl.job import JobOutcome

    return JobOutcome(1, False, None, {}, 0, failed_exit_code=5)


def run_rank(folder: Path, module: str, fn, *args) -> subprocess.CompletedProcess[str]:
    folder.mkdir(parents=True, exist_ok=True)
    DelayedSubmission(fn, *args).dump(folder / f"{JOB_ID}_submitted.pkl")
    env = {
        **os.environ,
        "SUBMITIT_EXECUTOR": "local",
        "SUBMITIT_LOCAL_JOB_ID": JOB_ID,
        "SUBMITIT_LOCAL_NTASKS": "1",
        "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
        "SUBMITIT_LOCAL_NODEID": "0",
        "SUBMITIT_LOCAL_GLOBALID": "0",
        "SUBMITIT_LOCAL_LOCALID": "0",
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.run(
        [sys.executable, "-u", "-m", module, str(folder)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def result(folder: Path) -> tuple[str, object]:
    with open(folder / f"{JOB_ID}_0_result.pkl", "rb") as f:
        return pickle.load(f)


def test_a_finished_rank_exits_0_after_its_threads_without_the_teardown(tmp_path: Path) -> None:
    control = run_rank(
        tmp_path / "control", "submitit.core._submit", finish_with_a_late_thread, str(tmp_path / "c")
    )
    assert control.returncode == -signal.SIGABRT, control.stderr  # the stand-in does abort

    marker = tmp_path / "marker"
    out = run_rank(tmp_path / "ours", "hpcdl.launch.rank_main", finish_with_a_late_thread, str(marker))
    assert out.returncode == 0, out.stderr
    assert result(tmp_path / "ours") == ("success", 7)
    assert marker.read_text() == "written"  # the thread ran to its end before the exit
    assert "Exiting after successful completion" in out.stdout + out.stderr  # flushed


def test_a_job_that_returns_a_failure_does_not_log_a_success(tmp_path: Path) -> None:
    out = run_rank(tmp_path / "ours", "hpcdl.launch.rank_main", return_a_failure)
    log = out.stdout + out.stderr
    assert "completed successfully" not in log and "successful completion" not in log, log
    assert "Job ended: failed (status 5), not a success" in log
    status, outcome = result(tmp_path / "ours")  # the launcher still reads the outcome
    assert status == "success" and getattr(outcome, "failed_exit_code", None) == 5


@pytest.mark.parametrize("code", [3, 2])
def test_a_job_that_calls_sys_exit_leaves_with_its_status(tmp_path: Path, code: int) -> None:
    control = run_rank(tmp_path / "control", "submitit.core._submit", stop_with, code)
    assert control.returncode == -signal.SIGABRT
    out = run_rank(tmp_path / "ours", "hpcdl.launch.rank_main", stop_with, code)
    assert out.returncode == code, out.stderr


def test_a_failing_job_exits_1_with_its_traceback_and_error_pickle(tmp_path: Path) -> None:
    out = run_rank(tmp_path / "ours", "hpcdl.launch.rank_main", fail)
    assert out.returncode == 1
    assert "ValueError: the job's own error" in out.stderr
    status, text = result(tmp_path / "ours")
    assert status == "error" and "the job's own error" in str(text)


def test_wrong_arguments_print_the_usage(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hpcdl.launch.rank_main"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "usage: python -m hpcdl.launch.rank_main LOG_DIR" in out.stderr
