"""The tests' fault injector: a real signal, sent by a rank to itself after a chosen step.

Registered through the trainer's general per-step hook (trainer.step_hooks), so nothing of
it is in hpcdl's production path. HPCDL_TEST_FAULT="SIGTERM@37" sends SIGTERM after global
step 37 on every rank; "SIGKILL@37:rank1" kills rank 1 only. The signal takes the same path
as one from scancel or Ctrl-C; only its timing is made exact, so the tests can interrupt
mid-epoch or on an epoch boundary on purpose. A run started with the hook and resumed
without the variable runs undisturbed.
"""

from __future__ import annotations

import functools
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ENV_VAR = "HPCDL_TEST_FAULT"
OVERRIDE = "trainer.step_hooks=[tests.fault_hook:after_step]"
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Fault:
    signal_name: str
    step: int
    rank: Optional[int] = None


def parse(spec: str) -> Fault:
    match = re.fullmatch(r"(SIG[A-Z0-9]+)@(\d+)(?::rank(\d+))?", spec)
    if not match or match.group(1) not in signal.Signals.__members__:
        raise ValueError(f"{ENV_VAR}={spec!r}: expected SIGNAME@STEP[:rankN], e.g. SIGTERM@37")
    rank = match.group(3)
    return Fault(match.group(1), int(match.group(2)), int(rank) if rank is not None else None)


def env(spec: Optional[str]) -> dict[str, str]:
    """The environment of an `hpcdl` command whose ranks inject `spec` (None: no fault)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, ENV_VAR: spec or ""}


@functools.cache
def _fault() -> Optional[Fault]:
    spec = os.environ.get(ENV_VAR)
    return parse(spec) if spec else None


def after_step(event) -> None:  # event: hpcdl.hooks.StepEvent
    fault = _fault()
    if fault and event.global_step == fault.step and fault.rank in (None, event.rank):
        os.kill(os.getpid(), signal.Signals[fault.signal_name])
