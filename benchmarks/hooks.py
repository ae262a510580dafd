"""Step hooks that time hpcdl's loop from the inside, and the same records for a plain loop.

    trainer.step_hooks=[benchmarks.hooks:record_time]             # one record per step
    trainer.step_hooks=[benchmarks.hooks:record_time,benchmarks.hooks:stop_after_step]

record_time appends `step GLOBAL_STEP EPOCH STEP_IN_EPOCH RANK PERF_COUNTER` to the file
named by $HPCDL_BENCH_TIMES (nothing when unset). Where $HPCDL_BENCH_STEPS gives the steps
of an epoch, the record of an epoch's last step waits for the GPU first (on CUDA): a loop
that never reads the GPU inside an epoch has only queued its last steps when it stamps
them, so its first-to-last-step time would leave out work a loop that reads as it goes
(hpcdl, one step behind with lagged sync) has waited for. Every loop compared in a
benchmark writes its records here, and so waits alike. time.perf_counter() is CLOCK_MONOTONIC on
Linux, so records from several processes of one machine share a clock. stop_after_step
sends this process SIGTERM after global step $HPCDL_BENCH_STOP_AT: an interruption mid-epoch
that takes the same path as scancel or Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

TIMES_VAR = "HPCDL_BENCH_TIMES"
STEPS_VAR = "HPCDL_BENCH_STEPS"  # steps per epoch: the last step's record waits for the GPU
STOP_VAR = "HPCDL_BENCH_STOP_AT"

_open_files: dict[str, TextIO] = {}


def write_record(kind: str, global_step: int, epoch: int, step_in_epoch: int, rank: int) -> None:
    path = os.environ.get(TIMES_VAR)
    if not path:
        return
    if kind == "step" and str(step_in_epoch) == os.environ.get(STEPS_VAR):
        _wait_for_the_gpu()
    now = time.perf_counter()
    out = _open_files.get(path)
    if out is None:
        out = _open_files[path] = open(path, "a")  # noqa: SIM115 (closed by read_records)
    out.write(f"{kind} {global_step} {epoch} {step_in_epoch} {rank} {now:.9f}\n")
    out.flush()


def _wait_for_the_gpu() -> None:
    torch = sys.modules.get("torch")  # the loops have imported it; nothing to wait for if not
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def record_time(event: Any) -> None:  # event: hpcdl.hooks.StepEvent
    write_record("step", event.global_step, event.epoch, event.step_in_epoch, event.rank)


def stop_after_step(event: Any) -> None:  # event: hpcdl.hooks.StepEvent
    stop_at = os.environ.get(STOP_VAR)
    if stop_at and event.global_step == int(stop_at):
        os.kill(os.getpid(), signal.SIGTERM)


@contextmanager
def loop_starts() -> Iterator[None]:
    """Also record `start` when hpcdl's trainer takes an epoch's batches: after the restore
    of a resumed run, and after the previous epoch's evaluation and checkpoint. A step's
    time is measured from there. (The loader behind them may have started earlier: before
    the model was built, or before the previous epoch's validation; that is the point of
    starting it early.) hpcdl has no hook at that point, so this wraps
    Trainer._take_batches while the context lasts (in-process runs only)."""
    from hpcdl.trainer import Trainer

    original = Trainer._take_batches

    def take(self: Trainer) -> Any:
        pr = self.progress
        write_record("start", pr.global_step, pr.epoch, pr.step_in_epoch, self.env.rank)
        return original(self)

    Trainer._take_batches = take  # type: ignore[method-assign]
    try:
        yield
    finally:
        Trainer._take_batches = original  # type: ignore[method-assign]


@dataclass(frozen=True)
class Record:
    kind: str  # "step": after an optimizer step; "start": the loop asks for an epoch's batches
    global_step: int  # steps taken so far (a step record counts its own step)
    epoch: int
    step_in_epoch: int
    rank: int
    t: float  # time.perf_counter()


def read_records(path: Path) -> list[Record]:
    """The records in `path`, in the order they were written (its writer is closed first)."""
    out = _open_files.pop(str(path), None)
    if out is not None:
        out.close()
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        kind, global_step, epoch, step_in_epoch, rank, t = line.split()
        records.append(
            Record(kind, int(global_step), int(epoch), int(step_in_epoch), int(rank), float(t))
        )
    return records
