"""The tests' stop during a job's start-up: a real signal that a rank sends itself while
its trainer is being built (after hpcdl's stop handlers are in place, before the restore
and the first step), as a requeue or preemption right after a job starts does.

Named as a step hook, `trainer.step_hooks=[tests.startup_stop:hook]`: the trainer looks the
name up while it builds, and this module answers that lookup (its __getattr__) by sending
$HPCDL_TEST_STARTUP_SIGNAL (e.g. "SIGTERM:rank1") when it runs in that local rank, then
hands back a hook that does nothing. Outside a local rank (the login-node check) and
without the variable it only hands back the hook.
"""

from __future__ import annotations

import os
import signal
from typing import Any

ENV_VAR = "HPCDL_TEST_STARTUP_SIGNAL"
OVERRIDE = "trainer.step_hooks=[tests.startup_stop:hook]"


def _noop(event: Any) -> None:
    return None


def __getattr__(name: str) -> Any:
    if name != "hook":
        raise AttributeError(name)
    spec = os.environ.get(ENV_VAR, "")
    signal_name, _, rank = spec.partition(":rank")
    if signal_name and os.environ.get("SUBMITIT_LOCAL_GLOBALID") == rank:
        os.kill(os.getpid(), signal.Signals[signal_name])
    return _noop
