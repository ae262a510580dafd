"""cluster.container on the dev cluster. Neither apptainer nor singularity installs from
this machine's package sources (Debian has no candidate for either), so the runtime is a
stand-in script named `apptainer`: it records its arguments, checks the image exists, and
runs the command as `apptainer exec` would inside an image without Slurm's commands (no
`scontrol` on its PATH, as in most images: pyxis#129). What is real: Slurm, the sbatch
script hpcdl writes around the runtime, the signal, the requeue from the batch script and
the exact resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import run_hpcdl
from tests.slurm.test_slurm import LONG, attempts, reference_sha, wait_done, wait_for_checkpoint

pytestmark = pytest.mark.slurm

FAKE_APPTAINER = """#!/usr/bin/env bash
# A stand-in for `apptainer exec [--nv] [--bind PATHS] IMAGE PYTHON ARGS...`.
echo "$*" >> "$FAKE_APPTAINER_LOG"
[ "$1" = exec ] || { echo "fake apptainer: only exec" >&2; exit 64; }
shift
while [[ "$1" == --* ]]; do
    case "$1" in --nv) shift ;; --bind|--env) shift 2 ;; *) echo "unknown $1" >&2; exit 64 ;; esac
done
[ -e "$1" ] || { echo "fake apptainer: no image $1" >&2; exit 65; }
shift 2  # the image, and the image's python3: the tests' interpreter stands in for it
export PATH="$(dirname "$REAL_PYTHON")"  # inside the "image": no scontrol, no sbatch
exec "$REAL_PYTHON" "$@"
"""


def test_a_containerized_job_is_requeued_by_its_batch_script_and_resumes_exactly(
    devcluster, tmp_path
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "apptainer"
    fake.write_text(FAKE_APPTAINER)
    fake.chmod(0o755)
    image = tmp_path / "pytorch.sif"
    image.write_bytes(b"not really an image")
    record = tmp_path / "apptainer.log"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_APPTAINER_LOG": str(record),
        "REAL_PYTHON": sys.executable,
    }
    run_dir = tmp_path / "run"
    out = run_hpcdl(
        "train",
        "cluster=devcluster",
        f"run_dir={run_dir}",
        "cluster.container.image=pytorch.sif",
        "cluster.container.binds=[/tmp]",
        *LONG,
        cwd=tmp_path,
        env=env,
    )
    assert out.returncode == 0, out.stderr + out.stdout
    job_id = json.loads((run_dir / "slurm.json").read_text())["job_id"]
    wait_for_checkpoint(run_dir)
    # The warning signal, as on preemption: the job saves and, with no scontrol in the
    # "image", asks its batch script to requeue it.
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
    s = wait_done(run_dir, timeout_s=420)
    ends = [a for a in attempts(run_dir) if a["event"] == "end"]
    assert ends[0]["action"] == "requeue requested from the batch script (no scontrol here)"
    starts = [a for a in attempts(run_dir) if a["event"] == "start"]
    assert len(starts) >= 2 and starts[-1]["restart_count"] >= 1 and starts[-1]["job_id"] == job_id
    calls = record.read_text().splitlines()
    assert calls and all(
        c.startswith(
            f"exec --nv --bind {run_dir},{tmp_path},/tmp {image} python3 -u -m hpcdl.launch.rank_main"
        )
        for c in calls
    ), calls
    assert not (run_dir / "logs" / f"{job_id}.requeue").exists()  # used up by the requeue
    assert s["weights_sha256"] == reference_sha(tmp_path, *LONG)
