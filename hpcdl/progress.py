"""What rank 0 shows while training: a progress bar on a terminal, plain lines otherwise.

Slurm log files are not terminals, so there a line every `log_every_steps` steps keeps the
log readable and greppable.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, Optional


class ProgressReporter:
    def __init__(self, *, enabled: bool, log_every_steps: int, max_epochs: int) -> None:
        self.enabled = enabled
        self.log_every_steps = log_every_steps
        self.max_epochs = max_epochs
        self.interactive = enabled and sys.stdout.isatty()
        self._bar: Any = None
        self._task: Any = None
        self._last_line = time.monotonic()
        # Called once stdout has no reader (see _print).
        self.on_closed: Optional[Callable[[], None]] = None

    def start_epoch(self, epoch: int, start_step: int, num_steps: int) -> None:
        if not self.interactive:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        if self._bar is None:
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
                transient=True,
            )
            self._bar.start()
        if self._task is not None:
            self._bar.remove_task(self._task)
        self._task = self._bar.add_task(
            f"epoch {epoch + 1}/{self.max_epochs}", total=num_steps, completed=start_step, info=""
        )

    def step(self, epoch: int, step_in_epoch: int, num_steps: int, loss: float, lr: float) -> None:
        if not self.enabled:
            return
        if self.interactive:
            self._bar.update(
                self._task, completed=step_in_epoch + 1, info=f"loss {loss:.4f} lr {lr:.3g}"
            )
        elif (step_in_epoch + 1) % self.log_every_steps == 0:
            self._print(
                f"epoch {epoch + 1}/{self.max_epochs} step {step_in_epoch + 1}/{num_steps} "
                f"loss {loss:.4f} lr {lr:.3g}"
            )

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False)
        else:
            self._print(text)

    def _print(self, text: str) -> None:
        """A line on stdout. Once nobody reads it (`hpcdl train | head`: a broken pipe), the
        lines go to /dev/null (later writes and the exit's flush too) and on_closed is
        called: the trainer stops as on a hangup, with a checkpoint (the broken pipe's
        error was failing the run, unsaved)."""
        try:
            print(text, flush=True)
        except BrokenPipeError:
            self.enabled = False
            silence_stdout()
            if self.on_closed is not None:
                self.on_closed()

    def epoch_row(self, row: dict[str, Any]) -> None:
        """One line per epoch: every train_*/val_* value of the metrics row, in its order."""
        values = " ".join(
            f"{key.replace('accuracy', 'acc')} {value:.4f}"
            for key, value in row.items()
            if key.startswith(("train_", "val_")) and value is not None
        )
        self.message(
            f"epoch {row['epoch']}/{self.max_epochs}: {values} lr {row['lr']:.3g} "
            f"({row['seconds']:.2f}s, {row['samples_per_s']:.0f} samples/s)"
        )

    def close(self, final: Optional[str] = None) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        if final:
            self.message(final)


def silence_stdout() -> None:
    """Point stdout at /dev/null once its reader has gone (a broken pipe): later prints, and
    the exit's flush, must not raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
