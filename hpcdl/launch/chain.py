"""`cluster.requeue=chain`: a stopped job comes back as a new job, for sites where
`scontrol requeue` is unavailable (inside containers, or `JobRequeue=0`).

The job that got the warning signal submits its continuation with
`--dependency=afterany:<its own id>`, so the next link waits until this one has ended and
its last checkpoint is on disk. The continuation runs the same payload on the same run dir,
with the same frozen code, and learns its place in the chain from HPCDL_CHAIN_LINK (counted
in the rank environment's restart_count, as Slurm's own restarts are). slurm.json then
names the new job, so `hpcdl status|logs|cancel` and `sweep status` follow the chain.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from hpcdl.config.schema import Config
from hpcdl.env import CHAIN_LINK, RankEnv
from hpcdl.rundir import RunDir


def submit_continuation(cfg: Config, run_dir: RunDir, env: RankEnv, this_job: str) -> str:
    """Submit the next link of the chain; the action text for the attempt record."""
    from submitit.core.utils import FailedJobError

    from hpcdl.launch.slurm import last_line, make_executor, outside_job_env
    from hpcdl.launch.slurm_job import main as job_main

    base = run_dir.job_base()
    executor = make_executor(cfg, base, job_name=f"hpcdl-{_run_name(run_dir)}")
    link = env.restart_count + 1
    params = executor.parameters
    executor.update_parameters(
        setup=[*params.get("setup", []), f"export {CHAIN_LINK}={link}"],
        additional_parameters={
            **params.get("additional_parameters", {}),
            "dependency": f"afterany:{this_job}",
        },
    )
    try:
        with outside_job_env():
            job = executor.submit(job_main, str(run_dir.path))
    except (FailedJobError, OSError) as err:
        return (
            f"chain failed: {last_line(str(err))}; continue it with "
            f"`hpcdl resume {shlex.quote(str(run_dir.path))}`"
        )
    record = run_dir.read_submission() or {}
    run_dir.record_submission(job.job_id, cfg.cluster.name, Path(record.get("log_dir", base.log_dir)))
    return f"chained: job {job.job_id} (afterany:{this_job})"


def _run_name(run_dir: RunDir) -> str:
    """The job name the first link had: the run dir's name, or sweep/trial for a trial."""
    base = run_dir.job_base()
    return base.path.name if base.path == run_dir.path else f"{base.path.name}-{run_dir.path.name}"
