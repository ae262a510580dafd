"""docs/examples/fsdp_train.py, scripts.md's FSDP2 + torch.distributed.checkpoint recipe,
under `hpcdl run` on 2 local ranks: stopped with Ctrl-C and resumed, its final weights are
those of an uninterrupted run, and a checkpoint folder cut short is never loaded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from tests.conftest import REPO

SCRIPT = REPO / "docs" / "examples" / "fsdp_train.py"
RANKS = ["cluster=local", "cluster.tasks_per_node=2"]


def hpcdl_run(cwd: Path, run_dir: str, *args: str) -> subprocess.Popen:
    command = ["python", str(SCRIPT), "--steps", "200", *args]
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpcdl.cli.main",
            "run",
            *RANKS,
            f"run_dir={run_dir}",
            "--",
            *command,
        ],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_an_fsdp_run_stopped_and_resumed_ends_with_the_uninterrupted_weights(tmp_path) -> None:
    whole = hpcdl_run(tmp_path, "whole")
    assert whole.wait(timeout=300) == 0, whole.stdout.read() if whole.stdout else ""

    stopped = hpcdl_run(tmp_path, "stopped")
    first = tmp_path / "stopped" / "checkpoints" / "step_000000010"
    deadline = time.monotonic() + 120
    while not first.is_dir() and time.monotonic() < deadline and stopped.poll() is None:
        time.sleep(0.1)
    stopped.send_signal(signal.SIGINT)  # Ctrl-C: each rank's program saves and exits 3
    out, _ = stopped.communicate(timeout=120)
    assert stopped.returncode == 3, out
    checkpoints = tmp_path / "stopped" / "checkpoints"
    saved = sorted(p.name for p in checkpoints.iterdir())
    assert saved[-1] > "step_000000010" and not (tmp_path / "stopped" / "final.pt").exists()
    # A save cut short: shards under the temporary name, or a folder without .metadata.
    (checkpoints / ".partial_step_000000999").mkdir()
    (checkpoints / ".partial_step_000000999" / "__0_0.distcp").write_bytes(b"cut")
    (checkpoints / "step_000000998").mkdir()

    resumed = subprocess.run(
        [sys.executable, "-m", "hpcdl.cli.main", "resume", "stopped"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed from {saved[-1]}" in resumed.stdout, resumed.stdout
    a = torch.load(tmp_path / "whole" / "final.pt")
    b = torch.load(tmp_path / "stopped" / "final.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
