"""Every benchmark, by name: one function each, Settings -> rows.

To add one (step overhead vs a hand-written loop, sweep submission, checkpoint save/load,
GPU), write a module with a `run(settings) -> list[Row]` that times hpcdl and its baseline
with benchmarks.timing.interleaved, and add a line here.
"""

from __future__ import annotations

from benchmarks import (
    checkpoint,
    dry_run,
    job_start,
    lazy_epoch,
    mfu,
    options,
    overhead,
    resumed_step,
    sweep_submit,
    time_to_accuracy,
)
from benchmarks.base import Benchmark

BENCHMARKS: dict[str, Benchmark] = {
    "lazy_epoch": lazy_epoch.run,  # L1: epoch on a lazily read dataset vs a plain loop
    "resumed_step": resumed_step.run,  # L2: first step after a mid-epoch resume
    "overhead": overhead.run,  # P1, P2: hpcdl's loop vs hand-written, DataLoader, Lightning
    "dry_run": dry_run.run,  # P3: `train --dry-run` vs `import torch`, fresh interpreters
    "sweep_submit": sweep_submit.run,  # P6: `train -m`, 100 trials, and its planning
    "checkpoint": checkpoint.run,  # P5: save/load vs torch.save/load, stall per save
    "options": options.run,  # each speed option on / off (lagged sync, fused, bf16, ...)
    "mfu": mfu.run,  # P7: ResNet-18's model FLOP utilization against the measured matmul peak
    "time_to_accuracy": time_to_accuracy.run,  # P7: MNIST-shaped CNN to 99%, vs a hand loop
}
# On the dev cluster (slurm/devcluster up; SLURM_CONF set): by name, or with --cluster.
CLUSTER_BENCHMARKS: dict[str, Benchmark] = {
    "job_start": job_start.run,  # P4: batch script start -> first optimizer step vs sbatch+srun
}
ALL_BENCHMARKS = {**BENCHMARKS, **CLUSTER_BENCHMARKS}
