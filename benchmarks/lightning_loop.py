"""P1's second baseline: the overhead benchmark's work done by a Lightning Trainer.

The same Work as the hand-written loops (benchmarks.loops: hpcdl's model, optimizer,
resident training rows, batch size, precision), trained by

    Trainer(barebones=True, accelerator=cpu|cuda, devices=1, max_epochs=E,
            precision=32-true|bf16-mixed|16-mixed, callbacks=[a step timer])

barebones=True is Lightning's own mode for measuring its overhead: no checkpointing,
logger, progress bar, model summary or sanity check (its defaults would add all of
these, and a step time that includes writing TensorBoard logs). The LightningModule's
training_step is the hand loop's: cross-entropy of the model's output, returned for
Lightning's automatic optimization (zero_grad, backward, step). Its batches are the raw
slicing loop's, each epoch's order of the resident rows (loops.epoch_order), handed over
as a plain iterable (not a DataLoader), so that only the loop around the step differs. A callback's
on_train_batch_end, which Lightning calls after the optimizer step, writes the step record.

Lightning is optional (pyproject's `bench` extra pins the release measured): version()
says whether it is installed.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Optional

from benchmarks import hooks

if TYPE_CHECKING:
    import torch

    from benchmarks.loops import Work

# The release in pyproject's bench extra: it accepts torch>=2.1,<4 (so torch 2.13 stays).
PINNED = "lightning==2.6.6"
NOT_INSTALLED = (
    f"Lightning is not installed, so it has no row (`pip install -e '.[bench]'` in hpcdl's "
    f"source tree, or `pip install {PINNED}`)"
)
LIGHTNING_LOGGERS = ("lightning.pytorch", "lightning.fabric")
IGNORED_WARNINGS = (
    # A Slurm node (or the dev cluster's login node) has srun: one process is meant here.
    "The `srun` command is available on your system but is not used",
    # Lightning 2.6's own use of torch's pytree API, deprecated in recent torch.
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
)


def version() -> Optional[str]:
    """Lightning's version, None when it is not installed."""
    if importlib.util.find_spec("lightning") is None:
        return None
    return importlib.metadata.version("lightning")


class ResidentBatches:
    """(x[idx], y[idx]) for each batch of the epoch's order: the raw slicing loop's batches.
    Each iteration is the next epoch (Lightning iterates it once per training epoch)."""

    def __init__(self, work: Work) -> None:
        self.work = work
        self.x, self.y, self.batch_size = work.x, work.y, work.batch_size
        self.epoch = 0

    def __len__(self) -> int:
        return -(-self.x.shape[0] // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        from benchmarks.loops import epoch_order

        perm = epoch_order(self.work, self.epoch)
        self.epoch += 1
        for step in range(len(self)):
            idx = perm[step * self.batch_size : (step + 1) * self.batch_size]
            yield self.x[idx], self.y[idx]


def lightning_loop(work: Work, num_epochs: int) -> None:
    """Train `work` for `num_epochs` with a Lightning Trainer, a step record after each step."""
    import lightning.pytorch as pl
    from lightning.fabric.plugins.environments import LightningEnvironment

    module_class, timer_class = _lightning_classes()
    precision = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}[work.precision.value]
    cuda = work.device.type == "cuda"
    with quiet_lightning():
        trainer = pl.Trainer(
            accelerator="cuda" if cuda else "cpu",
            devices=[work.device.index or 0] if cuda else 1,
            max_epochs=num_epochs,
            precision=precision,  # type: ignore[arg-type]
            barebones=True,
            callbacks=[timer_class()],
            # One process, whatever the environment says: inside a Slurm allocation
            # Lightning would otherwise take its ranks from the SLURM_* variables.
            plugins=[LightningEnvironment()],
        )
        batches = ResidentBatches(work)
        trainer.fit(module_class(work), train_dataloaders=batches)


@functools.cache
def _lightning_classes() -> tuple[Any, Any]:
    """The LightningModule and the step-timer callback (defined once Lightning is imported)."""
    import lightning.pytorch as pl
    import torch.nn.functional as F

    class SameWork(pl.LightningModule):
        def __init__(self, work: Work) -> None:
            super().__init__()
            self.model = work.model
            self.work_optimizer = work.optimizer

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return F.cross_entropy(self.model(x), y)

        def configure_optimizers(self) -> Any:
            return self.work_optimizer

    class StepTimer(pl.Callback):
        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            hooks.write_record("step", trainer.global_step, trainer.current_epoch, batch_idx + 1, 0)

    return SameWork, StepTimer


@contextmanager
def quiet_lightning() -> Iterator[None]:
    """Lightning's info lines (devices found, barebones mode) go to the stderr it saw at
    import, past any redirect: hold them back meanwhile, and two warnings that say nothing
    about this benchmark; other warnings still show."""
    loggers = [logging.getLogger(name) for name in LIGHTNING_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            for message in IGNORED_WARNINGS:
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
