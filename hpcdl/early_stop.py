"""Early stopping across a resume. A run that stopped early trains on when the resume
changes trainer.early_stopping (patience=0 turns it off; a larger patience, another target
or monitor); with the settings it stopped under there is nothing to train, and the run
says why and which override would train on. Runs that did not stop early are untouched."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from hpcdl.config.metrics import monitor_mode
from hpcdl.config.schema import EarlyStoppingConfig
from hpcdl.errors import plural
from hpcdl.state import Progress

KEY = "trainer.early_stopping"


def settings(es: EarlyStoppingConfig) -> dict[str, Any]:
    """What a checkpoint records of the settings its run stops under. The mode is the one
    that applies (auto resolved), as checkpoints saved before auto recorded it: a resume
    sees no change between a saved "min" and auto for a lower-is-better monitor."""
    return {
        "monitor": es.monitor,
        "mode": monitor_mode(es.monitor, es.mode).value,
        "patience": es.patience,
        "min_delta": es.min_delta,
        "target": es.target,
    }


def stopped_by_patience(progress: Progress, patience: int) -> bool:
    return patience > 0 and progress.num_evals_without_improvement >= patience


def goes_on(progress: Progress, saved: Optional[dict[str, Any]], es: EarlyStoppingConfig) -> bool:
    """Whether a run that stopped early trains on under `es`. saved: the settings its
    checkpoint was saved under; None (saved before checkpoints held them): on only where
    `es` would not have stopped it (its target cannot be checked: a target stops it)."""
    if saved is not None:
        return saved != settings(es)
    return es.target is None and not stopped_by_patience(progress, es.patience)


def resumed(
    progress: Progress, saved: Optional[dict[str, Any]], es: EarlyStoppingConfig
) -> Progress:
    """The progress a resume continues from: a stopped run's flag lifted when it goes on,
    and its best metric forgotten when it is another metric or direction now."""
    if not progress.early_stopped or not goes_on(progress, saved, es):
        return progress
    progress = replace(progress, early_stopped=False)
    now = settings(es)
    if saved is not None and (saved["monitor"], saved["mode"]) != (now["monitor"], now["mode"]):
        progress = replace(progress, best_metric=None, best_epoch=None)
        progress.num_evals_without_improvement = 0
    return progress


def going_on_line(
    progress: Progress, saved: Optional[dict[str, Any]], es: EarlyStoppingConfig
) -> str:
    """For a run that stopped early and trains on."""
    now = settings(es)
    if saved is None:
        changed = f"{KEY} as it is now would not have stopped it"
    else:
        diffs = [f"{k} {saved.get(k)} -> {v}" for k, v in now.items() if saved.get(k) != v]
        changed = f"{KEY} changed ({', '.join(diffs)})"
    return f"stopped early after epoch {progress.epoch}; {changed}: training goes on"


def nothing_to_train_line(
    progress: Progress, saved: Optional[dict[str, Any]], es: EarlyStoppingConfig
) -> str:
    """For a run that stopped early and stays stopped: why, and the override that trains on."""
    why, how = _why_stopped(progress, saved or settings(es))
    return (
        f"the run stopped early after epoch {progress.epoch} ({why}): nothing to train; "
        f"to train on, resume with {how}"
    )


def stopped_line(progress: Progress, es: EarlyStoppingConfig) -> str:
    """The line the trainer prints as early stopping ends the run (progress.epoch: the
    epochs trained)."""
    why, _ = _why_stopped(progress, settings(es))
    return (
        f"stopping early after epoch {progress.epoch}: {why}; best.pt holds epoch "
        f"{progress.best_epoch} (resume with other {KEY} settings to train on)"
    )


def _why_stopped(progress: Progress, stopped: dict[str, Any]) -> tuple[str, str]:
    """(why the run stopped, the override that trains on) under the settings `stopped`."""
    monitor, patience, target = stopped["monitor"], stopped["patience"], stopped["target"]
    if stopped_by_patience(progress, patience):
        best = f"epoch {progress.best_epoch}'s {progress.best_metric:.4g}"
        why = (
            f"{monitor} did not improve on {best} in "
            f"{plural(progress.num_evals_without_improvement, 'evaluation')}, "
            f"{KEY}.patience={patience}"
        )
        return why, f"{KEY}.patience=0 (off) or a larger patience"
    if target is not None:
        return f"{monitor} reached {KEY}.target={target}", f"{KEY}.target=null or another target"
    return KEY, f"other {KEY} settings"
