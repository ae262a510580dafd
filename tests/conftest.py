"""Shared test helpers: run the real `hpcdl` command, skip gpu tests without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# cuBLAS reads its workspace setting at the process's first matmul on a GPU: set before any
# test does one, so the deterministic GPU test passes after others in the same process.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    longest_files_first(items)
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (gpu tier)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


def longest_files_first(items: list[pytest.Item]) -> None:
    """The test files in the order of their seconds in a CI run (tests/file_seconds.json),
    longest first, each file's tests together and in order: tests/run.sh's xdist workers
    take a file at a time in this order (--no-loadscope-reorder), so the long ones start
    early and the workers end together (xdist's own order, by tests per file, left one
    worker a minute longer). New files count as 0 s. Refresh the table from a run's
    --junitxml: python -m tests.file_seconds unit.xml."""
    seconds = json.loads((REPO / "tests" / "file_seconds.json").read_text())
    items.sort(key=lambda item: -seconds.get(item.nodeid.partition("::")[0], 0))


def run_hpcdl(
    *args: str, cwd: Path, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """The installed command line, as a user runs it (a fresh interpreter each time). A
    variable given as None in `env` is removed from the command's environment."""
    full_env = {**os.environ, **(env or {})}
    full_env = {k: v for k, v in full_env.items() if v is not None}
    return subprocess.run(
        [sys.executable, "-m", "hpcdl.cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


def run_without_torch(code: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Python `code` (with `sys` imported) in a fresh interpreter, as the login node runs
    it: it must exit 0, and torch must not have been imported by its end (STYLE.md: the
    login-node path never imports torch). Its output, for the caller's own checks."""
    no_torch = "\nassert 'torch' not in sys.modules, 'torch imported on the login path'\n"
    out = subprocess.run(
        [sys.executable, "-c", "import sys\n" + code + no_torch],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def smoke_benchmarks(out: Path, *names: str, timeout: float = 240) -> dict:
    """`python -m benchmarks.run NAMES --smoke --out OUT` from the repo; its JSON record."""
    import json

    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", *names, "--smoke", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [json_path] = out.glob("*-smoke.json")
    assert json_path.with_suffix(".md").is_file()
    return json.loads(json_path.read_text())


@pytest.fixture
def hpcdl(tmp_path: Path):
    def call(
        *args: str, timeout: float = 300, env: dict | None = None
    ) -> subprocess.CompletedProcess:
        return run_hpcdl(*args, cwd=tmp_path, timeout=timeout, env=env)

    return call
