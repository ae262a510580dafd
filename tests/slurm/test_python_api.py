"""The Python API on the real Slurm dev cluster: submit() returns once queued without
importing torch, status() while the job runs, wait() until it has left the queue, cancel(),
a two-trial sweep's wait() and summary(), and submit_program (hpcdl run)."""

from __future__ import annotations

import pytest

from hpcdl import Job, JobFailedError, submit, submit_sweep
from hpcdl.launch.monitor import is_active
from tests.conftest import run_hpcdl, run_without_torch
from tests.slurm.conftest import squeue_ids, wait_until

pytestmark = pytest.mark.slurm

# Long enough to cancel while it runs: ~2800 steps per epoch at one rank.
LONG = [
    "data=synthetic",
    "data.num_samples=4000",
    "trainer.batch_size=4",
    "trainer.max_epochs=6",
]


def test_submit_returns_without_torch_then_status_wait_and_logs(devcluster, tmp_path) -> None:
    run_dir = tmp_path / "run"
    code = (
        "from hpcdl import submit\n"
        f"job = submit(['cluster=devcluster', 'run_dir={run_dir}', 'trainer.max_epochs=3'])\n"
        "print('job id', job.job_id)\n"
    )
    out = run_without_torch(code, cwd=tmp_path, timeout=120)
    job = Job.from_run_dir(run_dir)
    assert f"job id {job.job_id}\n" in out.stdout
    running = job.status()  # the job needs seconds just to import torch
    assert is_active(running["state"]) and running["source"] == "squeue", running
    assert running["partition"] == "gpu"  # the profile's, as squeue has it
    assert running["job_id"] == job.job_id

    summary = job.wait(timeout=120, poll_s=1)
    assert summary == job.result() and summary["epochs"] == 3
    assert summary["test_accuracy"] > 0.5
    done = job.status()
    assert done["state"] == "COMPLETED" and done["attempts"] == 1 and done["last_epoch"] == 3
    printed = run_hpcdl("status", str(run_dir), cwd=tmp_path).stdout
    # the dict keeps test_accuracy beside test_metrics (its own key before test_metrics)
    shown = {line.split(":", 1)[0].strip() for line in printed.splitlines()}
    assert shown == set(done) - {"test_accuracy"} and "test_metrics" in shown
    # By its job id: the same run's report, traced through the job's log path.
    by_id = run_hpcdl("status", str(job.job_id), cwd=tmp_path).stdout
    assert "attempts: 1\n" in by_id and "last_epoch: 3\n" in by_id, by_id
    assert "epoch 3/3" in job.logs(rank=0)


def test_cancel_then_wait_raises_naming_the_state_and_the_log(devcluster, tmp_path) -> None:
    job = submit(["cluster=devcluster", f"run_dir={tmp_path / 'run'}", *LONG])
    wait_until(lambda: job.status()["state"] == "RUNNING", 60, "the job to start", 0.5)
    job.cancel()
    with pytest.raises(JobFailedError) as failed:
        job.wait(timeout=60, poll_s=1)
    assert failed.value.state == "CANCELLED"
    assert f"job {job.job_id} ended CANCELLED" in str(failed.value)
    assert f"{job.job_id}_0_log.out" in str(failed.value)
    assert job.result() is None


def test_two_trial_sweep_wait_and_summary(devcluster, tmp_path) -> None:
    sweep = submit_sweep(
        [
            "cluster=devcluster",
            "optim.lr=0.1,0.03",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
            "trainer.max_epochs=2",
        ]
    )
    array = sweep.status()[0]["job_id"].split("_")[0]
    assert [t["job_id"] for t in sweep.status()] == [f"{array}_0", f"{array}_1"]
    trials = sweep.wait(timeout=120, poll_s=1)
    assert [t["state"] for t in trials] == ["COMPLETED", "COMPLETED"]
    ranked = sweep.summary()
    assert [e["rank"] for e in ranked] == [1, 2] and ranked[0]["metric"] == "val_accuracy"
    assert {e["overrides"] for e in ranked} == {"optim.lr=0.1", "optim.lr=0.03"}
    assert ranked[0]["mean"] >= ranked[1]["mean"]
    assert (tmp_path / "sweep" / "summary.md").is_file()
    assert sweep.rerun_failed() == []
    assert "epoch 2/2" in sweep.trial(1).logs()


def test_submit_program_queues_a_script_without_torch_and_a_refused_one_leaves_nothing(
    devcluster, tmp_path
) -> None:
    (tmp_path / "fit.py").write_text(
        "import json, os\n"
        "path = os.path.join(os.environ['HPCDL_RUN_DIR'], 'm.json')\n"
        "json.dump({'ranks': int(os.environ['WORLD_SIZE'])}, open(path, 'w'))\n"
    )
    given = ["cluster=devcluster", "cluster.tasks_per_node=2", "metrics_file=m.json"]
    code = (
        "from hpcdl import HpcdlError, submit_program\n"
        f"job = submit_program(['python', 'fit.py'], {[*given, 'run_dir=run']!r})\n"
        "print('job id', job.job_id)\n"
        "try:\n"
        f"    submit_program(['python', 'fit.py'], {[*given, 'run_dir=no', '+cluster.sbatch_extra.exclusve=true']!r})\n"
        "except HpcdlError as err:\n"
        "    print('refused:', err)\n"
    )
    before = set(squeue_ids())
    out = run_without_torch(code, cwd=tmp_path, timeout=120)
    job = Job.from_run_dir(tmp_path / "run")
    assert f"job id {job.job_id}\n" in out.stdout
    assert "refused: cluster.sbatch_extra.exclusve: sbatch has no option --exclusve" in out.stdout
    assert "nothing submitted (run dir" in out.stdout and not (tmp_path / "no").exists()
    assert set(squeue_ids()) - before <= {job.job_id}  # the refused one queued nothing
    assert job.wait(timeout=120, poll_s=1)["ranks"] == 2
