"""The working directory a run was created from (Config.workdir): where every attempt of
its job runs, and where resume, evaluate and predict read its relative paths (a script's
path, data.kwargs), so that they resolve as they did at the start, whichever folder a
later command, or a Slurm job submitted from it, starts in.

Stdlib only: used on the login node and in the job.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

from hpcdl.errors import ConfigError, HpcdlWarning


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


def moves_away(workdir: Optional[str]) -> bool:
    """Whether entering the run's workdir leaves the folder this command runs in."""
    return (
        workdir is not None
        and Path(workdir).is_dir()
        and not os.path.samefile(workdir, os.getcwd())
    )


def from_here(path: str, workdir: Optional[str]) -> str:
    """A path given on this command line (--input, --output, --checkpoint), absolute where
    the command is about to enter the run's workdir: relative ones name the user's own
    folder's files. As given otherwise, so messages name it as typed."""
    expanded = Path(path).expanduser()
    if expanded.is_absolute() or not moves_away(workdir):
        return path
    return os.path.abspath(expanded)


@contextmanager
def reading_from(workdir: Optional[str]) -> Iterator[None]:
    """`hpcdl evaluate` and `predict`: in the run's workdir while they rebuild its data
    (data.kwargs paths are the run's folder's); where that folder is gone, here, with a
    warning (data.path and the other known paths are absolute, and read from anywhere)."""
    if missing_workdir(workdir) is not None:
        warnings.warn(
            f"workdir={workdir}: the folder the run was created from is gone; its relative "
            f"paths (data.kwargs) are read from here, {os.getcwd()}",
            HpcdlWarning,
            stacklevel=3,
        )
        workdir = None
    with in_workdir(workdir):
        yield
