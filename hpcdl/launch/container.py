"""cluster.container: each rank runs inside a container image. Login node only: the sbatch
script's interpreter and srun options, and the preflight of the runtime and the image.

    apptainer | singularity:  srun ... apptainer exec [--nv] --bind JOB_DIR[,WORKDIR][,binds] IMAGE python3 -u -m ...
    pyxis:                    srun --container-image=IMAGE --container-mounts=JOB_DIR[,WORKDIR][,binds] ... python3 -u -m ...

The job dir (run dir, or sweep dir) is mounted at the same path, so the frozen code on
PYTHONPATH, the checkpoints and the logs are where the job expects them, and so is the
run's workdir (the folder it was created from), which the job enters; the rank
environment (PYTHONPATH, SLURM_*, MASTER_*) passes in, as both runtimes pass the host's
environment by default. `scontrol` is often missing inside an image (pyxis#129): a job
that cannot run it asks the batch script, which runs outside the container, to requeue it
(slurm_job.requeue, and the teardown lines below).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Optional

from hpcdl.config.schema import ClusterConfig, ContainerRuntime
from hpcdl.errors import ConfigError
from hpcdl.rundir import JobDir, requeue_request_name


def active(cluster: ClusterConfig) -> bool:
    return cluster.container.image is not None


def image(cluster: ClusterConfig) -> str:
    """The image as the job names it: a local file or folder by its absolute path (the batch
    script need not start where hpcdl ran); a URI or registry reference as given."""
    name = cluster.container.image or ""
    path = Path(name).expanduser()
    return str(path.resolve()) if "://" not in name and path.exists() else name


def mounts(cluster: ClusterConfig, job_dir: JobDir, workdir: Optional[str]) -> list[str]:
    """The job dir, the run's workdir (the job enters it, hpcdl.workdir: the folder hpcdl
    ran in, whose relative paths and scripts the run uses) unless the job dir holds it,
    and cluster.container.binds."""
    paths = [str(job_dir.path)]
    if workdir is not None and not Path(workdir).is_relative_to(job_dir.path):
        paths.append(workdir)
    return [*paths, *cluster.container.binds]


def interpreter(
    cluster: ClusterConfig, job_dir: JobDir, host_python: str, workdir: Optional[str]
) -> str:
    """The command that starts Python for each rank: the host's interpreter, or the
    image's through the runtime."""
    c = cluster.container
    if c.image is None:
        return shlex.quote(host_python)
    if c.runtime == ContainerRuntime.pyxis:  # srun itself enters the image (srun_args)
        return shlex.quote(c.python)
    words = [c.runtime.value, "exec"]
    if cluster.gpus_per_node:
        words.append("--nv")
    words += ["--bind", ",".join(mounts(cluster, job_dir, workdir)), image(cluster), c.python]
    return shlex.join(words)


def srun_args(cluster: ClusterConfig, job_dir: JobDir, workdir: Optional[str]) -> list[str]:
    c = cluster.container
    if c.image is None or c.runtime != ContainerRuntime.pyxis:
        return []
    paths = mounts(cluster, job_dir, workdir)
    mounted = ",".join(m if ":" in m else f"{m}:{m}" for m in paths)
    return [f"--container-image={image(cluster)}", f"--container-mounts={mounted}"]


def teardown_lines(cluster: ClusterConfig, job_dir: JobDir) -> list[str]:
    """After srun, outside the container: a requeue the job asked for but could not run."""
    if not active(cluster):
        return []
    request = f"{shlex.quote(str(job_dir.log_dir))}/{requeue_request_name('$SLURM_JOB_ID')}"
    # An array task by <array>_<task>: the array's own id would requeue every task.
    this_job = "${SLURM_ARRAY_TASK_ID:+${SLURM_ARRAY_JOB_ID}_$SLURM_ARRAY_TASK_ID}"
    return [
        f'if [ -e {request} ]; then rm -f {request}; job={this_job}; '
        'scontrol requeue "${job:-$SLURM_JOB_ID}"; fi',
    ]


def check(cluster: ClusterConfig) -> None:
    """Preflight: the runtime is there, and a local image exists."""
    c = cluster.container
    if c.image is None:
        return
    if c.runtime == ContainerRuntime.pyxis:
        if "--container-image" not in _srun_help():
            raise ConfigError(
                "cluster.container.runtime=pyxis: this cluster's srun has no --container-image "
                "(the pyxis plugin is not installed); use runtime=apptainer, or ask your site"
            )
        return
    if shutil.which(c.runtime.value) is None:
        raise ConfigError(
            f"cluster.container.runtime={c.runtime.value}: {c.runtime.value!r} is not on PATH "
            f"here; load it first (e.g. `module load {c.runtime.value}`), or pick the runtime "
            "your site has"
        )
    if "://" not in c.image and not Path(c.image).expanduser().exists():
        raise ConfigError(
            f"cluster.container.image={c.image!r}: no such file or folder; give the path of "
            "a .sif image (or a sandbox folder), or a docker:// or library:// URI"
        )


def _srun_help() -> str:
    try:
        return subprocess.run(
            ["srun", "--help"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def describe(cluster: ClusterConfig) -> Optional[str]:
    c = cluster.container
    return None if c.image is None else f"{c.runtime.value} {c.image}"
