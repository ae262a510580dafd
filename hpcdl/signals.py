"""Stop requests: signal handlers that only set a flag, checked at step boundaries.

SIGTERM/SIGINT (Ctrl-C, scancel, an outside kill), SIGHUP (the terminal closed, the ssh
connection dropped) and the Slurm warning signal (USR2 by default; USR1 may be caught by
NCCL) all mean: finish the current step, save once, exit. A SIGHUP ignored when the process
started (`nohup hpcdl train ...`) stays ignored.
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
    try:
        yield flag
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
