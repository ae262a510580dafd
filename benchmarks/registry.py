"""Every benchmark, by name: one function each, Settings -> rows.

To add one (step overhead vs a hand-written loop, sweep submission, checkpoint save/load,
GPU), write a module with a `run(settings) -> list[Row]` that times hpcdl and its baseline
with benchmarks.timing.interleaved, and add a line here.
"""

from __future__ import annotations

from benchmarks import lazy_epoch, overhead, resumed_step
from benchmarks.base import Benchmark

BENCHMARKS: dict[str, Benchmark] = {
    "lazy_epoch": lazy_epoch.run,  # L1: epoch on a lazily read dataset vs a plain loop
    "resumed_step": resumed_step.run,  # L2: first step after a mid-epoch resume
    "overhead": overhead.run,  # P1: hpcdl's loop vs a hand-written loop
}
