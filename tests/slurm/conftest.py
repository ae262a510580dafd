"""The real Slurm dev cluster for the `slurm` tier: started once per session by
slurm/devcluster (installing Debian's packages if needed) and stopped at the end, unless it
was already up before the tests (then it is left running)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEVCLUSTER = REPO / "slurm" / "devcluster"


def _devcluster(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(DEVCLUSTER), *args], capture_output=True, text=True, timeout=600, check=check
    )


@pytest.fixture(scope="session")
def devcluster() -> Iterator[dict[str, str]]:
    if os.geteuid() != 0:
        pytest.fail("the slurm tier needs root (network namespaces and Slurm daemons)")
    was_up = _devcluster("status", check=False).returncode == 0
    if not was_up:
        out = _devcluster("up", check=False)
        assert out.returncode == 0, f"slurm/devcluster up failed:\n{out.stdout}\n{out.stderr}"
    conf = _devcluster("env").stdout.strip().split("=", 1)[1]
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    try:
        yield {"SLURM_CONF": conf}
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        if not was_up:
            _devcluster("down", check=False)


def wait_until(
    predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 1.0
) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(poll_s)


def squeue_ids() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True)
    return out.stdout.split()


def sacct_state(job_id: str) -> str:
    out = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State"], capture_output=True, text=True
    )
    lines = out.stdout.split()
    return lines[-1] if lines else ""
