"""`hpcdl train -m` on the real dev cluster: one job array, the ledger, rerun, k-fold."""

from __future__ import annotations

import itertools
import json
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_hpcdl
from tests.slurm.conftest import REPO, sacct_state, wait_until

pytestmark = pytest.mark.slurm


def submit_sweep(sweep: Path, *overrides: str, env: dict[str, str] | None = None) -> Path:
    """`hpcdl train -m` on the dev cluster into `sweep`, run from its parent folder."""
    out = run_hpcdl(
        "train",
        "-m",
        "cluster=devcluster",
        f"hydra.sweep.dir={sweep}",
        *overrides,
        cwd=sweep.parent,
        env=env,
    )
    assert out.returncode == 0, out.stderr + out.stdout
    return sweep


def ledger(sweep: Path) -> dict:
    return json.loads((sweep / "sweep.json").read_text())


def all_completed(sweep: Path) -> bool:
    return all((Path(t["run_dir"]) / "summary.json").exists() for t in ledger(sweep)["trials"])


def test_six_trial_sweep_is_one_array_and_returns_before_it_finishes(devcluster, tmp_path) -> None:
    started = time.monotonic()
    sweep = submit_sweep(
        tmp_path / "sw",
        "model=mlp,cnn",
        "data=digits",
        "optim.lr=0.1,0.03,0.01",
        "trainer.max_epochs=3",
    )
    submit_s = time.monotonic() - started
    trials = ledger(sweep)["trials"]
    assert not all_completed(sweep)  # returned while the array was still queued/running
    print(f"sweep submit returned in {submit_s:.2f}s")
    assert len(trials) == 6
    arrays = {t["job_id"].split("_")[0] for t in trials}
    assert len(arrays) == 1, arrays  # one job array, not six jobs
    assert sorted(int(t["job_id"].split("_")[1]) for t in trials) == list(range(6))
    assert [t["overrides"] for t in trials][:2] == [
        ["model=mlp", "optim.lr=0.1"],
        ["model=mlp", "optim.lr=0.03"],
    ]
    wait_until(lambda: all_completed(sweep), 300, "all six trials")
    # summary.json comes before the job's end: a trial stays RUNNING until Slurm says so.
    wait_until(lambda: "6 trials: 6 COMPLETED" in sweep_status(sweep), 120, "the six jobs' ends")
    status = run_hpcdl("sweep", "status", str(sweep), cwd=tmp_path)
    assert status.returncode == 0 and "6 trials: 6 COMPLETED" in status.stdout, status.stdout
    refreshed = ledger(sweep)["trials"]
    assert all(t["state"] == "COMPLETED" and t["metric"] is not None for t in refreshed)
    for t in refreshed:  # each trial ran as its own array task and recorded it
        start = json.loads((Path(t["run_dir"]) / "attempts.jsonl").read_text().splitlines()[0])
        assert f"{start['array_job']}_{start['array_task']}" == t["job_id"]


def submit_good_and_broken(tmp_path: Path, env: dict[str, str] | None = None) -> Path:
    """A 2-trial sweep over data files: trial 0 reads good.npz, trial 1 a broken file."""
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    np.savez(tmp_path / "good.npz", x=x, y=y)
    np.savez(tmp_path / "broken.npz", x=x, y=y[:100])  # passes the login node's checks
    return submit_sweep(
        tmp_path / "sw",
        "data=files",
        "data.path=good.npz,broken.npz",
        "trainer.max_epochs=3",
        env=env,
    )


def sweep_status(sweep: Path) -> str:
    return run_hpcdl("sweep", "status", str(sweep), cwd=sweep.parent).stdout


def fix_broken(tmp_path: Path) -> None:
    with np.load(tmp_path / "good.npz") as good:
        np.savez(tmp_path / "broken.npz", x=good["x"], y=good["y"])


def test_failed_trial_is_rerun_alone_after_the_fix(devcluster, tmp_path) -> None:
    sweep = submit_good_and_broken(tmp_path)
    first = ledger(sweep)["trials"]
    wait_until(lambda: sacct_state(first[1]["job_id"]) == "FAILED", 180, "trial 1 to fail")
    # By the array's own id: every task's state, also while trial 0 is still in squeue
    # (which lists only the queued tasks).
    array = first[0]["job_id"].split("_")[0]
    by_id = run_hpcdl("status", array, cwd=tmp_path)
    assert re.search(rf"array_tasks: {array}_0 \w+, {array}_1 FAILED", by_id.stdout), by_id.stdout
    wait_until(lambda: (Path(first[0]["run_dir"]) / "summary.json").exists(), 180, "trial 0")
    # summary.json is written before the job ends: wait for the scheduler to say so too.
    wait_until(lambda: sacct_state(first[0]["job_id"]) == "COMPLETED", 60, "trial 0's job")
    good_summary = (Path(first[0]["run_dir"]) / "summary.json").stat().st_mtime
    status = run_hpcdl("sweep", "status", str(sweep), cwd=tmp_path)
    assert "1 COMPLETED, 1 FAILED" in status.stdout, status.stdout
    by_id = run_hpcdl("status", array, cwd=tmp_path)
    assert f"array_tasks: {array}_0 COMPLETED, {array}_1 FAILED" in by_id.stdout, by_id.stdout
    # Why it failed, from the trial's own log: the rank and the file.
    [why] = [ln for ln in status.stdout.splitlines() if ln.startswith("trial 1 failed: ")]
    assert why.startswith("trial 1 failed: rank 0: ") and "broken.npz" in why, why

    # The fix in the trial's config.yaml (fix_broken() fixes the file instead).
    config = Path(first[1]["run_dir"]) / "config.yaml"
    config.write_text(config.read_text().replace("path: broken.npz", "path: good.npz"))
    dry = run_hpcdl("sweep", "rerun", str(sweep), "--failed", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0 and "would rerun 1 trial: 1" in dry.stdout, dry.stdout
    assert "#SBATCH" in dry.stdout and "#SBATCH --array" not in dry.stdout  # one trial: a job
    assert dry.stdout.rstrip().endswith("# dry run: nothing submitted")
    assert ledger(sweep)["trials"][1]["attempts"] == 1
    rerun = run_hpcdl("sweep", "rerun", str(sweep), "--failed", cwd=tmp_path)
    assert rerun.returncode == 0 and "rerunning 1 trial: 1" in rerun.stdout, rerun.stdout
    after = ledger(sweep)["trials"]
    assert after[0]["job_id"] == first[0]["job_id"] and after[0]["attempts"] == 1
    assert after[1]["job_id"] != first[1]["job_id"] and after[1]["attempts"] == 2
    wait_until(lambda: all_completed(sweep), 180, "the rerun trial")
    assert (Path(first[0]["run_dir"]) / "summary.json").stat().st_mtime == good_summary
    # Both trials read good.npz now: one row of the summary, and the edit is named.
    summary = run_hpcdl("sweep", "summary", str(sweep), cwd=tmp_path)
    assert "| 1    | data.path=good.npz |" in summary.stdout, summary.stdout
    assert "| 2 |" in summary.stdout and "data.path=broken.npz |" not in summary.stdout
    edited = "trial 1: its config.yaml has data.path=good.npz (the sweep planned data.path=broken"
    assert edited in summary.stdout, summary.stdout


def test_trials_cancelled_while_queued_are_cancelled_and_rerun(devcluster, tmp_path) -> None:
    long = ["data=synthetic", "data.num_samples=4000", "trainer.batch_size=4"]
    sweep = submit_sweep(
        tmp_path / "sw", *long, "optim.lr=0.01,0.005,0.002,0.001", "cluster.array_parallelism=1"
    )  # small rates: trial 0 trains until the scancel, which on a loaded machine came after
    # step 63, where optim.lr=0.1 with batches of 4 had diverged (FAILED, non-finite loss)
    first = ledger(sweep)["trials"]
    array = first[0]["job_id"].split("_")[0]
    # One queued trial alone (sacct keeps calling it PENDING, in its array's record), then
    # the array (sacct: one CANCELLED record, 8_[0-2%1], for the tasks that had not run).
    cancel = run_hpcdl("cancel", first[3]["run_dir"], cwd=tmp_path)
    assert cancel.returncode == 0, cancel.stderr
    # Slurm 22.05 keeps no record of that last task (the array's pending record becomes
    # 8_[1-2%1]); the array's batch script still names it.
    status = run_hpcdl("status", array, cwd=tmp_path)
    assert f", {array}_3 CANCELLED" in status.stdout, status.stdout + status.stderr
    status = run_hpcdl("status", f"{array}_3", cwd=tmp_path)
    assert "state: CANCELLED\n" in status.stdout, status.stdout + status.stderr
    subprocess.run(["scancel", array], check=True)
    wait_until(lambda: not array_queued(array), 60, f"array {array} to leave the queue")
    status = run_hpcdl("sweep", "status", str(sweep), cwd=tmp_path)
    assert "4 trials: 4 CANCELLED" in status.stdout, status.stdout
    rerun = run_hpcdl("sweep", "rerun", str(sweep), "--failed", cwd=tmp_path)
    assert "rerunning 4 trials: 0-3" in rerun.stdout, rerun.stdout + rerun.stderr
    again = ledger(sweep)["trials"]
    assert [t["attempts"] for t in again] == [2, 2, 2, 2]
    subprocess.run(["scancel", again[0]["job_id"].split("_")[0]], check=True)


def test_kfold_sweep_summary_reports_mean_and_std(devcluster, tmp_path) -> None:
    sweep = submit_sweep(
        tmp_path / "cv",
        "data=breast_cancer",
        "data.num_folds=3",
        "data.fold=range(0,3)",
        "optim.lr=0.1,0.01",
        "trainer.max_epochs=5",
    )
    wait_until(lambda: all_completed(sweep), 300, "six fold trials")
    summary = run_hpcdl("sweep", "summary", str(sweep), "--metric", "val_accuracy", cwd=tmp_path)
    assert summary.returncode == 0, summary.stderr
    lines = [ln for ln in summary.stdout.splitlines() if ln.startswith("| ")]
    assert "std" in lines[0]
    assert len(lines) == 3  # header + one row per learning rate, 3 folds each
    trials = ledger(sweep)["trials"]
    for row in lines[1:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        lr, mean, std, n = cells[1], float(cells[2]), float(cells[3]), int(cells[4])
        folds = [t["metric"] for t in trials if lr in t["overrides"]]
        assert n == len(folds) == 3 and 0.5 < mean <= 1.0
        assert mean == pytest.approx(statistics.fmean(folds), abs=1e-4)
        assert std == pytest.approx(statistics.stdev(folds), abs=1e-4)
    csv_out = run_hpcdl("sweep", "summary", str(sweep), "--format", "csv", cwd=tmp_path)
    assert "val_accuracy_mean,val_accuracy_std" in csv_out.stdout


def test_sweeps_larger_than_max_array_size_are_split(devcluster, tmp_path, monkeypatch) -> None:
    # The dev cluster allows 1001 tasks per array; pretend it allows 3 (task ids 0..1).
    from hpcdl.cli.main import main
    from hpcdl.sweep import launch

    monkeypatch.setattr(launch, "max_array_size", lambda: 3)
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "sw"
    rc = main(
        [
            "train",
            "-m",
            "cluster=devcluster",
            f"hydra.sweep.dir={sweep}",
            "optim.lr=0.1,0.05,0.02,0.01,0.005",
            "trainer.max_epochs=1",
            "cluster.array_parallelism=1",
        ]
    )
    assert rc == 0
    record = ledger(sweep)
    assert [len(s["trials"]) for s in record["submissions"]] == [2, 2, 1]
    arrays = [s["array_job_id"] for s in record["submissions"]]
    assert len({t["job_id"].split("_")[0] for t in record["trials"]}) == 3
    # (submitit submits a one-element chunk as a plain job: id without _TASK)
    assert all(int(t["job_id"].partition("_")[2] or 0) < 2 for t in record["trials"])
    # %1 holds across the arrays: each waits for the one before it to end.
    for before, after in itertools.pairwise(arrays):
        shown = subprocess.run(["scontrol", "show", "job", after], capture_output=True, text=True)
        assert f"Dependency=afterany:{before}" in shown.stdout, shown.stdout + shown.stderr
    wait_until(lambda: all_completed(sweep), 240, "five trials in three arrays, one at a time")
    times = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-j", ",".join(arrays), "-o", "JobID,Start,End"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    spans = sorted(tuple(line.split("|")[1:]) for line in times.strip().splitlines())
    assert len(spans) == 5, times
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans)), times


def test_a_requeued_array_task_keeps_its_id_and_resumes_exactly(devcluster, tmp_path) -> None:
    from tests.slurm.test_slurm import ONE_THREAD, wait_for_checkpoint

    long = [
        "data=synthetic",
        "data.num_samples=4000",
        "trainer.batch_size=4",
        "trainer.max_epochs=3",
        "trainer.checkpoint_every_steps=300",
        "trainer.log_every_steps=1000",
    ]
    sweep = submit_sweep(tmp_path / "sw", *long, "trainer.seed=1,2")
    trial = ledger(sweep)["trials"][0]
    run_dir = Path(trial["run_dir"])
    wait_for_checkpoint(run_dir)
    subprocess.run(["scontrol", "requeue", trial["job_id"]], check=True)
    wait_until(lambda: all_completed(sweep), 300, "both trials")
    wait_until(lambda: "2 trials: 2 COMPLETED" in sweep_status(sweep), 120, "both jobs' ends")
    after = ledger(sweep)["trials"][0]
    assert after["job_id"] == trial["job_id"] and after["attempts"] == 1
    assert after["requeues"] >= 1
    starts = [
        json.loads(line)
        for line in (run_dir / "attempts.jsonl").read_text().splitlines()
        if '"start"' in line
    ]
    assert len(starts) >= 2
    assert {f"{s['array_job']}_{s['array_task']}" for s in starts} == {trial["job_id"]}
    ref = tmp_path / "reference"
    alone = run_hpcdl(
        "train", f"run_dir={ref}", *long, "trainer.seed=1", cwd=tmp_path, env=ONE_THREAD
    )
    assert alone.returncode == 0, alone.stderr
    sha = json.loads((run_dir / "summary.json").read_text())["weights_sha256"]
    assert sha == json.loads((ref / "summary.json").read_text())["weights_sha256"]


@pytest.fixture
def without_accounting(devcluster, tmp_path) -> dict[str, str]:
    """The client side of a cluster without accounting: the dev cluster's slurm.conf minus
    its accounting lines, so sacct fails exactly as it does there ("Slurm accounting
    storage is disabled") while squeue/sbatch still talk to the real controller."""
    conf = tmp_path / "no-accounting" / "slurm.conf"
    conf.parent.mkdir()
    lines = Path(devcluster.slurm_conf).read_text().splitlines()
    keep = [ln for ln in lines if not ln.startswith(("AccountingStorage", "JobAcctGather"))]
    conf.write_text("\n".join(keep) + "\n")
    env = {"SLURM_CONF": str(conf)}
    sacct = subprocess.run(
        ["sacct", "-X"], capture_output=True, text=True, env={**os.environ, **env}
    )
    assert sacct.returncode != 0 and "accounting storage is disabled" in sacct.stdout + sacct.stderr
    return env


def test_status_and_rerun_work_on_a_cluster_without_accounting(
    devcluster, tmp_path, without_accounting
) -> None:
    sweep = submit_good_and_broken(tmp_path, without_accounting)
    trials = ledger(sweep)["trials"]
    ids = [t["job_id"] for t in trials]
    wait_until(lambda: not set(ids) & set(squeue_task_ids()), 180, "both tasks to leave the queue")
    status = run_hpcdl("sweep", "status", str(sweep), cwd=tmp_path, env=without_accounting)
    assert "2 trials: 1 COMPLETED, 1 FAILED" in status.stdout, status.stdout
    single = run_hpcdl("status", trials[1]["run_dir"], cwd=tmp_path, env=without_accounting)
    assert single.returncode == 1 and "state: FAILED" in single.stdout, single.stdout
    assert "no accounting" in single.stdout and "attempts: 1" in single.stdout

    fix_broken(tmp_path)
    rerun = run_hpcdl(
        "sweep", "rerun", str(sweep), "--failed", cwd=tmp_path, env=without_accounting
    )
    assert rerun.returncode == 0 and "rerunning 1 trial: 1" in rerun.stdout, rerun.stdout
    # summary.json comes before the job's end: a trial is RUNNING until it leaves the queue
    wait_until(
        lambda: all_completed(sweep) and not set(job_ids(sweep)) & set(squeue_task_ids()),
        180,
        "the rerun trial's job to end",
    )
    status = run_hpcdl("sweep", "status", str(sweep), cwd=tmp_path, env=without_accounting)
    assert "2 trials: 2 COMPLETED" in status.stdout, status.stdout


def job_ids(sweep: Path) -> list[str]:
    return [str(t["job_id"]) for t in ledger(sweep)["trials"]]


def squeue_task_ids() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True)
    return out.stdout.split()


REQUEUE_ONCE = """#!/bin/bash
echo "$SLURM_ARRAY_TASK_ID ${SLURM_RESTART_COUNT:-0}" >> @OUT@/runs.txt
if [ "$SLURM_JOB_ID" = "$SLURM_ARRAY_JOB_ID" ] && [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then
    sleep 4  # the other task has finished by now
    @PYTHON@ -c "import os, pathlib; from hpcdl.requeue import requeue; \\
from hpcdl.rundir import RunDir; \\
print(requeue(os.environ['SLURM_JOB_ID'], RunDir(pathlib.Path('@OUT@'))))"
    sleep 30  # ended by the requeue
fi
"""


def test_an_array_task_that_requeues_itself_requeues_only_itself(devcluster, tmp_path) -> None:
    """The task whose SLURM_JOB_ID is the array's own id requeues itself (a time limit, a
    preemption, a stall in a sweep): by that id Slurm would requeue the whole array and
    rerun trials that had completed."""
    import sys

    script = tmp_path / "task.sh"
    script.write_text(
        REQUEUE_ONCE.replace("@OUT@", str(tmp_path)).replace("@PYTHON@", sys.executable)
    )
    out = subprocess.run(
        ["sbatch", "--parsable", "--requeue", "--array=0-1", "-o", f"{tmp_path}/%A_%a.out",
         str(script)],
        capture_output=True, text=True, env={**devcluster.env, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    array = out.stdout.strip().split(";")[0]
    wait_until(lambda: not array_queued(array), 180, f"array {array} to finish")
    runs = sorted((tmp_path / "runs.txt").read_text().split("\n")[:-1])
    requeued = [line for line in runs if line.endswith(" 1")]
    assert len(requeued) == 1, runs  # the task that asked, once
    task = requeued[0].split()[0]
    assert runs.count(f"{task} 0") == 1 and len(runs) == 3, runs  # the other ran once


def array_queued(array: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True)
    return any(line.startswith(f"{array}_") for line in out.stdout.split())


BUGGY_NET = (
    "from torch import nn\n"
    "def build(input_shape, num_classes, width=8):\n"
    "    if width != 8:\n"
    "        raise ValueError(f'width={width}: the bug')\n"
    "    return nn.Sequential(nn.Linear(input_shape[0], width), nn.Linear(width, num_classes))\n"
)


def test_a_code_fix_reaches_failed_trials_with_fresh_code(devcluster, tmp_path) -> None:
    """The sweep's trials run SWEEP_DIR/code, frozen at submission: a fix to the user's
    model module reaches a trial resumed by hand, and a rerun, only with --fresh-code, which
    keeps the copy the finished trials ran as code.1 (code.2, ...)."""
    (tmp_path / "fresh_net.py").write_text(BUGGY_NET)
    env = {"PYTHONPATH": str(tmp_path)}
    sweep = submit_sweep(
        tmp_path / "sw", "model=custom", "model.target=fresh_net:build",
        "model.kwargs.width=8,7,6", "trainer.max_epochs=1", env=env,
    )  # fmt: skip
    jobs = [t["job_id"] for t in ledger(sweep)["trials"]]
    wait_until(lambda: "1 COMPLETED, 2 FAILED" in sweep_status(sweep), 240, "the three trials")
    why = [ln for ln in sweep_status(sweep).splitlines() if ln.startswith("trial 1 failed")]
    assert why and "width=7: the bug" in why[0], why

    (tmp_path / "fresh_net.py").write_text(BUGGY_NET.replace("!= 8", "< 1"))  # the fix
    dry = run_hpcdl("sweep", "rerun", str(sweep), "--failed", "--dry-run", cwd=tmp_path, env=env)
    assert dry.returncode == 0 and "would rerun 2 trials: 1-2" in dry.stdout, dry.stderr
    assert dry.stderr == (
        f"warning: fresh_net changed since {sweep / 'code'} was frozen; the rerun runs that "
        f"frozen copy, not your edits (to run your edits: hpcdl sweep rerun {sweep} --failed "
        "--fresh-code)\n"
    )
    # The trial resumed by hand with --fresh-code: the sweep's copy frozen anew.
    out = run_hpcdl("resume", str(sweep / "1"), "--fresh-code", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stderr == "" and f"{sweep / 'code.1'})" in out.stdout, out.stdout
    wait_until(lambda: (sweep / "1" / "summary.json").exists(), 180, "trial 1 resumed")
    wait_until(lambda: "2 COMPLETED, 1 FAILED" in sweep_status(sweep), 60, "trial 1's end")
    assert "the bug" in (sweep / "code.1" / "fresh_net.py").read_text()
    assert "the bug" in (sweep / "code" / "fresh_net.py").read_text()  # the fixed text keeps it
    assert "!= 8" not in (sweep / "code" / "fresh_net.py").read_text()

    # Nothing changed since: nothing frozen anew, no code.2.
    same = run_hpcdl("sweep", "rerun", str(sweep), "--failed", "--dry-run", "--fresh-code",
                     cwd=tmp_path, env=env)  # fmt: skip
    assert same.returncode == 0, same.stderr
    assert f"your code is the same as the copy in {sweep / 'code'}; nothing" in same.stdout
    with (tmp_path / "fresh_net.py").open("a") as f:  # another edit
        f.write("# a second edit\n")
    # A submission refused after the freeze puts the old copy back, and says so.
    refused = run_hpcdl(
        "resume", str(sweep / "2"), "--fresh-code", "--no-preflight", "cluster.partition=nope",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert refused.returncode == 2 and "Invalid partition" in refused.stderr, refused.stderr
    assert f"--fresh-code: {sweep / 'code'} is the copy its jobs ran again\n" in refused.stdout
    assert not (sweep / "code.2").exists()
    assert "# a second edit" not in (sweep / "code" / "fresh_net.py").read_text()
    # The rerun of the other one, with --fresh-code: frozen anew again.
    dry = run_hpcdl("sweep", "rerun", str(sweep), "--failed", "--dry-run", "--fresh-code",
                    cwd=tmp_path, env=env)  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert f"the old copy moved to {sweep / 'code.2'}; changed since: fresh_net" in dry.stdout
    rerun = run_hpcdl("sweep", "rerun", str(sweep), "--failed", "--fresh-code", cwd=tmp_path,
                      env=env)  # fmt: skip
    assert rerun.returncode == 0 and "rerunning 1 trial: 2" in rerun.stdout, rerun.stderr
    wait_until(lambda: "3 trials: 3 COMPLETED" in sweep_status(sweep), 240, "trial 2 rerun")
    assert (sweep / "code.2" / "fresh_net.py").read_text() + "# a second edit\n" == (
        sweep / "code" / "fresh_net.py"
    ).read_text()
    assert ledger(sweep)["trials"][0]["job_id"] == jobs[0]  # the finished trial left alone
    # Which trials trained on which copy: named below the summary.
    summary = run_hpcdl("sweep", "summary", str(sweep), cwd=tmp_path).stdout
    for index, copy in ((0, "code.1"), (0, "code.2"), (1, "code.2")):
        assert f"trial {index}: trained (all or part) by the code now in {sweep / copy}, " in (
            summary
        ), summary
    # Not the trials that failed before training (at the model's build): nothing of theirs
    # came from the old copy.
    assert f"trial 1: trained (all or part) by the code now in {sweep / 'code.1'}" not in summary
    assert "trial 2: trained" not in summary
    assert "resumed by hand with" not in summary
    # Two freezes recorded, not the one whose submission was refused.
    assert [Path(r["aside"]).name for r in ledger(sweep)["refrozen"]] == ["code.1", "code.2"]


def test_cancel_of_a_sweep_dir_cancels_its_running_trials(devcluster, tmp_path) -> None:
    """`hpcdl cancel SWEEP_DIR` (which --fresh-code's refusal and sweeps.md name) was
    refused with a scancel line to paste; now it cancels every queued or running trial."""
    sweep = submit_sweep(
        tmp_path / "sw", "data=synthetic", "data.num_samples=20000", "trainer.max_epochs=50",
        "trainer.batch_size=8", "optim.lr=0.01,0.001",  # lr 0.1 diverged once, in 2 s
    )  # fmt: skip
    wait_until(lambda: sweep_status(sweep).count("RUNNING") >= 2, 120, "both trials running")
    nothing = run_hpcdl("sweep", "rerun", str(sweep), "--failed", "--fresh-code", cwd=tmp_path)
    assert nothing.returncode == 0 and "no failed trials to rerun" in nothing.stdout
    resumed = run_hpcdl("resume", str(sweep / "0"), "--fresh-code", cwd=tmp_path)
    assert resumed.returncode == 2 and "is still RUNNING" in resumed.stderr, resumed.stderr
    out = run_hpcdl("cancel", str(sweep), cwd=tmp_path)
    array = ledger(sweep)["trials"][0]["job_id"].split("_")[0]
    assert out.returncode == 0 and out.stdout.startswith(  # Slurm's own short form
        f"cancelled 2 trials of {sweep}: 0-1 (jobs {array}_[0-1]); "
    ), out.stdout + out.stderr
    wait_until(lambda: "2 trials: 2 CANCELLED" in sweep_status(sweep), 120, "both cancelled")
    again = run_hpcdl("cancel", str(sweep), cwd=tmp_path)
    assert again.stdout == f"{sweep}: no trial is queued or running; nothing to cancel\n"
    for trial in ledger(sweep)["trials"]:  # each saved a checkpoint as it stopped
        assert list((Path(trial["run_dir"]) / "checkpoints").glob("step_*.pt")), trial
