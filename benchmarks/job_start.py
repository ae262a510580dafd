"""P4 job start: from the moment a job's batch script starts on its node to the end of its
first optimizer step. An hpcdl job (`hpcdl train cluster=devcluster`, the workshop's MLP on
breast cancer) against a hand-written `sbatch` script whose `srun python train.py` does the
same work the plain way: import torch, read and standardize the same data with
scikit-learn, build the same MLP and SGD optimizer, one step.

Both batch scripts write `date +%s.%N` as their first command (hpcdl's through
`cluster.setup`), and both programs write time.time() after their first optimizer step
(hpcdl's through a step hook), so the two spans are measured alike, on the same clock.
Queue wait is not counted. Needs the dev cluster: `slurm/devcluster up`, then
`eval "$(slurm/devcluster env)"`; `python -m benchmarks.run job_start`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.base import Row, Settings
from benchmarks.timing import compared, interleaved

HAND_TRAIN = """\
import sys, time
import torch
from sklearn.datasets import load_breast_cancer
from torch import nn

x, y = load_breast_cancer(return_X_y=True)
x = (x - x.mean(0)) / x.std(0)
x, y = torch.tensor(x, dtype=torch.float32), torch.tensor(y)
torch.manual_seed(0)
model = nn.Sequential(
    nn.Linear(30, 30), nn.ReLU(), nn.Dropout(0.5),
    nn.Linear(30, 60), nn.ReLU(), nn.Dropout(0.5), nn.Linear(60, 2),
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
idx = torch.randperm(len(x))[:32]
optimizer.zero_grad()
nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
optimizer.step()
with open(sys.argv[1], "w") as out:
    out.write(f"{time.time():.6f}\\n")
"""

HAND_SBATCH = """\
#!/bin/bash
#SBATCH --job-name=hand-written
#SBATCH --partition=gpu
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:a100:1
#SBATCH --constraint=gpupod
#SBATCH --time=10
#SBATCH --output={log}
date +%s.%N > {start}
export OMP_NUM_THREADS=1
srun {python} {train} {first_step}
"""

HPCDL_TRAIN = (
    sys.executable,
    "-m",
    "hpcdl.cli.main",
    "train",
    "cluster=devcluster",
    "trainer.max_steps=1",
    "trainer.step_hooks=[p4hook:after_step]",
)
# Written by the hpcdl job's step hook, the same way.
HOOK = """\
import os, time

def after_step(event):
    if event.global_step == 1 and event.rank == 0:
        with open(os.environ["P4_FIRST_STEP"], "w") as out:
            out.write(f"{time.time():.6f}\\n")
"""


def run(settings: Settings) -> list[Row]:
    work = settings.work_dir
    work.mkdir(parents=True)
    check_cluster()
    (work / "train.py").write_text(HAND_TRAIN)
    (work / "p4hook.py").write_text(HOOK)
    counter = iter(range(10**6))
    rounds = interleaved(
        {
            "hpcdl": lambda: hpcdl_job(work, next(counter), settings),
            "hand": lambda: hand_job(work, next(counter)),
        },
        settings.repeats,
        settings.warmup_rounds,
    )
    figures = compared(rounds["hpcdl"], rounds["hand"])
    extra = [h - b for h, b in zip(rounds["hpcdl"], rounds["hand"], strict=True)]
    extra_s = sorted(extra)[len(extra) // 2]
    return [
        Row(
            id="job_start.first_step",
            what="an hpcdl job (cluster=devcluster, the MLP on breast cancer): its batch "
            "script's first command to the end of its first optimizer step",
            baseline="a hand-written sbatch + srun script running the same work plainly "
            "(torch, scikit-learn's data standardized, the same MLP and SGD, one step), "
            "timed the same way",
            ratio=figures.pop("ratio"),
            goal=1.2,
            details={
                **figures,
                "extra_s_median": round(extra_s, 3),
                "extra_s_goal": 1.0,
                "extra_s_met": extra_s <= 1.0,
            },
        )
    ]


def check_cluster() -> None:
    out = subprocess.run(["sinfo", "-h"], capture_output=True, text=True)
    if out.returncode != 0 or not os.environ.get("SLURM_CONF"):
        raise RuntimeError(
            "job_start needs the dev cluster: slurm/devcluster up, then "
            'eval "$(slurm/devcluster env)"'
        )


def hpcdl_job(work: Path, index: int, settings: Settings) -> float:
    start, first = work / f"hpcdl-{index}.start", work / f"hpcdl-{index}.first"
    run_dir = work / f"hpcdl-{index}"
    env = {**os.environ, "P4_FIRST_STEP": str(first), "PYTHONPATH": str(work)}
    out = subprocess.run(
        [
            *HPCDL_TRAIN,
            f"run_dir={run_dir}",
            f"cluster.setup=['date +%s.%N > {start}']",
            "--no-preflight",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"hpcdl train failed: {out.stderr.strip()[-400:]}")
    job_id = json.loads((run_dir / "slurm.json").read_text())["job_id"]
    return span(start, first, job_id)


def hand_job(work: Path, index: int) -> float:
    start, first = work / f"hand-{index}.start", work / f"hand-{index}.first"
    script = work / f"hand-{index}.sbatch"
    script.write_text(
        HAND_SBATCH.format(
            log=work / f"hand-{index}.log",
            start=start,
            python=sys.executable,
            train=work / "train.py",
            first_step=first,
        )
    )
    out = subprocess.run(
        ["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True
    )
    return span(start, first, out.stdout.strip())


def span(start: Path, first: Path, job_id: str, timeout_s: float = 300) -> float:
    """Seconds from the batch script's start to the first step's end, once the job wrote
    both and has left the queue (the next job then starts on a quiet node); the job is
    cancelled if it does not within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not (start.exists() and first.exists() and first.read_text().strip()) or queued(job_id):
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], capture_output=True)
            raise RuntimeError(f"job {job_id} did not finish its first step in {timeout_s:.0f}s")
        time.sleep(0.2)
    return float(first.read_text()) - float(start.read_text())


def queued(job_id: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i"], capture_output=True, text=True)
    return out.returncode == 0 and bool(out.stdout.strip())
