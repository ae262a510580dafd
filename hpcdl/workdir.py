"""The working directory a run was created from (Config.workdir): where every attempt of
its job runs, and where resume, evaluate and predict read its relative paths (a script's
path, data.kwargs), so that they resolve as they did at the start, whichever folder a
later command, or a Slurm job submitted from it, starts in.

Stdlib only: used on the login node and in the job.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

from hpcdl.errors import ConfigError


def missing_workdir(workdir: Optional[str]) -> Optional[str]:
    """Why the run cannot be started in its workdir (one line, with the fix); None when it
    can, or when the run has none recorded (created before hpcdl recorded it)."""
    if workdir is None or Path(workdir).is_dir():
        return None
    return (
        f"workdir={workdir}: no such folder here; it is the folder the run was created "
        "from, where its script and relative paths are found. If they moved, resume with "
        "workdir=NEW_FOLDER (e.g. cd there and add workdir=$PWD)"
    )


@contextmanager
def in_workdir(workdir: Optional[str]) -> Iterator[None]:
    """This process in the run's workdir (child processes start there too), then back; as
    it is without a recorded one."""
    why = missing_workdir(workdir)
    if why is not None:
        raise ConfigError(why)
    if workdir is None:
        yield
        return
    before = os.getcwd()
    os.chdir(workdir)
    try:
        yield
    finally:
        os.chdir(before)


def from_here(path: str) -> str:
    """A path the user gave on this command line, absolute, before the command moves into
    the run's workdir: relative ones are the user's own folder's."""
    expanded = Path(path).expanduser()
    return path if expanded.is_absolute() else os.path.abspath(expanded)
