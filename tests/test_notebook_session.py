"""The Python API as a notebook uses it: many calls in one interpreter, each leaving the
interpreter (its environment, its signal handlers) as it found it."""

from __future__ import annotations

import os
import signal

import pytest

from hpcdl import submit


@pytest.mark.slow
def test_a_local_run_leaves_the_notebooks_environment_as_it_was(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = dict(os.environ)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    job = submit(
        [
            "run_dir=run",
            "cluster=local",
            "cluster.tasks_per_node=1",
            "trainer.max_epochs=1",
            "+cluster.env.OMP_NUM_THREADS=1",
        ]
    )
    summary = job.result()
    assert summary is not None and summary["cpu_threads"] == 1  # the rank had cluster.env
    # Not kept for the notebook's next runs (its own cluster=debug runs read
    # OMP_NUM_THREADS too): no cluster.env, MASTER_ADDR/PORT, HPCDL_FOREGROUND left.
    assert dict(os.environ) == before
    assert {s: signal.getsignal(s) for s in handlers} == handlers
