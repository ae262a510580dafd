"""The dev-cluster benchmark's smoke run (P4, job start to first step), so it does not rot:
one hpcdl job and one hand-written sbatch job, each timed from its batch script's start."""

from __future__ import annotations

import pytest

from tests.conftest import smoke_benchmarks

pytestmark = pytest.mark.slurm


def test_job_start_smoke_times_both_jobs_from_their_scripts_start(devcluster, tmp_path) -> None:
    [row] = smoke_benchmarks(tmp_path, "job_start", timeout=600)["rows"]
    assert row["id"] == "job_start.first_step" and row["goal"] == 1.2
    measured, baseline = row["details"]["measured_s"], row["details"]["baseline_s"]
    # Both spans are real: python, torch and a step take seconds, not nothing, on a node.
    assert 0.5 < measured["median"] < 120 and 0.5 < baseline["median"] < 120, row
    assert row["ratio"] > 0
