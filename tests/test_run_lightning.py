"""docs/examples/lightning_train.py under `hpcdl run` (docs/scripts.md#pytorch-lightning): two
local DDP ranks stopped with SIGTERM save and exit 3, without the deadlock of Lightning's own
SIGTERM handler, and `hpcdl resume` finishes the run. Skipped without lightning."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_hpcdl

pytest.importorskip("lightning")

EXAMPLE = REPO / "docs" / "examples" / "lightning_train.py"


def _wait_for(path_glob: str, folder: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not list(folder.glob(path_glob)):
        assert time.monotonic() < deadline, f"no {path_glob} in {folder} after {timeout_s}s"
        time.sleep(0.2)


@pytest.mark.slow
def test_lightning_example_stops_with_a_checkpoint_and_resumes(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE, tmp_path)
    command = [sys.executable, "-m", "hpcdl.cli.main", "run", "cluster=local"]
    command += ["cluster.tasks_per_node=2", "run_dir=r", "metrics_file=result.json", "--"]
    command += ["python", "lightning_train.py", "--epochs", "6", "--sleep", "0.2"]
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_for("epoch=*.ckpt", tmp_path / "r" / "checkpoints", timeout_s=120)
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=60)[0].decode()
    finally:
        proc.kill()
    assert proc.returncode == 3, output
    assert "status 3 would confirm" not in output, output  # every rank exited 3
    assert (tmp_path / "r" / "checkpoints" / "on_exception.ckpt").exists()
    resumed = run_hpcdl("resume", "r", cwd=tmp_path, timeout=180)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "on_exception.ckpt" in resumed.stdout
    result = json.loads((tmp_path / "r" / "result.json").read_text())
    assert result["step"] == 6 * 4  # 512 samples, 2 ranks, batches of 64
