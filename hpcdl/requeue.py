"""Requeue the Slurm job this process runs in: by `scontrol requeue`, or, where there is no
scontrol (inside a container), by asking the batch script to run it after srun
(hpcdl.launch.container). Used after a warning signal (hpcdl.launch.slurm_job) and after a
stall (hpcdl.job, cluster.requeue_on_stall). Stdlib only."""

from __future__ import annotations

import os
import shutil
import subprocess

from hpcdl.env import slurm_job_ref
from hpcdl.rundir import RunDir


def requeue(job_id: str, path: RunDir) -> str:
    """`scontrol requeue` this job; where there is no scontrol (inside a container), ask
    the batch script, which runs it after srun, outside the container."""
    if shutil.which("scontrol") is None:
        request = path.requeue_request(job_id)
        request.parent.mkdir(parents=True, exist_ok=True)
        request.touch()
        return "requeue requested from the batch script (no scontrol here)"
    out = subprocess.run(
        ["scontrol", "requeue", slurm_job_ref(os.environ, job_id)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    reason = "; ".join(line.strip() for line in out.stderr.splitlines() if line.strip())
    return "requeued" if out.returncode == 0 else f"requeue failed: {reason}"
