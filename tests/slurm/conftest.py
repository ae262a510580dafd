"""The real Slurm dev cluster for the `slurm` tier: started once per session with
`slurm/devcluster up` (which installs Debian's packages if needed) and stopped at the end,
unless it was already up before the tests (then it is left running)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEVCLUSTER = REPO / "slurm" / "devcluster"
# A fresh machine installs ~190 MB of packages first (~25 s here); allow slow mirrors.
UP_TIMEOUT_S = 600


@dataclass(frozen=True)
class DevCluster:
    state_dir: Path  # logs under state_dir / "log"
    slurm_conf: str

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": self.slurm_conf}


def run_devcluster(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(DEVCLUSTER), *args],
        capture_output=True,
        text=True,
        timeout=UP_TIMEOUT_S,
        check=check,
    )


@pytest.fixture(scope="session")
def devcluster() -> Iterator[DevCluster]:
    if os.geteuid() != 0:
        pytest.fail("the slurm tier needs root (network namespaces and Slurm daemons)")
    was_up = run_devcluster("status").returncode == 0
    if not was_up:
        up = run_devcluster("up")
        if up.returncode != 0:
            pytest.fail(f"slurm/devcluster up failed:\n{up.stderr}{up.stdout}", pytrace=False)
    # `env` prints: export SLURM_CONF=<state dir>/etc/slurm.conf
    conf = run_devcluster("env", check=True).stdout.strip().split("=", 1)[1]
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    try:
        yield DevCluster(state_dir=Path(conf).parents[1], slurm_conf=conf)
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        if not was_up:
            down = run_devcluster("down")
            assert down.returncode == 0, f"slurm/devcluster down failed:\n{down.stderr}"


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
    # One line per job; split lines, not words: a state can read "CANCELLED by 0".
    lines = out.stdout.strip().splitlines()
    return lines[-1].strip() if lines else ""
