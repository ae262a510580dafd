"""cluster=debug: one rank, in this process, in the foreground."""

from __future__ import annotations

from pathlib import Path


def run_in_process(run_dir: Path) -> int:
    from hpcdl.job import run_job

    outcome = run_job(str(run_dir))
    return outcome.exit_code
