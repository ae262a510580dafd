"""hpcdl on a real Slurm (slurm/devcluster): submission, multi-node DDP, requeue,
preemption, time limits, preflight, the plain sbatch route, monitoring.

Exactness is checked against the same config trained in-process with one thread; the
Slurm jobs run with OMP_NUM_THREADS=1 too (conf/cluster/devcluster.yaml).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_hpcdl, run_without_torch
from tests.slurm.conftest import sacct_state, squeue_ids, wait_until

pytestmark = pytest.mark.slurm

# ~2800 steps per epoch at 1 rank: long enough to interrupt on purpose (a few seconds per epoch).
LONG = [
    "data=synthetic",
    "data.num_samples=4000",
    "trainer.batch_size=4",
    "trainer.max_epochs=6",
    "trainer.checkpoint_every_steps=300",
    "trainer.log_every_steps=1000",
]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def attempts(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "attempts.jsonl").read_text().splitlines()]


def submit(tmp_path: Path, *overrides: str) -> tuple[str, Path, float]:
    run_dir = tmp_path / "run"
    started = time.monotonic()
    out = run_hpcdl("train", "cluster=devcluster", f"run_dir={run_dir}", *overrides, cwd=tmp_path)
    elapsed = time.monotonic() - started
    assert out.returncode == 0, out.stderr + out.stdout
    job_id = json.loads((run_dir / "slurm.json").read_text())["job_id"]
    assert f"submitted job {job_id}" in out.stdout
    return job_id, run_dir, elapsed


def reference_sha(tmp_path: Path, *overrides: str) -> str:
    ref = tmp_path / "reference"
    out = run_hpcdl("train", f"run_dir={ref}", *overrides, cwd=tmp_path, env=ONE_THREAD)
    assert out.returncode == 0, out.stderr
    return summary(ref)["weights_sha256"]


def sbatch_wrap(command: str, *options: str) -> str:
    """A plain `sbatch --wrap` job (not through hpcdl); returns its job id."""
    out = subprocess.run(
        ["sbatch", "--parsable", *options, "--wrap", command],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def wait_done(run_dir: Path, timeout_s: float = 300) -> dict:
    """Until the job has written its summary and recorded the attempt's end."""

    def finished() -> bool:
        if not (run_dir / "summary.json").exists():
            return False
        if not (run_dir / "attempts.jsonl").exists():  # the plain sbatch route records too
            return False
        last = attempts(run_dir)[-1]
        return last["event"] == "end" and last["reason"] == "completed"

    wait_until(finished, timeout_s, f"{run_dir} to complete")
    return summary(run_dir)


def wait_for_checkpoint(run_dir: Path) -> None:
    wait_until(
        lambda: any((run_dir / "checkpoints").glob("step_*.pt")), 120, "a first checkpoint", 0.2
    )


def test_cluster_is_up_with_two_idle_nodes(devcluster) -> None:
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %P %t %G %f"], capture_output=True, text=True
    )
    lines = out.stdout.splitlines()
    assert {ln.split()[0] for ln in lines} == {"n1", "n2"}
    assert any("gpu:a100:4" in ln and "gpupod" in ln for ln in lines)


def test_single_node_job_returns_at_once_completes_and_matches_in_process(
    devcluster, tmp_path
) -> None:
    job_id, run_dir, submit_s = submit(tmp_path)
    print(f"submit returned in {submit_s:.2f}s")
    assert job_id in squeue_ids() or sacct_state(job_id)  # queued for real
    s = wait_done(run_dir)
    assert s["test_accuracy"] >= 0.95
    assert s["weights_sha256"] == reference_sha(tmp_path)
    record = attempts(run_dir)
    assert [a["event"] for a in record] == ["start", "end"] and record[1]["reason"] == "completed"
    assert record[0]["job_id"] == job_id and record[0]["git_revision"]
    wait_until(lambda: sacct_state(job_id) == "COMPLETED", 60, "sacct COMPLETED")
    status = run_hpcdl("status", str(run_dir), cwd=tmp_path)
    assert (
        status.returncode == 0 and "COMPLETED" in status.stdout and "attempts: 1" in status.stdout
    )
    logs = run_hpcdl("logs", str(run_dir), cwd=tmp_path)
    assert logs.returncode == 0 and "epoch 30/30" in logs.stdout


def test_export_none_job_name_and_a_failing_setup_line(devcluster, tmp_path) -> None:
    """A site's --export=NONE (submitit's ranks failed: "Could not figure out which
    environment the job is running in"), the user's own --job-name (hpcdl's won), and a
    setup line that fails (the job trained on and was COMPLETED)."""
    named = run_hpcdl(
        "train", "cluster=devcluster", "run_dir=named", "trainer.max_epochs=1",
        "+cluster.sbatch_extra.export=NONE", "+cluster.sbatch_extra.job-name=myjob",
        cwd=tmp_path,
    )  # fmt: skip
    assert named.returncode == 0, named.stderr
    broken = run_hpcdl(
        "train", "cluster=devcluster", "run_dir=broken", "trainer.max_epochs=1",
        "cluster.setup=[echo setting up, ls /nonexistent, echo never]", cwd=tmp_path,
    )  # fmt: skip
    assert broken.returncode == 0, broken.stderr
    job = json.loads((tmp_path / "named" / "slurm.json").read_text())["job_id"]
    wait_done(tmp_path / "named")
    out = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-j", job, "-o", "JobName"], capture_output=True, text=True
    )
    assert out.stdout.split() == ["myjob"], out.stdout
    failed = json.loads((tmp_path / "broken" / "slurm.json").read_text())["job_id"]
    wait_until(lambda: sacct_state(failed) == "FAILED", 120, "the broken setup's job")
    assert not (tmp_path / "broken" / "summary.json").exists()
    log = "".join(p.read_text() for p in (tmp_path / "broken" / "logs").glob("*.out"))
    assert "setting up" in log and "never" not in log, log
    assert "error: cluster.setup: `ls /nonexistent` failed (exit 2); the job stops" in log, log
    status = run_hpcdl("status", "broken", cwd=tmp_path)
    assert status.returncode == 1 and "state: FAILED" in status.stdout, status.stdout
    assert (
        "cause: cluster.setup: `ls /nonexistent` failed (exit 2): ls: cannot access "
        "'/nonexistent': No such file or directory\n"
    ) in status.stdout, status.stdout


def test_cluster_python_found_after_the_setup_and_one_no_node_has(devcluster, tmp_path) -> None:
    """cluster.python=python3 is looked up on the node's PATH after cluster.setup (which
    puts a folder first whose python3 records that it ran, then runs this interpreter); one
    no node has fails the job, and `hpcdl status` names it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ran = tmp_path / "ran"
    python3 = bin_dir / "python3"
    python3.write_text(
        f'#!/bin/sh\necho ran >> {shlex.quote(str(ran))}\nexec {shlex.quote(sys.executable)} "$@"\n'
    )
    python3.chmod(0o755)
    for run_dir, python, setup in [
        ("found", "python3", f"['export PATH={bin_dir}:$PATH']"),
        ("missing", "/nonexistent/python3", "[]"),
    ]:
        out = run_hpcdl(
            "train", "cluster=devcluster", f"run_dir={run_dir}", "trainer.max_epochs=1",
            f"cluster.python={python}", f"cluster.setup={setup}", cwd=tmp_path,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
    wait_done(tmp_path / "found", 120)
    assert ran.read_text() == "ran\n"  # one rank, through the setup's PATH
    failed = json.loads((tmp_path / "missing" / "slurm.json").read_text())["job_id"]
    wait_until(lambda: sacct_state(failed) == "FAILED", 120, "the missing interpreter's job")
    status = run_hpcdl("status", "missing", cwd=tmp_path)
    assert status.returncode == 1, status.stdout + status.stderr
    assert re.search(
        r"cause: rank 0: could not start /nonexistent/python3 on n[12] \(No such file or "
        r"directory\); set cluster.python to an interpreter the compute nodes have",
        status.stdout,
    ), status.stdout


def test_submission_path_never_imports_torch(devcluster, tmp_path) -> None:
    code = (
        "from hpcdl.cli.main import main\n"
        f"rc = main(['train', 'cluster=devcluster', 'run_dir={tmp_path / 'run'}', 'trainer.max_epochs=1'])\n"
        "assert rc == 0\n"
    )
    run_without_torch(code, cwd=tmp_path)
    wait_done(tmp_path / "run")


def test_two_nodes_two_tasks_each_train_with_four_ranks(devcluster, tmp_path) -> None:
    _, run_dir, _ = submit(
        tmp_path,
        "model=cnn",
        "data=digits",
        "cluster.nodes=2",
        "cluster.gpus_per_node=2",
        "trainer.max_epochs=8",
    )
    s = wait_done(run_dir)
    assert s["world_size"] == 4
    assert s["test_accuracy"] >= 0.9
    assert attempts(run_dir)[0]["nodes"] == "n[1-2]"
    assert len(list((run_dir / "logs").glob("*_log.out"))) == 4  # one log per rank


def test_outside_scontrol_requeue_mid_run_resumes_exactly(devcluster, tmp_path) -> None:
    job_id, run_dir, _ = submit(tmp_path, *LONG)
    wait_for_checkpoint(run_dir)
    subprocess.run(["scontrol", "requeue", job_id], check=True)
    s = wait_done(run_dir)
    record = attempts(run_dir)
    starts = [a for a in record if a["event"] == "start"]
    assert len(starts) >= 2 and starts[-1]["restart_count"] >= 1
    assert s["weights_sha256"] == reference_sha(tmp_path, *LONG)
    # Slurm's SIGCONT before the requeue's SIGTERM is no line of the rank's log (submitit
    # logged "Bypassing signal SIGCONT" for it).
    log = (run_dir / "logs" / f"{job_id}_0_log.out").read_text()
    assert "DUE TO JOB REQUEUE" in log and "SIGCONT" not in log.replace("srun: got SIGCONT", "")


# A researcher's own package: a model class, a lazily computed dataset with random
# augmentation, and a custom step with a metric of its own.
USER_PACKAGE = {
    "labcode/__init__.py": "",
    "labcode/nets.py": (
        "from torch import nn\n"
        "class Net(nn.Module):\n"
        "    def __init__(self, width=16):\n"
        "        super().__init__()\n"
        "        self.body = nn.Sequential(nn.Linear(6, width), nn.ReLU(), nn.Dropout(0.2), nn.Linear(width, 3))\n"
        "    def forward(self, x):\n"
        "        return self.body(x)\n"
    ),
    "labcode/data.py": (
        "import torch\n"
        "from torch.utils.data import Dataset\n"
        "class Points(Dataset):\n"
        "    def __init__(self, n, offset):\n"
        "        self.n, self.offset = n, offset\n"
        "    def __len__(self):\n"
        "        return self.n\n"
        "    def __getitem__(self, i):\n"
        "        g = torch.Generator().manual_seed(self.offset + i)\n"
        "        y = (self.offset + i) % 3\n"
        "        x = torch.randn(6, generator=g) + y + 0.1 * torch.randn(6)  # augmentation\n"
        "        return {'x': x, 'y': y}\n"
        "def build(n=3000):\n"
        "    return {'train': Points(n, 0), 'val': Points(200, 10**6)}\n"
    ),
    "labcode/steps.py": (
        "import torch.nn.functional as F\n"
        "def step(model, batch):\n"
        "    logits = model(batch['x'])\n"
        "    hit = (logits.argmax(1) == batch['y']).float().mean()\n"
        "    return F.cross_entropy(logits, batch['y']), {'hit': hit}\n"
    ),
}
USER_RUN = [
    "model=custom",
    "model.target=labcode.nets:Net",
    "data=custom",
    "data.target=labcode.data:build",
    "data.num_workers=1",
    "task=custom",
    "task.target=labcode.steps:step",
    "trainer.early_stopping.monitor=val_hit",
    "trainer.early_stopping.mode=max",
    "trainer.batch_size=4",
    "trainer.max_epochs=4",
    "trainer.checkpoint_every_steps=300",
    "trainer.log_every_steps=1000",
]


def test_users_own_model_data_and_task_survive_scontrol_requeue_exactly(
    devcluster, tmp_path
) -> None:
    src = tmp_path / "src"
    for name, text in USER_PACKAGE.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    env = {"PYTHONPATH": str(src), **ONE_THREAD}
    run_dir = tmp_path / "run"
    out = run_hpcdl(
        "train", "cluster=devcluster", f"run_dir={run_dir}", *USER_RUN, cwd=tmp_path, env=env
    )
    assert out.returncode == 0, out.stderr + out.stdout
    assert "labcode" in (run_dir / "code" / "FROZEN").read_text()  # frozen with the code
    job_id = json.loads((run_dir / "slurm.json").read_text())["job_id"]
    wait_for_checkpoint(run_dir)
    subprocess.run(["scontrol", "requeue", job_id], check=True)
    s = wait_done(run_dir)
    starts = [a for a in attempts(run_dir) if a["event"] == "start"]
    assert len(starts) >= 2 and starts[-1]["restart_count"] >= 1
    assert s["test_hit"] is None and s["best_metric_name"] == "val_hit"
    ref = tmp_path / "reference"
    out = run_hpcdl("train", f"run_dir={ref}", *USER_RUN, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert s["weights_sha256"] == summary(ref)["weights_sha256"]


def test_preemption_by_the_urgent_partition_requeues_and_resumes_exactly(
    devcluster, tmp_path
) -> None:
    cpu = [
        "cluster.partition=cpu",
        "cluster.gpus_per_node=0",
        "cluster.gpu_type=null",
        "cluster.constraint=null",
    ]
    _, run_dir, _ = submit(tmp_path, *cpu, *LONG)
    wait_for_checkpoint(run_dir)
    # Both whole nodes for the urgent job: the victim must give way.
    urgent = sbatch_wrap("sleep 5", "-p", "urgent", "-N", "2", "--exclusive", "-o", "/dev/null")
    wait_until(lambda: sacct_state(urgent) == "COMPLETED", 180, "the urgent job")
    s = wait_done(run_dir)
    ends = [a for a in attempts(run_dir) if a["event"] == "end"]
    assert ends[0]["reason"] == "preempted" and ends[0]["signal"] == "SIGUSR2"
    assert s["weights_sha256"] == reference_sha(tmp_path, *LONG)


# The same model, but each training step takes 50 ms more inside a Slurm job (a sleep: no
# CPU). The run's length is then wall time that the machine's load barely changes, and the
# reference in-process run (no SLURM_JOB_ID) trains the same weights in seconds.
SLOW_NET = (
    "import os, time\n"
    "from labcode.nets import Net\n"
    "class SlowNet(Net):\n"
    "    def forward(self, x):\n"
    "        if self.training and os.environ.get('SLURM_JOB_ID'):\n"
    "            time.sleep(0.05)\n"
    "        return super().forward(x)\n"
)


def test_too_short_time_limit_requeues_itself_until_done(devcluster, tmp_path) -> None:
    # A 2-minute limit with the warning 30 s before it; Slurm may send it up to 60 s early
    # and ~30 s late, so each attempt trains 30-120 s. The run sleeps 150 s in its 3000
    # training steps (4 epochs of 750): at least one time-limit stop, save, self-requeue
    # and exact resume (mid-epoch, with a DataLoader worker's random augmentation).
    src = tmp_path / "src"
    for name, text in {**USER_PACKAGE, "labcode/slow.py": SLOW_NET}.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    env = {"PYTHONPATH": str(src), **ONE_THREAD}
    run = [o.replace("labcode.nets:Net", "labcode.slow:SlowNet") for o in USER_RUN]
    limits = ["cluster.timeout_min=2", "cluster.signal_delay_s=30", "cluster.max_requeues=6"]
    run_dir = tmp_path / "run"
    out = run_hpcdl(
        "train", "cluster=devcluster", f"run_dir={run_dir}", *limits, *run, cwd=tmp_path, env=env
    )
    assert out.returncode == 0, out.stderr + out.stdout
    ref = tmp_path / "reference"
    out = run_hpcdl("train", f"run_dir={ref}", *run, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    s = wait_done(run_dir, timeout_s=540)
    ends = [a for a in attempts(run_dir) if a["event"] == "end"]
    timeouts = [a for a in ends if a["reason"] == "timeout"]
    assert timeouts and all(a["action"] == "requeued" for a in timeouts), ends
    assert ends[-1]["reason"] == "completed"
    assert s["weights_sha256"] == summary(ref)["weights_sha256"]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["cluster.partition=nope"], "cluster.partition='nope': no such partition"),
        (
            ["cluster.gpus_per_node=5"],
            "cluster.gpus_per_node=5 (--gres=gpu:a100:5): partition 'gpu' nodes have at most 4",
        ),
        (
            ["cluster.gpu_type=h100"],
            "cluster.gpu_type='h100': partition 'gpu' has no h100 GPUs; its types are a100",
        ),
        (
            ["cluster.constraint=nvlink"],
            "cluster.constraint='nvlink': no node in partition 'gpu' has it",
        ),
        (
            ["cluster.timeout_min=120"],
            "cluster.timeout_min=120: partition 'gpu' allows at most 60 minutes",
        ),
        (["cluster.nodes=3"], "cluster.nodes=3: partition 'gpu' has 2 nodes"),
        (
            ["cluster.cpus_per_task=20"],
            "cluster.cpus_per_task=20: 1 task per node needs 20 CPUs, and partition 'gpu' "
            "nodes have at most 8",
        ),
        (
            ["cluster.partition=cpu", "cluster.gpus_per_node=0", "cluster.tasks_per_node=9"],
            "cluster.tasks_per_node=9: 9 tasks per node need 9 CPUs, and partition 'cpu' nodes "
            "have at most 8 (sinfo); lower the tasks per node",
        ),
        (["cluster.mem_gb=100"], "cluster.mem_gb=100: partition 'gpu' nodes have at most 7.8 GB"),
        (  # refused by sbatch itself: its reason in one line, the run dir removed again
            ["+cluster.sbatch_extra.exclusve=true"],
            "cluster.sbatch_extra.exclusve: sbatch has no option --exclusve",
        ),
    ],
)
def test_preflight_refuses_impossible_requests(devcluster, tmp_path, overrides, expected) -> None:
    before = set(squeue_ids())
    out = run_hpcdl("train", "cluster=devcluster", "run_dir=run", *overrides, cwd=tmp_path)
    assert out.returncode == 2
    assert expected in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "run").exists()
    assert not (set(squeue_ids()) - before)  # nothing submitted


def test_preflight_counts_one_torchrun_task_per_node(devcluster, tmp_path) -> None:
    # sbatch asks for one task per node, whose torchrun starts 9 workers on its CPUs: the
    # request fits a node of 8 CPUs (it was refused as '9 tasks per node need 9 CPUs').
    (tmp_path / "train.py").write_text("print('hi')\n")
    overrides = ["cluster.partition=cpu", "cluster.gpus_per_node=0", "cluster.tasks_per_node=9"]
    out = run_hpcdl(
        "run", "cluster=devcluster", *overrides, "launcher=torchrun", "--dry-run",
        "--", "python", "train.py", cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "#SBATCH --ntasks-per-node=1\n" in out.stdout
    assert "# preflight: the cluster can run this request\n" in out.stdout, out.stdout


def test_dry_run_script_is_accepted_by_sbatch(devcluster, tmp_path) -> None:
    out = run_hpcdl(
        "train",
        "cluster=devcluster",
        "cluster.nodes=2",
        "cluster.gpus_per_node=2",
        "--dry-run",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    script = "\n".join(
        ln
        for ln in out.stdout.splitlines()
        if not ln.startswith(("# run dir", "  RANK", "# per-rank", "# dry run"))
    )
    (tmp_path / "job.sh").write_text(script)
    test = subprocess.run(
        ["sbatch", "--test-only", str(tmp_path / "job.sh")], capture_output=True, text=True
    )
    assert test.returncode == 0 and "to start at" in test.stderr, test.stderr
    assert "# preflight: the cluster can run this request" in out.stdout
    # ... and the dry run asked sbatch --test-only itself
    assert "# sbatch --test-only: the controller would take it, to start at" in out.stdout
    # What only sbatch and the controller check (a node list from sbatch_extra): refused by
    # the dry run in one line that names the key, nothing submitted.
    before = set(squeue_ids())
    refused = run_hpcdl(
        "train", "cluster=devcluster", "cluster.sbatch_extra.nodelist=nosuchnode", "--dry-run",
        cwd=tmp_path,
    )  # fmt: skip
    assert refused.returncode == 2 and "#SBATCH --nodelist=nosuchnode" in refused.stdout
    assert refused.stderr.startswith("error: sbatch --test-only refused the job: "), refused.stderr
    assert "(from cluster.sbatch_extra: --nodelist=nosuchnode)" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert not (set(squeue_ids()) - before)
    # A request the cluster would refuse: the script, then the refusal, as a submit gives it.
    refused = run_hpcdl(
        "train", "cluster=devcluster", "cluster.gpus_per_node=5", "--dry-run", cwd=tmp_path
    )
    assert refused.returncode == 2 and "#SBATCH" in refused.stdout, refused.stdout
    assert "cluster.gpus_per_node=5 (--gres=gpu:a100:5): partition 'gpu'" in refused.stderr
    # A sweep's dry run: its job array's script, then the same verdict, naming the trial.
    sweep = ["train", "-m", "optim.lr=0.1,0.01", "cluster=devcluster", "cluster.nodes=5"]
    refused = run_hpcdl(*sweep, "--dry-run", cwd=tmp_path)
    assert refused.returncode == 2 and "#SBATCH --array" in refused.stdout, refused.stdout
    assert refused.stderr.startswith("error: trial 0 (optim.lr=0.1): cluster.nodes=5")


def test_plain_sbatch_template_runs_the_same_payload(devcluster, tmp_path) -> None:
    run_dir = tmp_path / "run"
    out = run_hpcdl(
        "train",
        "cluster=devcluster",
        f"run_dir={run_dir}",
        "trainer.max_epochs=5",
        "--no-launch",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    # The template asks for the workshop's 4 A100s for 2 h; the dev cluster's partitions
    # allow 60 min, so shrink the request on the command line (it overrides #SBATCH lines).
    sbatch = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--time=10",
            "--gres=gpu:a100:1",
            "--ntasks-per-node=1",
            "--cpus-per-task=1",
            "--mem=1G",
            f"--output={tmp_path}/sbatch-%j.out",
            str(REPO / "slurm" / "train.sbatch"),
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **ONE_THREAD},
    )
    assert sbatch.returncode == 0, sbatch.stderr
    s = wait_done(run_dir)
    assert s["weights_sha256"] == reference_sha(tmp_path, "trainer.max_epochs=5")
    assert (run_dir / "logs" / f"{sbatch.stdout.strip()}_0_log.out").exists()


# LONG's whole job took 7 s once (0.5 s an epoch), and ended before the cancel reached it:
# ten times the samples keep it running for the cancel, at 40-60 s for the rerun below.
CANCELLED_RUN = [o.replace("num_samples=4000", "num_samples=40000") for o in LONG]


def test_cancel_stops_a_running_job(devcluster, tmp_path) -> None:
    job_id, run_dir, _ = submit(tmp_path, *CANCELLED_RUN)
    wait_for_checkpoint(run_dir)
    busy = run_hpcdl("resume", str(run_dir), cwd=tmp_path)  # one run dir, one job at a time
    assert busy.returncode == 2 and f"its job {job_id} is still RUNNING" in busy.stderr
    out = run_hpcdl("cancel", str(run_dir), cwd=tmp_path)
    assert out.returncode == 0 and f"cancelled job {job_id}" in out.stdout
    wait_until(lambda: sacct_state(job_id).startswith("CANCELLED"), 60, "CANCELLED in sacct")
    assert not (run_dir / "summary.json").exists()
    # squeue may show the job COMPLETING for KillWait seconds before it leaves the queue.
    wait_until(
        lambda: "CANCELLED" in run_hpcdl("status", job_id, cwd=tmp_path).stdout,
        60,
        "status CANCELLED",
    )
    again = run_hpcdl("cancel", str(run_dir), cwd=tmp_path)  # scancel would say nothing
    assert again.returncode == 0 and "has already ended (CANCELLED)" in again.stdout
    # A job id neither squeue nor sacct knows (a typo) is named so, not "no accounting".
    typo = run_hpcdl("status", str(int(job_id) + 9000), cwd=tmp_path)
    assert typo.returncode == 2, typo.stdout + typo.stderr
    assert f"job {int(job_id) + 9000}: neither squeue nor sacct knows it" in typo.stderr
    # Rerun it from its newest checkpoint on another profile: local ranks, same world size.
    local = run_hpcdl(
        "resume",
        str(run_dir),
        "cluster=local",
        "cluster.tasks_per_node=1",
        cwd=tmp_path,
        env=ONE_THREAD,
    )
    assert local.returncode == 0, local.stderr + local.stdout
    assert "resumed from" in local.stdout
    assert summary(run_dir)["weights_sha256"] == reference_sha(tmp_path, *CANCELLED_RUN)


def test_a_job_submitted_from_inside_a_job_gets_its_own_geometry(devcluster, tmp_path) -> None:
    # The outer job has 2 tasks on 2 nodes; its SLURM_* variables must not leak into the
    # inner submission (which asks for 1 node, 1 task).
    inner = tmp_path / "inner"
    command = (
        f"{sys.executable} -m hpcdl.cli.main train cluster=devcluster run_dir={inner} "
        "trainer.max_epochs=2"
    )
    outer = sbatch_wrap(
        command, "-N", "2", "-n", "2", f"--output={tmp_path}/outer-%j.out", f"--chdir={tmp_path}"
    )
    wait_until(lambda: sacct_state(outer) == "COMPLETED", 120, "the outer job")
    s = wait_done(inner)
    assert s["world_size"] == 1
    assert attempts(inner)[0]["nodes"] in ("n1", "n2")


def test_the_users_model_module_is_frozen_at_submission(devcluster, tmp_path) -> None:
    # Submitted from the folder holding the module (the job's working directory too): an
    # edit made right after submitting must not reach the job, nor shadow the frozen copy.
    marker = tmp_path / "imported_from.txt"
    (tmp_path / "mymodels.py").write_text(
        "import math\nfrom pathlib import Path\nfrom torch import nn\n\n\n"
        "def build(input_shape, num_classes, width=16):\n"
        f"    Path({str(marker)!r}).write_text(__file__)\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), width),"
        " nn.ReLU(), nn.Linear(width, num_classes))\n"
    )
    run_dir = tmp_path / "run"
    out = run_hpcdl(
        "train",
        "cluster=devcluster",
        f"run_dir={run_dir}",
        "model=custom",
        "model.target=mymodels:build",
        "model.kwargs.width=32",
        "trainer.max_epochs=3",
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr + out.stdout
    (tmp_path / "mymodels.py").write_text("raise ImportError('edited after submission')\n")
    s = wait_done(run_dir)
    assert s["test_accuracy"] >= 0.9
    assert Path(marker.read_text()).parent == run_dir / "code"
    assert (run_dir / "code" / "FROZEN").read_text().startswith("mymodels ")
