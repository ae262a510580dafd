"""Exact resume: interrupted + resumed runs end with the same weights as uninterrupted ones.

Interruptions are real signals (SIGTERM through the same handler as Ctrl-C or scancel, and
SIGKILL), sent by the rank to itself at a chosen step (tests/fault_hook.py, a step hook), so the test hits
mid-epoch and epoch-boundary points on purpose. Each run is a fresh `hpcdl` process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpcdl.checkpoint import CheckpointStore
from tests import fault_hook

pytestmark = pytest.mark.slow

# Breast cancer MLP with dropout (so per-rank RNG state matters): 13 steps per epoch at
# batch 32 with 1 rank (399 training rows).
BASE = ["trainer.max_epochs=4", "trainer.checkpoint_every_steps=5"]
LOCAL2 = ["cluster=local", "cluster.tasks_per_node=2"]


def sha(run_dir: Path) -> str:
    return json.loads((run_dir / "summary.json").read_text())["weights_sha256"]


def metrics_without_timing(run_dir: Path) -> list[str]:
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    return [",".join(r.split(",")[:7]) for r in rows]


def train(hpcdl, run_dir: Path, extra: list[str], fault: str | None = None):
    hook = [fault_hook.OVERRIDE] if fault else []
    return hpcdl("train", f"run_dir={run_dir}", *BASE, *extra, *hook, env=fault_hook.env(fault))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory):
    """Uninterrupted runs, one per rank count, computed once."""
    from tests.conftest import run_hpcdl

    root = tmp_path_factory.mktemp("reference")
    refs = {}
    for ranks, extra in ((1, []), (2, LOCAL2)):
        run_dir = root / f"ranks{ranks}"
        out = run_hpcdl("train", f"run_dir={run_dir}", *BASE, *extra, cwd=root)
        assert out.returncode == 0, out.stderr + out.stdout
        refs[ranks] = run_dir
    assert sha(refs[1]) != sha(refs[2])  # different sharding of dropout RNG: a real check
    return refs


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize(
    "faults",
    [
        ["SIGTERM@7"],  # mid-epoch, between two step checkpoints
        ["SIGTERM@12"],  # the step before the first epoch boundary
        pytest.param(  # twice: early, then again mid-epoch 3 (Ctrl-C)
            ["SIGTERM@3", "SIGINT@30"], marks=pytest.mark.extended
        ),
    ],
    ids=["mid-epoch", "epoch-boundary", "twice"],
)
def test_sigterm_and_resume_is_exact(hpcdl, tmp_path, reference, ranks, faults):
    extra = LOCAL2 if ranks == 2 else []
    run_dir = tmp_path / "run"
    first = train(hpcdl, run_dir, extra, faults[0])
    assert first.returncode == 3, first.stderr + first.stdout
    assert "Continue with: hpcdl resume" in first.stdout
    assert not (run_dir / "summary.json").exists()
    for fault in faults[1:]:
        again = hpcdl("resume", str(run_dir), env=fault_hook.env(fault))
        assert again.returncode == 3, again.stderr + again.stdout
    final = hpcdl("resume", str(run_dir), env=fault_hook.env(None))
    assert final.returncode == 0, final.stderr + final.stdout
    assert "resumed from" in final.stdout
    assert sha(run_dir) == sha(reference[ranks])
    assert metrics_without_timing(run_dir) == metrics_without_timing(reference[ranks])


@pytest.mark.parametrize("ranks", [1, 2])
def test_async_checkpoint_sigterm_and_resume_is_exact(hpcdl, tmp_path, reference, ranks):
    """trainer.async_checkpoint=true on the CPU: every save is written by a background
    thread from a copy in host memory, while the loop goes on."""
    extra = [*(LOCAL2 if ranks == 2 else []), "trainer.async_checkpoint=true"]
    run_dir = tmp_path / "run"
    first = train(hpcdl, run_dir, extra, "SIGTERM@7")  # mid-epoch, after the save at step 5
    assert first.returncode == 3, first.stderr + first.stdout
    # The stop waited for its save: complete on disk, no temporary file left behind.
    latest = CheckpointStore(run_dir / "checkpoints").load_latest()
    assert latest is not None and latest[1]["progress"]["global_step"] == 8
    assert not list((run_dir / "checkpoints").glob(".*.tmp-*"))
    final = hpcdl("resume", str(run_dir), env=fault_hook.env(None))
    assert final.returncode == 0, final.stderr + final.stdout
    assert "step_000000008.pt" in final.stdout
    assert sha(run_dir) == sha(reference[ranks])
    assert metrics_without_timing(run_dir) == metrics_without_timing(reference[ranks])


def fail_after_step_6(event) -> None:  # a step hook: event is hpcdl.hooks.StepEvent
    if event.global_step == 6:
        raise RuntimeError("injected failure after step 6")


def test_an_error_waits_for_the_save_in_flight(tmp_path, monkeypatch):
    """In-process, with a slow disk: the save of step 5 is still being written when step 6
    fails; the error leaves fit() only once that checkpoint is complete."""
    from dataclasses import replace

    from hpcdl.cli.compose import compose_config
    from hpcdl.job import run_job
    from hpcdl.rundir import create_run_dir

    real_write = CheckpointStore._write

    def slow_write(self, state, step, is_best):
        time.sleep(0.5)
        return real_write(self, state, step, is_best)

    monkeypatch.setattr(CheckpointStore, "_write", slow_write)
    cfg = compose_config(
        [
            "cluster=debug",
            *BASE,
            "trainer.async_checkpoint=true",
            f"trainer.step_hooks=[{__name__}:fail_after_step_6]",
        ]
    )
    _, run = create_run_dir(replace(cfg, run_dir=str(tmp_path / "run")))
    with pytest.raises(RuntimeError, match="injected failure"):
        run_job(str(run.path))
    assert [step for step, _ in CheckpointStore(run.checkpoint_dir).list_steps()] == [5]
    assert not list(run.checkpoint_dir.glob(".*.tmp-*"))
    assert not [t for t in threading.enumerate() if t.name == "hpcdl-checkpoint"]


# 2 ranks: a rank SIGKILLed mid-run and the exact resume run in CI in test_your_code.py
@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=pytest.mark.extended)])
def test_sigkill_loses_at_most_one_interval_and_resume_is_exact(hpcdl, tmp_path, reference, ranks):
    extra = LOCAL2 if ranks == 2 else []
    run_dir = tmp_path / "run"
    # Killed right after step 23: no handler runs; the last checkpoint is step 20 (every 5).
    fault = "SIGKILL@23:rank1" if ranks == 2 else "SIGKILL@23"
    first = train(hpcdl, run_dir, extra, fault)
    assert first.returncode != 0
    steps = sorted(int(p.stem.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*.pt"))
    assert steps and 23 - steps[-1] <= 5
    final = hpcdl("resume", str(run_dir), env=fault_hook.env(None))
    assert final.returncode == 0, final.stderr + final.stdout
    assert sha(run_dir) == sha(reference[ranks])


def test_resume_extends_a_finished_run(hpcdl, tmp_path, reference):
    run_dir = tmp_path / "run"
    assert train(hpcdl, run_dir, [], None).returncode == 0
    assert sha(run_dir) == sha(reference[1])
    longer = hpcdl("resume", str(run_dir), "trainer.max_epochs=6")
    assert longer.returncode == 0, longer.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == 6 and summary["steps"] == 6 * 13
    assert len((run_dir / "metrics.csv").read_text().splitlines()) == 1 + 6


def test_a_resumed_run_keeps_no_checkpoint_file_mapped(hpcdl, tmp_path):
    """The resume maps the checkpoint it restores (mmap=True); from the first step on, the
    process must map no checkpoint file (a purged step file's space would stay taken, as an
    .nfs file on NFS)."""
    run_dir = tmp_path / "run"
    assert train(hpcdl, run_dir, ["trainer.max_epochs=2"]).returncode == 0
    mapped = tmp_path / "mapped.jsonl"
    longer = hpcdl(
        "resume",
        str(run_dir),
        "trainer.max_epochs=3",
        "trainer.step_hooks=[tests.mapped_files:record]",
        env={**fault_hook.env(None), "HPCDL_TEST_MAPPED": str(mapped)},  # tests/ importable
    )
    assert longer.returncode == 0, longer.stderr
    steps = [json.loads(line) for line in mapped.read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(2 * 13 + 1, 3 * 13 + 1))
    assert [s for s in steps if s["mapped"]] == []


# Slurm's scancel, preemption and time limit signal every process of the job step, the
# DataLoader's workers too (data read by workers: data.in_memory=false).
TO_ALL_WITH_WORKERS = [*LOCAL2, "data.in_memory=false", "data.num_workers=1"]


@pytest.mark.parametrize(
    ("launcher", "signum"),
    [
        ([], signal.SIGINT),
        (LOCAL2, signal.SIGTERM),
        (LOCAL2, signal.SIGINT),
        (LOCAL2, signal.SIGHUP),
        (TO_ALL_WITH_WORKERS, signal.SIGTERM),
    ],
    ids=[
        "debug-ctrl-c",
        "local-sigterm",
        "local-ctrl-c",
        "local-terminal-closed",
        "sigterm-to-all-with-workers",
    ],
)
def test_signal_to_the_foreground_command_stops_every_rank_with_a_checkpoint(
    tmp_path, launcher, signum
):
    """Ctrl-C / SIGTERM to `hpcdl train` itself, a closed terminal's SIGHUP, or SIGTERM to
    every process: all ranks save and stop (torch's DataLoader workers die of a SIGTERM that
    is not their parent's, and their rank then failed)."""
    run_dir = tmp_path / "run"
    proc = start_long_training(run_dir, launcher)
    # A terminal's Ctrl-C (and its hangup) reaches the whole foreground process group;
    # SIGTERM just the command.
    if signum in (signal.SIGINT, signal.SIGHUP) or launcher is TO_ALL_WITH_WORKERS:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3, output
    assert "error" not in output and "Continue with: hpcdl resume" in output
    assert list((run_dir / "checkpoints").glob("step_*.pt"))
    assert not (run_dir / "summary.json").exists()


def start_long_training(run_dir: Path, launcher: list[str]) -> subprocess.Popen:
    """`hpcdl train` in a session of its own, returned once its first epoch has ended (the
    ranks are training). Long enough (~100k steps; 350 per epoch) that a signal always lands
    mid-training."""
    cmd = [
        sys.executable,
        "-m",
        "hpcdl.cli.main",
        "train",
        f"run_dir={run_dir}",
        "data=synthetic",
        "data.num_samples=2000",
        "trainer.batch_size=4",
        "trainer.max_epochs=300",
        *launcher,
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=run_dir.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while not (run_dir / "metrics.csv").exists():
        assert proc.poll() is None and time.monotonic() < deadline, (
            proc.stdout.read() if proc.stdout else ""
        )
        time.sleep(0.2)
    return proc


def test_ranks_whose_launching_command_was_killed_save_stop_and_hold_the_run_dir(tmp_path):
    """SIGKILL to the foreground `hpcdl train` of a local run (its lock goes with it): the
    ranks notice, one of them takes the run dir's lock (a resume meanwhile is refused), and
    they save and stop. Before, they trained on unseen and a resume trained the same run dir
    a second time beside them."""
    from hpcdl.rundir import RunDir
    from hpcdl.runlock import RunDirBusy, hold

    run_dir = tmp_path / "run"
    proc = start_long_training(run_dir, LOCAL2)
    proc.kill()
    proc.communicate(timeout=60)
    logs = list((run_dir / "logs").glob("*_log.out"))

    def texts() -> str:
        return "".join(log.read_text() for log in logs)

    deadline = time.monotonic() + 60
    while "is gone: stopping at the next step" not in texts():  # both look once a second
        assert time.monotonic() < deadline, "the ranks went on training: " + texts()
        time.sleep(0.2)
    while True:  # a rank holds the lock (it took it before saying so) until they have exited
        try:
            with hold(RunDir(run_dir)):
                break
        except RunDirBusy as busy:
            assert "is being trained by pid" in str(busy)
            assert time.monotonic() < deadline + 60, "the ranks did not stop"
            time.sleep(0.2)
    assert "checkpoint saved" in texts(), texts()
    # Rank 0 wrote the end record the killed command could not: the attempt was stopped.
    ends = [a for a in RunDir(run_dir).read_attempts() if a.get("event") == "end"]
    assert [e["reason"] for e in ends] == ["interrupted"], ends
    assert not (run_dir / "summary.json").exists()
    steps = [p.name for p in (run_dir / "checkpoints").glob("step_*.pt")]
    assert steps and steps != ["step_000000350.pt"], steps  # a stop's own, past epoch 1


def test_a_stop_during_start_up_ends_before_the_first_step_and_resumes_exactly(
    hpcdl, tmp_path, reference
):
    """SIGTERM reaches rank 1 only, while the trainers are being built: both ranks agree
    before any step, stop where the run starts (a step-0 checkpoint), and the resumed run
    ends with the uninterrupted run's weights."""
    from tests import startup_stop

    run_dir = tmp_path / "run"
    first = hpcdl(
        "train", f"run_dir={run_dir}", *BASE, *LOCAL2, startup_stop.OVERRIDE,
        env={**fault_hook.env(None), startup_stop.ENV_VAR: "SIGTERM:rank1"},
    )  # fmt: skip
    assert first.returncode == 3, first.stderr + first.stdout
    assert "at global step 0; checkpoint saved" in first.stdout
    assert [p.name for p in (run_dir / "checkpoints").glob("step_*.pt")] == ["step_000000000.pt"]
    metrics = run_dir / "metrics.csv"
    assert not metrics.exists() or len(metrics.read_text().splitlines()) <= 1  # no epoch ran
    again = hpcdl("resume", str(run_dir), env=fault_hook.env(None))
    assert again.returncode == 0, again.stderr + again.stdout
    assert sha(run_dir) == sha(reference[2])


def test_a_hangup_stops_a_run_unless_nohup_ignores_it() -> None:
    from hpcdl.job import stop_signal_names
    from hpcdl.signals import stop_on_signals

    assert "SIGHUP" in stop_signal_names("USR2")
    saved = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as `nohup hpcdl train` starts
    try:
        with stop_on_signals(("SIGTERM", "SIGHUP")) as flag:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.1)
            assert not flag.requested  # the run outlives the terminal
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        with stop_on_signals(("SIGTERM", "SIGHUP")) as flag:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.1)
            assert flag.signal_name == "SIGHUP"
    finally:
        signal.signal(signal.SIGHUP, saved)
