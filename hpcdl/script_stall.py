"""`hpcdl run ... stall_timeout_s=N`: the watch of one rank's program by its wrapper
(hpcdl.script_job), for a program hpcdl cannot see the steps of.

A beat is any sign of life the wrapper can see from outside: the rank's log grew (the
program's stdout and stderr are the wrapper's own, the rank's log file), or the program
called hpcdl.api, which then touches the rank's beat file (HPCDL_BEAT_FILE; at most once
a BEAT_EVERY_S). Sizes and mtimes are compared with what the last look saw, never with this
machine's clock: a beat file on a shared file system carries the file server's time.

A Python program is started through BOOTSTRAP, which registers faulthandler on
STACK_SIGNAL before it runs the script (runpy, as `python` itself would), so that a stalled
one can print every thread's stack into the rank's log before it is ended.

Stdlib only, like hpcdl.script_job.
"""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path
from typing import Optional

# The signal that makes a bootstrapped program print its threads' stacks (faulthandler,
# into stderr, the rank's log). SIGURG: its default action is to ignore it, so a process
# without the handler (a child the program spawned, a program hpcdl could not bootstrap) is
# unharmed; torch, torchrun, NCCL, gloo, submitit and Slurm use TERM, INT, HUP, QUIT, USR1,
# USR2 and CONT, and faulthandler's own fatal handlers SEGV, FPE, ABRT, BUS and ILL. Only a
# socket with out-of-band data and an owner set by fcntl(F_SETOWN) sends it, which none of
# them does.
STACK_SIGNAL = signal.SIGURG
# `python [options] -c BOOTSTRAP SCRIPT ARGS...` or `... -c BOOTSTRAP -m MODULE ARGS...`:
# the program as `python SCRIPT ARGS` or `python -m MODULE ARGS` runs it (its sys.argv, its
# folder first on sys.path, __name__ == "__main__", __file__), with the stack dump
# registered first. A script runs in the real __main__ module, as python runs it (pickles
# and multiprocessing's spawn find its classes there), not in runpy's stand-in, which would
# also make sys.argv[0] absolute. Inline, not a module of hpcdl's: the program's
# interpreter may not have hpcdl installed.
BOOTSTRAP = f"""\
import faulthandler, os, runpy, signal, sys
faulthandler.register(signal.Signals({int(STACK_SIGNAL)}), all_threads=True)
del sys.argv[0]
if sys.argv[0] == "-m":
    del sys.argv[0]
    sys.path[0] = os.getcwd()
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
elif not os.path.isfile(sys.argv[0]):
    runpy.run_path(sys.argv[0], run_name="__main__")
else:
    __file__ = os.path.abspath(sys.argv[0])
    sys.path[0] = os.path.dirname(os.path.realpath(__file__))
    with open(__file__, "rb") as f:
        __code = compile(f.read(), __file__, "exec")
    del faulthandler, os, runpy, signal, sys, f
    exec(__code)
"""
# The interpreter's options before the script that take a value of their own.
OPTIONS_WITH_VALUE = ("-X", "-W", "--check-hash-based-pycs")
# Its options without one, each alone (`-u`, not `-uB`).
PLAIN_OPTIONS = (
    "-u",
    "-B",
    "-O",
    "-OO",
    "-E",
    "-s",
    "-S",
    "-I",
    "-P",
    "-b",
    "-bb",
    "-d",
    "-q",
    "-v",
)
# How long a program has to write its stacks after STACK_SIGNAL before it is ended.
DUMP_S = 0.5
# How often hpcdl.api touches the beat file at most: a stat and a utime on a shared file
# system per call would be too many for a loop that asks stop_requested() every step.
BEAT_EVERY_S = 1.0
# The wrapper looks this often at most (a tenth of the timeout, as hpcdl.watchdog does).
MAX_CHECK_S = 30.0


def with_stack_dump(command: list[str]) -> Optional[list[str]]:
    """A Python command (`python [options] SCRIPT ...`, `python [options] -m MODULE ...`)
    started through BOOTSTRAP; None for any other (a shell script, torchrun, `python -c`),
    which is watched and ended without its stacks."""
    if not command or not os.path.basename(command[0]).startswith("python"):
        return None
    position = 1
    while position < len(command) and command[position].startswith("-"):
        token = command[position]
        if token == "-m":
            break
        if token in OPTIONS_WITH_VALUE:
            position += 2
        elif token in PLAIN_OPTIONS or token.startswith(("-X", "-W")):
            position += 1
        else:  # -c, -, or options run together: not taken apart here
            return None
    if position >= len(command) or (command[position] == "-m" and position + 1 >= len(command)):
        return None
    return [*command[:position], "-c", BOOTSTRAP, *command[position:]]


def beat(path: Optional[str], last: list[float]) -> None:
    """hpcdl.api's beat: touch `path` (HPCDL_BEAT_FILE) unless it did less than BEAT_EVERY_S
    ago; `last` holds the time it last did (time.monotonic())."""
    now = time.monotonic()
    if not path or (last and now - last[0] < BEAT_EVERY_S):
        return
    last[:] = [now]
    try:
        os.utime(path)
    except FileNotFoundError:
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).touch()
        except OSError:
            pass
    except OSError:  # a beat that cannot be written is missed, never the program's error
        pass


class StallWatch:
    """The wrapper's watch of its program: `silent_s()` in its loop returns how long the
    program has given no beat once that is over the timeout, else None."""

    def __init__(self, timeout_s: float, beat_file: Path, fds: tuple[int, ...] = (1, 2)) -> None:
        self.timeout_s = timeout_s
        self.beat_file = beat_file
        # Only a log file can be watched: under cluster=debug the output is a terminal.
        self.fds = tuple(fd for fd in fds if _is_file(fd))
        self.check_every_s = min(timeout_s / 10, MAX_CHECK_S)
        self._last_beat = self._next_check = time.monotonic()
        self._seen = self._marks()

    @property
    def watches_output(self) -> bool:
        return bool(self.fds)

    def silent_s(self) -> Optional[float]:
        now = time.monotonic()
        if now < self._next_check:
            return None
        self._next_check = now + self.check_every_s
        marks = self._marks()
        if marks != self._seen:
            self._seen, self._last_beat = marks, now
            return None
        silent = now - self._last_beat
        return silent if silent > self.timeout_s else None

    def _marks(self) -> tuple[int, ...]:
        sizes = []
        for fd in self.fds:
            try:
                sizes.append(os.fstat(fd).st_size)
            except OSError:
                sizes.append(-1)
        try:
            beat = self.beat_file.stat().st_mtime_ns
        except OSError:
            beat = -1
        return (*sizes, beat)


def _is_file(fd: int) -> bool:
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        return False


def dump_stacks(pid: int) -> None:
    """Ask a bootstrapped program for its threads' stacks, and give it DUMP_S to write them."""
    try:
        os.kill(pid, STACK_SIGNAL)
    except (ProcessLookupError, PermissionError):
        return
    time.sleep(DUMP_S)
