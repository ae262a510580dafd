"""A local sweep's trials that fail or are stopped (`hpcdl train -m` / `hpcdl run -m`
without Slurm): the cause of a failure as the trial ends and in `sweep status`, the exit
status of `sweep rerun --failed`, and Ctrl-C while the trials are still starting."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

FIT = """
import sys
lr = float(sys.argv[1].split("=")[1])
if lr < 0:
    raise ValueError(f"Invalid learning rate: {lr}")
"""


def _states(sweep: Path) -> list[str]:
    return [t["state"] for t in json.loads((sweep / "sweep.json").read_text())["trials"]]


def test_a_local_trial_that_raises_prints_its_exception_and_sweep_status_shows_it(
    hpcdl, tmp_path: Path
) -> None:
    # Its log ends with a traceback and no `error:` line: the cause was only in trial.log.
    (tmp_path / "fit.py").write_text(FIT)
    out = hpcdl("run", "-m", "hydra.sweep.dir=sw", "--", "python", "fit.py", "--lr={0.1,-1}")
    assert out.returncode == 1, out.stdout + out.stderr
    cause = "trial 1 failed: ValueError: Invalid learning rate: -1.0"
    assert cause in out.stdout.splitlines(), out.stdout
    status = hpcdl("sweep", "status", "sw")
    assert status.returncode == 1 and status.stdout.endswith(f"1 COMPLETED, 1 FAILED\n{cause}\n")

    # The rerun's own cause, not the first attempt's (trial.log holds both).
    # Its last line before hpcdl's (argparse's error; the pool's run dir line is not it).
    (tmp_path / "fit.py").write_text("raise SystemExit('fit.py: error: argument --lr')\n")
    rerun = hpcdl("sweep", "rerun", "sw", "--failed")
    cause = "trial 1 failed: the program exited with status 1: fit.py: error: argument --lr"
    assert cause in rerun.stdout.splitlines(), rerun.stdout
    assert hpcdl("sweep", "status", "sw").stdout.endswith(f"FAILED\n{cause}\n")


def test_sweep_rerun_exits_1_when_every_rerun_trial_fails(hpcdl, tmp_path: Path) -> None:
    # As `hpcdl run -m` does: a script running `sweep rerun --failed` must see it.
    (tmp_path / "fit.py").write_text(FIT)
    out = hpcdl("run", "-m", "hydra.sweep.dir=sw", "--", "python", "fit.py", "--lr={-2,-1}")
    assert out.returncode == 1, out.stdout + out.stderr
    rerun = hpcdl("sweep", "rerun", "sw", "--failed")
    assert "2 of 2 trials failed: hpcdl sweep status" in rerun.stdout, rerun.stdout
    assert rerun.returncode == 1, rerun.stdout + rerun.stderr
    assert _states(tmp_path / "sw") == ["FAILED", "FAILED"]


def test_a_trial_config_edited_by_hand_is_checked_before_its_rerun(hpcdl, tmp_path: Path) -> None:
    """sweeps.md's fix for a failed trial, editing its config.yaml, was rerun unchecked
    and failed again on its node (persona, sweeps): now one line names the trial."""
    small = ["data=synthetic", "data.num_samples=128", "data.shape=[4]", "trainer.max_epochs=1"]
    out = hpcdl(
        "train", "-m", *small, "trainer.max_bad_steps=1", "optim.lr=0.1,1e30", "hydra.sweep.dir=sw"
    )
    assert out.returncode == 1 and _states(tmp_path / "sw") == ["COMPLETED", "FAILED"]
    config = tmp_path / "sw" / "1" / "config.yaml"
    config.write_text(config.read_text().replace("lr: 1.0e+30", "lr: -1"))
    for dry in ([], ["--dry-run"]):
        rerun = hpcdl("sweep", "rerun", "sw", "--failed", *dry)
        assert rerun.returncode == 2, rerun.stdout + rerun.stderr
        assert (
            rerun.stderr == f"error: trial 1: {config}: optim.lr=-1.0: must be > 0; fix it there\n"
        )
        assert "rerunning" not in rerun.stdout
    assert _states(tmp_path / "sw") == ["COMPLETED", "FAILED"]


@pytest.mark.slow
def test_ctrl_c_as_a_local_sweeps_trials_start_interrupts_them(hpcdl, tmp_path: Path) -> None:
    """Ctrl-C right after the last trial started (its process still importing): the pool
    passes the stop on once each trial listens, so each saves and is INTERRUPTED (exit 3),
    and `sweep rerun --failed` continues them. The stop used to kill them: FAILED (-15)."""
    sweep = tmp_path / "sw"
    cmd = [sys.executable, "-m", "hpcdl.cli.main", "train", "-m", "trainer.max_epochs=20"]
    proc = subprocess.Popen(
        [*cmd, "optim.lr=0.01,0.02", f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + 120
    while not (seen and seen[-1].startswith("trial 1 (optim.lr=0.02): started")):
        assert proc.poll() is None and time.monotonic() < deadline, "".join(seen)
        seen.append(proc.stdout.readline())
    proc.send_signal(signal.SIGINT)
    output = "".join(seen) + proc.communicate(timeout=240)[0]
    assert proc.returncode == 3, output
    assert "trial 0: INTERRUPTED (exit 3)" in output and "FAILED" not in output, output
    assert output.rstrip().endswith(
        f"interrupted. Continue with: hpcdl sweep rerun {sweep} --failed"
    ), output
    assert _states(sweep) == ["INTERRUPTED", "INTERRUPTED"]
    assert all(list((sweep / str(i) / "checkpoints").glob("step_*.pt")) for i in (0, 1))

    rerun = hpcdl("sweep", "rerun", str(sweep), "--failed")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "rerunning trials [0, 1]" in rerun.stdout
    assert _states(sweep) == ["COMPLETED", "COMPLETED"]
    for i in (0, 1):
        assert "resuming run dir" in (sweep / str(i) / "trial.log").read_text()
