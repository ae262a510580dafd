"""cluster=local: the ranks stop, and rank 0 takes over the run dir's lock, once the
foreground `hpcdl train|resume` that launched them is gone (killed, or hung up on while the
ranks were not). Until then that command holds the lock (hpcdl.runlock); without this, its
ranks trained on unseen, and with the lock released, a `hpcdl resume` trained the same run
dir a second time beside them.

The foreground names itself in HPCDL_FOREGROUND (its pid and start time, so a reused pid is
not mistaken for it, and the lock file); each rank looks once a second. Stdlib only.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO, Optional

from hpcdl.exit_codes import EXIT_INTERRUPTED

FOREGROUND_VAR = "HPCDL_FOREGROUND"
POLL_S = 1.0
# Then a second SIGTERM: an `hpcdl run` program that ignored the first is ended (SIGKILL,
# hpcdl.script_job), as a second Ctrl-C would; nobody is left at a terminal to give it.
FORCE_AFTER_S = 60.0


def describe_foreground(lock_file: Path) -> str:
    """The value of HPCDL_FOREGROUND for the ranks this process launches."""
    pid = os.getpid()
    return json.dumps({"pid": pid, "start": _start_time(pid), "lock": str(lock_file)})


def watch_foreground(value: str) -> None:
    """In a rank: a daemon thread that stops this rank (as a SIGTERM does: save at the next
    step, exit) once the foreground is gone, after taking the run dir's lock if it can."""
    foreground = json.loads(value)
    thread = threading.Thread(
        target=_watch, args=(foreground,), name="hpcdl-foreground", daemon=True
    )
    thread.start()


def _watch(foreground: dict) -> None:
    while _start_time(foreground["pid"]) == foreground["start"]:
        time.sleep(POLL_S)
    if os.environ.get("SUBMITIT_LOCAL_GLOBALID", "0") == "0":  # rank 0 saves, exits last
        _take_lock(Path(foreground["lock"]))
    print(
        f"hpcdl: the command that launched this run (pid {foreground['pid']}) is gone: "
        "stopping at the next step; continue with `hpcdl resume`",
        file=sys.stderr,
        flush=True,
    )
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(FORCE_AFTER_S)  # a trainer's rank has left by then (a daemon thread)
    os.kill(os.getpid(), signal.SIGTERM)


_held: list[IO[str]] = []  # the lock's file, open until this process exits


def record_orphaned_end(exit_code: int) -> None:
    """In rank 0 as it leaves, once it took over from a launcher that is gone: the
    attempt's end record, which that launcher could not write (hpcdl.launch.foreground)."""
    if not _held:
        return
    from hpcdl.launch.foreground import record_end
    from hpcdl.rundir import RunDir

    run_dir = RunDir(Path(_held[0].name).parent)
    # A rank hands its outcome to submitit's pickle and exits 0: here that is the stop this
    # watch asked for (the job's status would have been 3, EXIT_INTERRUPTED).
    code = EXIT_INTERRUPTED if exit_code == 0 else exit_code
    with contextlib.suppress(OSError):
        record_end(run_dir, "local", os.environ.get("SUBMITIT_LOCAL_JOB_ID"), code)


def _take_lock(lock_file: Path) -> None:
    """The run dir's lock, held by rank 0 until it exits (after its checkpoint), so a
    `hpcdl resume` started while the ranks save is refused."""
    from hpcdl.rundir import RunDir
    from hpcdl.runlock import take_over

    handle = take_over(RunDir(lock_file.parent))
    if handle is not None:
        _held.append(handle)


def _start_time(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or
    None when it has ended (a zombie has too). Without /proc: "alive" or None."""
    if not Path("/proc/self/stat").exists():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "alive"
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count after its last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else fields[19]
