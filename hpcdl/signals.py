"""Stop requests: signal handlers that only set a flag, checked at step boundaries.

SIGTERM/SIGINT (Ctrl-C, scancel, an outside kill), SIGHUP (the terminal closed, the ssh
connection dropped) and the Slurm warning signal (USR2 by default; USR1 may be caught by
NCCL) all mean: finish the current step, save once, exit. A SIGHUP ignored when the process
started (`nohup hpcdl train ...`) stays ignored.

A rank's process records these signals from its first moment (record_early_stops, called
by hpcdl.launch.rank_main before it imports anything heavy), so that a stop that comes
while it starts (Ctrl-C as the ranks load torch, a requeue right after the job began) is
not lost, nor fatal: stop_on_signals takes over the ones its job listens to.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Optional


@dataclass
class StopFlag:
    signal_name: Optional[str] = None
    received: list[str] = field(default_factory=list)

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def _handle(self, signum: int, _frame: Optional[FrameType]) -> None:
        name = signal.Signals(signum).name
        self.received.append(name)
        if self.signal_name is None:
            self.signal_name = name


# Every signal a job may stop on (stop_signal_names: SIGTERM, SIGINT, SIGHUP, the warning).
EARLY_NAMES = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")
_early: Optional[StopFlag] = None


def record_early_stops() -> None:
    """Until stop_on_signals is in: record EARLY_NAMES instead of dying of them (SIGTERM's
    default) or losing them. Called again after another library put in its own handlers."""
    global _early
    if _early is None:
        _early = StopFlag()
    for name in EARLY_NAMES:
        signum = signal.Signals[name]
        if signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN:
            continue  # nohup's promise: the run outlives the terminal
        signal.signal(signum, _early._handle)


@contextmanager
def stop_on_signals(
    names: tuple[str, ...] = ("SIGTERM", "SIGINT", "SIGUSR2"),
) -> Iterator[StopFlag]:
    """Install flag-setting handlers for `names`; the previous handlers come back on exit."""
    flag = StopFlag()
    previous = {}
    for name in dict.fromkeys(names):
        signum = signal.Signals[name]
        if signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN:
            continue  # nohup's promise: the run outlives the terminal
        previous[signum] = signal.signal(signum, flag._handle)
    # Once ours are in, what came before them (record_early_stops): nothing falls between.
    early = [name for name in (_early.received if _early else []) if name in names]
    if early:
        flag.received[:0] = early
        flag.signal_name = early[0]
    if _early is not None:
        _early.received.clear()
        _early.signal_name = None
    try:
        yield flag
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
