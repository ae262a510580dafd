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
    assert "rerunning 2 trials: 0-1" in rerun.stdout
    assert _states(sweep) == ["COMPLETED", "COMPLETED"]
    for i in (0, 1):
        assert "resuming run dir" in (sweep / str(i) / "trial.log").read_text()


FLAKY_STEP = """
import torch.nn.functional as F

calls = 0


def step(model, batch, ok=False):
    global calls
    calls += 1
    if calls > 3 and not ok:  # past the first-batch check: a failure in training
        raise RuntimeError("not ok")
    x, y = batch
    return F.cross_entropy(model(x), y), {}
"""


def test_a_rerun_takes_settings_for_its_trials_config_yaml_checked_first(
    hpcdl, tmp_path: Path
) -> None:
    """`sweep rerun --failed cluster.timeout_min=240` was refused (unrecognized arguments):
    a timed-out trial's longer limit took a sed on each config.yaml (persona, sweeps)."""
    (tmp_path / "flaky.py").write_text(FLAKY_STEP)
    env = {"PYTHONPATH": str(tmp_path)}
    small = ["data=synthetic", "data.num_samples=256", "data.shape=[4]", "trainer.max_epochs=1"]
    custom = ["task=custom", "task.target=flaky:step", "trainer.batch_size=16"]
    out = hpcdl("train", "-m", *small, *custom, "optim.lr=0.1,0.2", "hydra.sweep.dir=sw", env=env)
    assert out.returncode == 1 and _states(tmp_path / "sw") == ["FAILED", "FAILED"], out.stdout
    configs = {i: (tmp_path / "sw" / str(i) / "config.yaml").read_text() for i in (0, 1)}

    refused = [
        (["optim.lr=0.5"], "error: optim.lr: a swept key, whose value makes each trial what"),
        (["trainer.max_epochs=0"], "error: trial 0: trainer.max_epochs=0: must be > 0"),
    ]
    for given, line in refused:
        out = hpcdl("sweep", "rerun", "sw", "--failed", *given, env=env)
        assert out.returncode == 2 and out.stderr.startswith(line), out.stderr
    dry = hpcdl("sweep", "rerun", "sw", "--failed", "task.kwargs.ok=true", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert "# each with task.kwargs.ok=true in its config.yaml (nothing written)" in dry.stdout
    assert {i: (tmp_path / "sw" / str(i) / "config.yaml").read_text() for i in (0, 1)} == configs

    rerun = hpcdl("sweep", "rerun", "sw", "--failed", "task.kwargs.ok=true", env=env)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert _states(tmp_path / "sw") == ["COMPLETED", "COMPLETED"]
    assert "ok: true" in (tmp_path / "sw" / "0" / "config.yaml").read_text()
    summary = hpcdl("sweep", "summary", "sw", "--metric", "val_loss", env=env)
    assert "trial 1: rerun with task.kwargs.ok=true" in summary.stdout + summary.stderr
