"""hpcdl driven in this process, as `hpcdl train cluster=debug` does: compose the typed
config, create the run dir, call the job payload (one rank, no process group)."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from hpcdl.job import JobOutcome
    from hpcdl.rundir import RunDir

# Variables from which hpcdl.env would take this process for a launched rank (a benchmark
# started inside a Slurm allocation or torchrun); the benchmark runs one rank in-process.
RANK_VARIABLES = ("SLURM_PROCID", "SUBMITIT_LOCAL_JOB_ID", "RANK", "WORLD_SIZE")


def create_run(overrides: list[str], run_dir: Path) -> RunDir:
    from hpcdl.cli.compose import compose_config
    from hpcdl.rundir import create_run_dir

    cfg = compose_config(["cluster=debug", *overrides])
    _, created = create_run_dir(replace(cfg, run_dir=str(run_dir)))
    return created


def run_in_process(run_dir: RunDir, log: TextIO, env: Mapping[str, str]) -> JobOutcome:
    """Train (or resume) the run as one in-process rank, its console output into `log`."""
    from hpcdl.job import run_job

    with environ(env), redirect_stdout(log), redirect_stderr(log):
        outcome = run_job(str(run_dir.path))
    # The run's persistent DataLoader workers go with its trainer: make sure they are gone
    # before the next measurement starts.
    gc.collect()
    return outcome


@contextmanager
def environ(values: Mapping[str, str]) -> Iterator[None]:
    """os.environ with `values` set and the rank variables removed, restored on exit."""
    from hpcdl.launch.local import exported

    removed = {key: os.environ.pop(key) for key in RANK_VARIABLES if key in os.environ}
    try:
        with exported(values):
            yield
    finally:
        os.environ.update(removed)
