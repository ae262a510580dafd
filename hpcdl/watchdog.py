"""The stall watchdog: a rank that makes no progress for too long dumps every thread's
Python stack into its log, records the stall in the run dir and exits, so that Slurm frees
the GPUs instead of holding them until the time limit.

Progress is a beat from the trainer: after every optimizer step, and at the start of a
phase that has its own allowance (the first step: imports, compilation, the first
collective; an evaluation). A thread checks the deadline ten times per allowance; it never
waits on the training thread, so a rank stuck in C code that lets other threads run (a hung
collective, a dead file system read) is caught too.

C code that holds Python's interpreter lock (a C extension's long call) stops that thread as
well. For it, each check also arms faulthandler's own timer, a C thread that needs no lock,
for the deadline plus BACKSTOP_S: a check that never comes again lets it fire, dump every
thread's stack ("Timeout (0:02:15)!" in the log, hpcdl.launch.diagnose reads it) and end
the process with status 1. A rank that cannot run at all (stopped by SIGSTOP, stuck in the
kernel) is beyond both. Stdlib only.
"""

from __future__ import annotations

import contextlib
import faulthandler
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional

# How often the watchdog thread looks, as a fraction of the shortest allowance.
CHECKS_PER_ALLOWANCE = 10
# How long after its deadline a rank whose watchdog thread cannot run (the lock held in C
# code) is ended by faulthandler's timer.
BACKSTOP_S = 60.0
# The phase of a rank blocked until the other ranks arrive (a collective, the step sums'
# read): its stall is most likely another rank's doing (hpcdl.launch.diagnose).
WAITING = "waiting for the other ranks"


def first_step_allowance(timeout_s: float, first_step_s: Optional[float]) -> float:
    """The first step's allowance (trainer.stall_first_step_s; None: twice the timeout):
    imports, compilation and the first collective, on the slowest rank. The job's
    collectives get it too until the first step is done, so that a rank waiting for a slow
    peer is not ended by its collective's timeout first."""
    return first_step_s or 2 * timeout_s


@dataclass(frozen=True)
class Stall:
    phase: str  # what the rank was doing: "first step", "training", "evaluation", ...
    seconds: float  # since its last beat
    allowance_s: float


class Watchdog:
    def __init__(self, timeout_s: float, on_stall: Callable[[Stall], None]) -> None:
        self.timeout_s = timeout_s
        self._on_stall = on_stall
        self._lock = threading.Lock()
        self._phase = "start"
        self._since = time.monotonic()
        self._allowance = timeout_s
        self._stopped = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def beat(self, phase: str = "training", allowance_s: Optional[float] = None) -> None:
        """Progress: the next beat is due within allowance_s (default: the timeout)."""
        with self._lock:
            self._phase, self._since = phase, time.monotonic()
            self._allowance = allowance_s if allowance_s is not None else self.timeout_s

    @contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        """Mark a wait on the other ranks (``what``: for which) without a beat: the deadline
        stays, and a stall inside names the phase as a wait."""
        with self._lock:
            before, self._phase = self._phase, f"{WAITING} ({what})"
        try:
            yield
        finally:
            with self._lock:
                self._phase = before

    def __enter__(self) -> Watchdog:
        self.beat("start")
        self._thread = threading.Thread(target=self._watch, name="hpcdl-watchdog", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        _disarm()

    def _watch(self) -> None:
        poll = max(0.05, min(self.timeout_s / CHECKS_PER_ALLOWANCE, 30.0))
        while not self._stopped.wait(poll):
            with self._lock:
                waited = time.monotonic() - self._since
                stall = Stall(self._phase, waited, self._allowance)
            if waited > stall.allowance_s:
                _disarm()  # the report and exit are on_stall's (it bounds its own time)
                self._on_stall(stall)
                return
            _arm(stall.allowance_s - waited + poll + BACKSTOP_S)


def _arm(seconds: float) -> None:
    """faulthandler's timer (one per process), reset: fires unless armed again in time."""
    # A stderr without a file descriptor (captured by a test): no backstop.
    with contextlib.suppress(AttributeError, ValueError, OSError, RuntimeError):
        faulthandler.dump_traceback_later(seconds, exit=True, file=sys.stderr)


def _disarm() -> None:
    faulthandler.cancel_dump_traceback_later()


def dump_stacks(rank: int, stall: Stall) -> None:
    """Every thread's stack into this rank's log (stderr), then one line saying why."""
    print(
        f"hpcdl: rank {rank} made no progress for {stall.seconds:.0f}s in {stall.phase!r} "
        f"(allowance {stall.allowance_s:.0f}s, trainer.stall_timeout_s); stacks of every "
        "thread follow",
        file=sys.stderr,
        flush=True,
    )
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
