"""One writer per run dir: the process that trains a run holds an exclusive lock on its
`.run.lock` for as long as it runs (the foreground `hpcdl train|resume` for in-process and
local runs, rank 0 of the Slurm job for submitted ones). A second writer is refused with
one line naming the holder.

An flock lock belongs to the open file: the kernel drops it when the holder exits, however
it exits (SIGKILL, a node gone for a local file system), so a lock is never stale; the
holder's description in the file is only read to say who holds it. Stdlib only.
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any, Optional

from hpcdl.errors import HpcdlError
from hpcdl.rundir import RunDir


class RunDirBusy(HpcdlError):
    """Another process is training this run dir."""


def _holder() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "since": dt.datetime.now().isoformat(timespec="seconds"),
    }


def describe(holder: Optional[dict[str, Any]]) -> str:
    if not holder:
        return "another process"
    who = f"pid {holder.get('pid')} on {holder.get('host')}"
    if holder.get("job_id"):
        who = f"Slurm job {holder['job_id']} ({who})"
    return f"{who} since {holder.get('since')}"


def _read_holder(handle: IO[str]) -> Optional[dict[str, Any]]:
    try:
        handle.seek(0)
        value = json.loads(handle.read() or "null")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def last_holder(run_dir: RunDir) -> Optional[dict[str, Any]]:
    """Who holds the lock now, or held it last (the description stays after the lock is
    released), from the file alone: nothing is locked."""
    try:
        with open(run_dir.lock_file) as handle:
            return _read_holder(handle)
    except OSError:
        return None


def is_held(run_dir: RunDir) -> bool:
    """Whether some process holds the run dir's lock now, as the kernel says: tried for an
    instant with a shared lock (a writer starting in that instant waits for it, see
    hold()). Unlike the holder's pid, this holds across hosts sharing the file system and
    is never fooled by a recycled pid or a holder that lives on after releasing it."""
    try:
        handle = open(run_dir.lock_file)  # noqa: SIM115 (closed by the with below)
    except OSError:  # never locked
        return False
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as err:  # no flock support here: nobody can be seen holding it
            return err.errno in (errno.EAGAIN, errno.EACCES)
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def _try_lock(handle: IO[str], run_dir: RunDir) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in (errno.EAGAIN, errno.EACCES):
            return False
        # A file system without flock support (some NFS/Lustre mounts): go on unguarded
        # rather than refuse every run there.
        print(
            f"hpcdl: warning: {run_dir.lock_file}: cannot lock ({err.strerror}); "
            "two runs of this run dir at once would not be stopped",
            file=sys.stderr,
        )
    return True


# is_held() holds a shared lock for an instant: a writer starting then retries this long.
LOCK_RETRY_S = 0.5


def _lock_soon(handle: IO[str], run_dir: RunDir) -> bool:
    deadline = time.monotonic() + LOCK_RETRY_S
    while not _try_lock(handle, run_dir):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def busy(run_dir: RunDir, holder: Optional[dict[str, Any]]) -> RunDirBusy:
    """What a second writer of a held run dir is told."""
    return RunDirBusy(
        f"{run_dir.path} is being trained by {describe(holder)}; wait for it to end, or "
        f"stop it first (Ctrl-C there, or `hpcdl cancel {run_dir.path}` for a Slurm job)"
    )


def refuse_if_held(run_dir: RunDir) -> None:
    """hold()'s refusal, without taking the lock or writing anything (a dry run)."""
    if is_held(run_dir):
        raise busy(run_dir, last_holder(run_dir))


@contextmanager
def hold(run_dir: RunDir) -> Iterator[None]:
    """Hold the run dir's lock, or raise RunDirBusy at once."""
    try:
        handle = open(run_dir.lock_file, "a+")  # noqa: SIM115 (closed by the with below)
    except OSError as err:
        raise HpcdlError(
            f"{run_dir.lock_file}: cannot open the run dir's lock: {err.strerror}"
        ) from None
    with handle:
        if not _lock_soon(handle, run_dir):
            raise busy(run_dir, _read_holder(handle))
        _name_holder(handle)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def take_over(run_dir: RunDir) -> Optional[IO[str]]:
    """The run dir's lock if it is free now, else None (no wait, no error): held until the
    returned file is closed or this process exits (hpcdl.launch.launcher_watch)."""
    try:
        handle = open(run_dir.lock_file, "a+")  # noqa: SIM115 (the caller keeps it open)
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return None
    _name_holder(handle)
    return handle


def _name_holder(handle: IO[str]) -> None:
    """Who holds the lock, for the message a second writer gets; the lock is what counts."""
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(_holder()))
        handle.flush()
    except OSError:  # a full disk: hold the lock without naming the holder
        pass
