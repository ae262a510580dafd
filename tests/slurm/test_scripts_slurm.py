"""`hpcdl run` on the real dev cluster: plain PyTorch scripts as people write them (DDP from
env://), under srun and torchrun, requeued with and without hpcdl.api, and swept."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_hpcdl
from tests.slurm.conftest import wait_until

pytestmark = pytest.mark.slurm

# What people write: process group from env://, rank 0 reports.
DDP_SCRIPT = """\
import json, os, sys
import torch, torch.distributed as dist
from ddp_util import describe  # a module beside the script: frozen with it, importable


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
local = os.environ["LOCAL_RANK"]
print(describe(rank, world, local, total.item()), flush=True)
if rank == 0:
    with open(os.path.join(os.environ["HPCDL_RUN_DIR"], "result.json"), "w") as f:
        json.dump({"world": world, "sum": total.item()}, f)
dist.destroy_process_group()
"""

# A training loop that uses hpcdl.api: resumes from the store, saves when asked to stop.
API_SCRIPT = """\
import sys, time
import torch
import hpcdl.api as hp

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
hp.catch_stop_signals()
store = hp.checkpoint_store()
step = 0
found = store.load_latest()
if found is not None:
    state = found[1]
    model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"])
    torch.set_rng_state(state["rng"]); step = state["step"]
    print(f"continuing at step {step} (restart {hp.restart_count()})", flush=True)
total = int(sys.argv[1])
while step < total:
    x = torch.randn(8, 4)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step(); step += 1
    if step % 50 == 0 or hp.stop_requested():
        store.save({"model": model.state_dict(), "opt": opt.state_dict(),
                    "rng": torch.get_rng_state(), "step": step}, step)
        if hp.stop_requested():
            raise SystemExit(hp.EXIT_REQUEUE)
    time.sleep(float(sys.argv[2]))
print("final", [round(float(v), 6) for v in model.weight.flatten()], flush=True)
"""

# Ignores hpcdl entirely: runs until killed, unless this is a continuation.
IGNORANT_SCRIPT = """\
import os, time
if int(os.environ.get("HPCDL_RESTART_COUNT", "0")) > 0:
    print("second attempt: done", flush=True)
    raise SystemExit(0)
while True:
    time.sleep(0.5)
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / "src" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def hpcdl_run(tmp_path: Path, *args: str) -> Path:
    out = run_hpcdl("run", *args, cwd=tmp_path / "src", env={"OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr + out.stdout
    assert "submitted job" in out.stdout
    return Path(out.stdout.split("run dir: ")[1].split()[0])


def wait_done(run_dir: Path, timeout_s: float = 300) -> dict:
    wait_until(lambda: (run_dir / "summary.json").exists(), timeout_s, "the run's summary", 0.5)
    wait_until(
        lambda: any(
            json.loads(line).get("event") == "end"
            for line in (run_dir / "attempts.jsonl").read_text().splitlines()[-1:]
        ),
        60,
        "the attempt's end record",
        0.5,
    )
    return json.loads((run_dir / "summary.json").read_text())


def attempts(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "attempts.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_plain_ddp_script_on_two_nodes(devcluster, tmp_path, launcher) -> None:
    write(tmp_path, "ddp.py", DDP_SCRIPT)
    write(
        tmp_path,
        "ddp_util.py",
        "def describe(rank, world, local, total):\n"
        "    return f'rank {rank} of {world}, local rank {local}, sum {total:.0f}'\n",
    )
    run_dir = hpcdl_run(
        tmp_path,
        "cluster=devcluster",
        "cluster.nodes=2",
        "cluster.tasks_per_node=2",
        f"launcher={launcher}",
        "metrics_file=result.json",
        f"run_dir={tmp_path / 'run'}",
        "--",
        "python",
        "ddp.py",
    )
    summary = wait_done(run_dir)
    assert summary["outcome"] == "completed" and summary["world"] == 4 and summary["sum"] == 10
    assert (run_dir / "code" / "script" / "ddp_util.py").exists()  # frozen with the run
    logs = "".join(p.read_text() for p in (run_dir / "logs").glob("*_log.out"))
    for rank in range(4):
        assert f"rank {rank} of 4, local rank {rank % 2}" in logs


def test_api_script_survives_scontrol_requeue_with_the_same_weights(devcluster, tmp_path) -> None:
    write(tmp_path, "fit.py", API_SCRIPT)
    reference = run_hpcdl(
        "run", "run_dir=ref", "--", "python", "fit.py", "400", "0", cwd=tmp_path / "src"
    )
    assert reference.returncode == 0, reference.stderr
    run_dir = hpcdl_run(
        tmp_path,
        "cluster=devcluster",
        f"run_dir={tmp_path / 'run'}",
        "--",
        "python",
        "fit.py",
        "400",
        "0.02",
    )
    job_id = json.loads((run_dir / "slurm.json").read_text())["job_id"]
    wait_until(lambda: any((run_dir / "checkpoints").glob("step_*.pt")), 120, "a checkpoint", 0.2)
    subprocess.run(["scontrol", "requeue", job_id], check=True)
    wait_done(run_dir)
    starts = [a for a in attempts(run_dir) if a["event"] == "start"]
    assert len(starts) >= 2
    # Recorded as what it was, not as a cancel: Slurm had already counted the restart.
    ends = [a for a in attempts(run_dir) if a["event"] == "end"]
    assert ends[0]["reason"] == "requeued", ends
    log = (run_dir / "logs" / f"{job_id}_0_log.out").read_text()
    assert "continuing at step" in log
    final = [ln for ln in log.splitlines() if ln.startswith("final")][-1]
    assert final in reference.stdout  # the uninterrupted run's final weights


def test_api_script_on_a_too_short_time_limit_completes_as_a_chain_of_jobs(
    devcluster, tmp_path
) -> None:
    # cluster.requeue=chain, as where `scontrol requeue` is unavailable: each stop submits
    # the next job with --dependency=afterany. The first job gets the warning signal early
    # (as on preemption); the second runs into its 2-minute limit (warning 30 s before it,
    # Slurm may send it up to 60 s early: 30-90 s of work); the run needs ~110 s, so a
    # third job finishes it.
    write(tmp_path, "fit.py", API_SCRIPT)
    reference = run_hpcdl(
        "run", "run_dir=ref", "--", "python", "fit.py", "440", "0", cwd=tmp_path / "src"
    )
    assert reference.returncode == 0, reference.stderr
    run_dir = hpcdl_run(
        tmp_path,
        "cluster=devcluster",
        "cluster.requeue=chain",
        "cluster.timeout_min=2",
        "cluster.signal_delay_s=30",
        "cluster.max_requeues=4",
        f"run_dir={tmp_path / 'run'}",
        "--",
        "python",
        "fit.py",
        "440",
        "0.25",
    )
    first = json.loads((run_dir / "slurm.json").read_text())["job_id"]
    wait_until(lambda: any((run_dir / "checkpoints").glob("step_*.pt")), 120, "a checkpoint", 0.2)
    subprocess.run(["scancel", "--signal=USR2", first], check=True)
    wait_done(run_dir, timeout_s=420)
    records = attempts(run_dir)
    jobs = [a["job_id"] for a in records if a["event"] == "start"]
    ends = [a for a in records if a["event"] == "end"]
    assert len(set(jobs)) >= 3 and jobs[0] == first, records
    assert all(a["action"].startswith("chained: job ") for a in ends[:-1]), ends
    assert ends[-1]["reason"] == "completed"
    history = json.loads((run_dir / "slurm.json").read_text())["history"]
    assert [h["job_id"] for h in history] == list(dict.fromkeys(jobs))  # status follows
    # The last job leaves the queue a moment after its payload has written the end.
    wait_until(
        lambda: "COMPLETED" in run_hpcdl("status", str(run_dir), cwd=tmp_path).stdout,
        60,
        "the last job of the chain to be COMPLETED",
        1.0,
    )
    status = run_hpcdl("status", str(run_dir), cwd=tmp_path)
    assert f"job_id: {jobs[-1]}" in status.stdout, status.stdout
    logs = [(run_dir / "logs" / f"{j}_0_log.out").read_text() for j in dict.fromkeys(jobs)]
    assert "continuing at step" in logs[-1] and "(restart " in logs[-1]
    final = [ln for ln in logs[-1].splitlines() if ln.startswith("final")][-1]
    assert final in reference.stdout  # the uninterrupted run's final weights


def test_a_script_that_ignores_hpcdl_is_signalled_and_requeued(devcluster, tmp_path) -> None:
    write(tmp_path, "loop.py", IGNORANT_SCRIPT)
    run_dir = hpcdl_run(
        tmp_path, "cluster=devcluster", f"run_dir={tmp_path / 'run'}", "--", "python", "loop.py"
    )
    job_id = json.loads((run_dir / "slurm.json").read_text())["job_id"]
    wait_until(lambda: (run_dir / "attempts.jsonl").exists(), 120, "the job's start", 0.2)
    # The warning signal, as Slurm sends it before a time limit or on preemption.
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
    summary = wait_done(run_dir)
    assert summary["outcome"] == "completed"
    ends = [a for a in attempts(run_dir) if a["event"] == "end"]
    assert ends[0]["reason"] == "preempted" and ends[0]["action"] == "requeued"
    assert list((run_dir / "stop").iterdir())  # the stop file appeared for the first attempt


def test_script_sweep_is_one_array_and_rerun_failed_reruns_only_the_failed(
    devcluster, tmp_path
) -> None:
    write(
        tmp_path,
        "trial.py",
        "import json, os, sys\n"
        "seed, lr = sys.argv[2], sys.argv[4]\n"
        "if seed == '3' and lr == '0.2' and not os.path.exists(sys.argv[5]):\n"
        "    raise SystemExit('diverged')\n"
        "scale = float(open('scale.txt').read())  # relative: the folder of `hpcdl run`\n"
        "with open(os.path.join(os.environ['HPCDL_RUN_DIR'], 'm.json'), 'w') as f:\n"
        "    json.dump({'val_accuracy': float(lr) * int(seed) * scale}, f)\n",
    )
    write(tmp_path, "scale.txt", "1")
    fixed = tmp_path / "FIXED"
    sweep = tmp_path / "sw"
    out = run_hpcdl(
        "run",
        "-m",
        "cluster=devcluster",
        f"hydra.sweep.dir={sweep}",
        "metrics_file=m.json",
        "--",
        "python",
        "trial.py",
        "--seed",
        "{1,2,3}",
        "--lr",
        "{0.1,0.2}",
        str(fixed),
        cwd=tmp_path / "src",
    )
    assert out.returncode == 0, out.stderr + out.stdout
    trials = json.loads((sweep / "sweep.json").read_text())["trials"]
    assert len(trials) == 6 and len({t["job_id"].split("_")[0] for t in trials}) == 1
    # Each trial's program starts where `hpcdl run -m` ran, also when rerun from elsewhere
    # (below, from tmp_path): the folder is recorded, as for a single run.
    config = (sweep / "5" / "config.yaml").read_text()
    assert f"workdir: {tmp_path / 'src'}\n" in config, config

    def settled() -> bool:
        status = run_hpcdl("sweep", "status", str(sweep), cwd=tmp_path)
        return "5 COMPLETED" in status.stdout and "1 FAILED" in status.stdout

    wait_until(settled, 300, "five completed trials and one failed", 2.0)
    fixed.write_text("")
    rerun = run_hpcdl("sweep", "rerun", str(sweep), "--failed", cwd=tmp_path)
    assert rerun.returncode == 0 and "rerunning 1 trial: 5" in rerun.stdout, rerun.stdout
    wait_until(
        lambda: "6 COMPLETED" in run_hpcdl("sweep", "status", str(sweep), cwd=tmp_path).stdout,
        300,
        "all six completed",
        2.0,
    )
    ledger = json.loads((sweep / "sweep.json").read_text())["trials"]
    assert [t["attempts"] for t in ledger] == [1, 1, 1, 1, 1, 2]
    summary = run_hpcdl("sweep", "summary", str(sweep), cwd=tmp_path)
    rows = [ln for ln in summary.stdout.splitlines() if ln.startswith("| ")]  # header, rows
    assert "--seed=3 --lr=0.2" in rows[1], summary.stdout  # the best: 0.6
    assert summary.stdout.startswith("ranked by val_accuracy, highest first"), summary.stdout
