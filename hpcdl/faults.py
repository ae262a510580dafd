"""Fault injection for tests: a real signal, sent by the rank to itself at a chosen step.

HPCDL_FAULT_INJECT="SIGTERM@37" sends SIGTERM after global step 37 on every rank;
"SIGKILL@37:rank1" kills rank 1 only. The signal takes the same path as one from scancel or
Ctrl-C; only its timing is made exact, so the tests can interrupt mid-epoch or on an epoch
boundary on purpose.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

ENV_VAR = "HPCDL_FAULT_INJECT"


@dataclass(frozen=True)
class Fault:
    signal_name: str
    step: int
    rank: Optional[int] = None

    def after_step(self, global_step: int, rank: int) -> None:
        if global_step == self.step and self.rank in (None, rank):
            os.kill(os.getpid(), signal.Signals[self.signal_name])


def fault_from(environ: Mapping[str, str]) -> Optional[Fault]:
    spec = environ.get(ENV_VAR)
    if not spec:
        return None
    match = re.fullmatch(r"(SIG[A-Z0-9]+)@(\d+)(?::rank(\d+))?", spec)
    if not match or match.group(1) not in signal.Signals.__members__:
        raise ValueError(f"{ENV_VAR}={spec!r}: expected SIGNAME@STEP[:rankN], e.g. SIGTERM@37")
    rank = match.group(3)
    return Fault(match.group(1), int(match.group(2)), int(rank) if rank is not None else None)
