"""A step hook that records which checkpoint files this process still has mapped.

    trainer.step_hooks=[tests.mapped_files:record]

Appends, after every step, the step and the .pt files in /proc/self/maps to the file named by
$HPCDL_TEST_MAPPED (one JSON line per step). A resumed run maps its checkpoint to restore
it; once restored, nothing may keep it mapped (a purged file's space would stay taken).
"""

from __future__ import annotations

import json
import os
from typing import Any


def record(event: Any) -> None:  # event: hpcdl.hooks.StepEvent
    with open("/proc/self/maps") as maps:
        mapped = sorted({line.split()[-1] for line in maps if line.rstrip().endswith(".pt")})
    with open(os.environ["HPCDL_TEST_MAPPED"], "a") as out:
        out.write(json.dumps({"step": event.global_step, "mapped": mapped}) + "\n")
