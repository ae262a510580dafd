"""Failing jobs on the real dev cluster (R4 of the fault suite, in CI): a rank that raises in
a 2-node job ends the whole job, `hpcdl status` names that rank and its error, and nothing
is left running; a job whose environment is broken before Python starts hpcdl shows FAILED
with the first error line of its log. The full set (SIGKILLed and hanging ranks, 4 ranks):
`python -m tests.faults --scenario R4 --cluster`. And a finished job whose ranks' process
teardown would abort still ends COMPLETED (hpcdl.launch.rank_main; through submitit's own
entry the same job ends FAILED, checked by hand)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hpcdl.launch.slurm_state import ENDED_UNFINISHED
from tests.conftest import run_hpcdl
from tests.slurm.conftest import sacct_state, wait_until

pytestmark = pytest.mark.slurm

RAISER = (
    "def after_step(event):\n"
    "    if event.global_step == 5 and event.rank == 1:\n"
    "        raise RuntimeError('rank 1 failed on purpose at step 5')\n"
)

# Every rank's process teardown aborts, as DDP's still-running process group made it do
# now and then (CI: "srun: error: n2: task 3: Aborted" after a finished job).
ABORT_AT_EXIT = (
    "import atexit, os\n\n_armed = []\n\n"
    "def after_step(event):\n"
    "    if not _armed:\n"
    "        _armed.append(atexit.register(os.abort))\n"
)


def submitted(tmp_path: Path, *overrides: str) -> tuple[str, Path]:
    run_dir = tmp_path / "run"
    out = run_hpcdl("train", "cluster=devcluster", f"run_dir={run_dir}", *overrides, cwd=tmp_path)
    assert out.returncode == 0, out.stderr + out.stdout
    return json.loads((run_dir / "slurm.json").read_text())["job_id"], run_dir


def ended(job_id: str) -> str:
    wait_until(lambda: sacct_state(job_id) not in ("", "PENDING", "RUNNING"), 240, "the job")
    return sacct_state(job_id)


def status_lines(run_dir: Path, tmp_path: Path) -> dict[str, str]:
    out = run_hpcdl("status", str(run_dir), cwd=tmp_path)
    pairs = [line.split(":", 1) for line in out.stdout.splitlines() if ":" in line]
    report = {k.strip(): v.strip() for k, v in pairs}
    assert out.returncode == (1 if report["state"] in ENDED_UNFINISHED else 0), out.stderr
    return report


def test_a_rank_that_raises_ends_the_two_node_job_and_status_names_it(
    devcluster, tmp_path
) -> None:
    (tmp_path / "raiser.py").write_text(RAISER)
    job_id, run_dir = submitted(
        tmp_path,
        "cluster.nodes=2",
        "trainer.max_epochs=3",
        "trainer.step_hooks=[raiser:after_step]",
        "trainer.stall_timeout_s=60",
    )
    assert ended(job_id) == "FAILED"
    report = status_lines(run_dir, tmp_path)
    assert report["state"] == "FAILED"
    assert report["cause"].startswith("rank 1: RuntimeError: rank 1 failed on purpose"), report
    left = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True)
    assert not left.stdout.strip(), f"processes left behind: {left.stdout.split()}"


def test_a_job_whose_environment_is_broken_shows_failed_with_its_first_error(
    devcluster, tmp_path
) -> None:
    # A site module shadowing submitit: the job dies before hpcdl's payload starts.
    shadow = tmp_path / "broken-env" / "submitit"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('this environment is broken')\n")
    job_id, run_dir = submitted(tmp_path, f"cluster.setup=['export PYTHONPATH={shadow.parent}']")
    assert ended(job_id) == "FAILED"
    report = status_lines(run_dir, tmp_path)
    assert report["state"] == "FAILED"
    assert report["cause"] == "rank 0: ImportError: this environment is broken", report


def test_a_finished_job_whose_rank_teardown_would_abort_still_completes(devcluster, tmp_path) -> None:
    (tmp_path / "teardown.py").write_text(ABORT_AT_EXIT)
    job_id, run_dir = submitted(
        tmp_path, "cluster.nodes=2", "trainer.max_epochs=1", "trainer.step_hooks=[teardown:after_step]"
    )
    assert ended(job_id) == "COMPLETED"  # a rank leaves once its job returned (rank_main)
    report = status_lines(run_dir, tmp_path)
    assert report["state"] == "COMPLETED" and report["exit_code"] == "0:0", report
    assert (run_dir / "summary.json").exists()
