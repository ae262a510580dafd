"""A run dir has one writer: a second `hpcdl resume` is refused while the first trains, a
killed holder leaves no stale lock, and a run whose checkpoints are gone is not silently
retrained into the same history."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from hpcdl.rundir import MetricsLog
from tests.conftest import run_hpcdl

SLOW_HOOK = "import time\n\ndef after_step(event):\n    time.sleep(0.05)\n"


def epochs(run_dir: Path) -> list[int]:
    return [int(row["epoch"]) for row in MetricsLog(run_dir / "metrics.csv").read()]


def wait_for(predicate, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_second_resume_is_refused_and_a_killed_holder_leaves_no_stale_lock(tmp_path) -> None:
    (tmp_path / "slow.py").write_text(SLOW_HOOK)
    run = tmp_path / "r"
    assert (
        run_hpcdl("train", f"run_dir={run}", "trainer.max_epochs=2", cwd=tmp_path).returncode == 0
    )
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpcdl.cli.main",
            "resume",
            str(run),
            "trainer.max_epochs=60",
            "trainer.step_hooks=[slow:after_step]",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: len(epochs(run)) >= 3)
        commands = (run / "commands.log").read_text()
        second = run_hpcdl("resume", str(run), "trainer.max_epochs=3", cwd=tmp_path)
        assert second.returncode == 2
        line = second.stderr.strip()
        assert len(line.splitlines()) == 1, line
        assert f"is being trained by pid {first.pid}" in line and "hpcdl cancel" in line
        # It changed nothing: not the config, not the command log.
        assert "max_epochs: 60" in (run / "config.yaml").read_text()
        assert (run / "commands.log").read_text() == commands
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # The kernel dropped the dead holder's lock: the lock file left behind does not block.
    assert (run / ".run.lock").exists()
    third = run_hpcdl(
        "resume", str(run), "trainer.max_epochs=8", "trainer.step_hooks=[]", cwd=tmp_path
    )
    assert third.returncode == 0, third.stderr
    assert epochs(run) == list(range(1, 9))  # every epoch once, in order


def test_lost_checkpoints_are_refused_unless_from_scratch(tmp_path) -> None:
    run = tmp_path / "r"
    assert (
        run_hpcdl("train", f"run_dir={run}", "trainer.max_epochs=3", cwd=tmp_path).returncode == 0
    )
    summary = (run / "summary.json").read_text()
    for path in (run / "checkpoints").iterdir():
        path.unlink()
    refused = run_hpcdl("resume", str(run), cwd=tmp_path)
    assert refused.returncode == 2
    assert "no checkpoint" in refused.stderr and "--from-scratch" in refused.stderr
    assert epochs(run) == [1, 2, 3] and (run / "summary.json").read_text() == summary
    again = run_hpcdl("resume", str(run), "--from-scratch", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert epochs(run) == [1, 2, 3]  # retrained, not appended to the old history
    # Checkpoints that are all damaged (cut short, not hpcdl's) are refused the same way, by
    # the command itself before any launch: a Slurm resume queued a job that failed so.
    for path in (run / "checkpoints").glob("step_*"):
        path.write_bytes(path.read_bytes()[:1000])
    damaged = run_hpcdl("resume", str(run), "trainer.max_epochs=5", cwd=tmp_path)
    assert damaged.returncode == 2
    assert re.search(
        r"none of its \d+ checkpoints? is whole \(.*step_\d+\.pt: truncated", damaged.stderr
    )
    assert "holds no valid checkpoint" in damaged.stderr and "--from-scratch" in damaged.stderr
    assert "local job" not in damaged.stdout, damaged.stdout  # nothing launched
    assert epochs(run) == [1, 2, 3]


def test_one_epoch_without_a_checkpoint_is_a_kill_before_the_first_save(tmp_path) -> None:
    run = tmp_path / "r"
    assert (
        run_hpcdl("train", f"run_dir={run}", "trainer.max_epochs=1", cwd=tmp_path).returncode == 0
    )
    for path in (run / "checkpoints").iterdir():
        path.unlink()
    out = run_hpcdl("resume", str(run), "trainer.max_epochs=2", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert epochs(run) == [1, 2]
