"""cluster=debug: one rank, in this process, in the foreground."""

from __future__ import annotations

from hpcdl.rundir import RunDir


def run_in_process(run_dir: RunDir) -> int:
    from hpcdl.job import run_job

    outcome = run_job(str(run_dir.path))
    return outcome.exit_code
