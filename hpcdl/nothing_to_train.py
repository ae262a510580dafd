"""Whether a resume has anything to train, and the line that says why not.

The trainer decides it from the checkpoint it loaded (the backstop); `hpcdl resume`
decides it before launching anything, from what the run dir records without torch:
checkpoint.json when it describes the newest checkpoint, else summary.json when the run
completed at the newest checkpoint without stopping early. When neither tells, the resume
launches and the job decides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from hpcdl import early_stop
from hpcdl.checkpoint_file import stored_checksum
from hpcdl.config.schema import Config
from hpcdl.errors import CheckpointError, plural
from hpcdl.rundir import RunDir
from hpcdl.state import Progress


def limit_reached_line(
    progress: Progress, max_epochs: int, max_steps: Optional[int]
) -> Optional[str]:
    """For a run that has reached trainer.max_epochs or trainer.max_steps; None if not."""
    if progress.epoch >= max_epochs:
        return (
            f"the run has trained {plural(progress.epoch, 'epoch')}, "
            f"trainer.max_epochs={max_epochs}: nothing to train; to train on, resume with a "
            "larger trainer.max_epochs "
            f"(e.g. {progress.epoch + max(1, progress.epoch // 2)})"
        )
    if max_steps is not None and progress.global_step >= max_steps:
        return (
            f"the run has taken {plural(progress.global_step, 'step')}, "
            f"trainer.max_steps={max_steps}: nothing to train; to train on, resume with a "
            "larger trainer.max_steps (or "
            "trainer.max_steps=null)"
        )
    return None


def nothing_to_train(cfg: Config, run_dir: RunDir) -> Optional[str]:
    """The line the job would print before ending at once with nothing trained
    ('<checkpoint>: ... nothing to train; to train on, resume with ...'), decided on the
    login node; None when there is something to train or the records do not tell."""
    newest = run_dir.newest_checkpoint()
    if newest is None or cfg.script is not None or not is_whole(newest):
        return None
    es = cfg.trainer.early_stopping
    record = run_dir.read_checkpoint_record()
    if record is not None:
        saved = record.get("early_stopping")
        progress = early_stop.resumed(Progress.from_dict(record["progress"]), saved, es)
    else:
        progress_or_none = _completed_progress(run_dir, newest)
        if progress_or_none is None:
            return None
        progress, saved = progress_or_none, None
    line = line_for(cfg, progress, saved)
    return None if line is None else f"{newest}: {line}"


def line_for(cfg: Config, progress: Progress, saved: Optional[Any]) -> Optional[str]:
    """Why a checkpoint at ``progress`` (saved under the early-stopping settings
    ``saved``, already applied by early_stop.resumed) leaves nothing to train under
    ``cfg``; None when there is something."""
    if progress.early_stopped:
        return early_stop.nothing_to_train_line(progress, saved, cfg.trainer.early_stopping)
    return limit_reached_line(progress, cfg.trainer.max_epochs, cfg.trainer.max_steps)


def is_whole(checkpoint: Path) -> bool:
    """Whether the file is as long as its frame says: a file cut short, or not hpcdl's,
    would be skipped by the job for an older one, which may have something to train. Its
    checksum is not checked: that reads the whole file, which the job does anyway."""
    try:
        stored_checksum(checkpoint)
    except CheckpointError:
        return False
    return True


def _completed_progress(run_dir: RunDir, newest: Path) -> Optional[Progress]:
    """Checkpoints saved before checkpoint.json: summary.json's epochs and steps, when the
    run completed at the newest checkpoint and did not stop early (the settings it stopped
    under are only in the checkpoint)."""
    try:
        summary = run_dir.read_summary()
    except (OSError, ValueError):
        return None
    if summary is None or summary.get("early_stopped") is not False:
        return None
    if Path(str(summary.get("checkpoint"))).name != newest.name:
        return None
    epochs, steps = summary.get("epochs"), summary.get("steps")
    if not isinstance(epochs, int) or not isinstance(steps, int):
        return None
    return Progress(epoch=epochs, global_step=steps)
