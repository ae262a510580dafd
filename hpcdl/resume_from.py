"""`hpcdl resume RUN_DIR --from CHECKPOINT [--new-run-dir NEW_DIR]`: continue a run from a
checkpoint older than its newest.

In place, the checkpoints saved after the chosen one move to checkpoints.set-aside-N with
the records of their epochs, so the job finds the chosen one as the newest and goes on as
a run that had stopped there. With --new-run-dir, a new run dir gets the run's config,
the chosen checkpoint and the metrics up to it, and the run's own dir is only read.

Decided on the login node, without torch: the chosen file is verified as the store
verifies it (frame and checksum), and its progress is read from it (hpcdl.checkpoint_file).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from hpcdl import early_stop
from hpcdl.atomic import copy_atomic, fsync_directory, remove_stale_temps, temp_path
from hpcdl.checkpoint_file import read_plain_entries, step_file_name, stored_checksum
from hpcdl.config.convert import save_config
from hpcdl.config.schema import Config
from hpcdl.errors import CheckpointError, HpcdlError, RunDirError, os_error_reason
from hpcdl.nothing_to_train import line_for
from hpcdl.rundir import FROM_CHECKPOINT, STEP_FILE, RunDir
from hpcdl.state import Progress

BEST = "best.pt"
# Names listed in a refusal: the oldest and the newest ones of a longer list.
_LISTED_FIRST, _LISTED_LAST = 2, 3


@dataclass(frozen=True)
class ChosenCheckpoint:
    run_dir: RunDir
    path: Path  # the chosen file, in run_dir's checkpoints folder
    step: int  # its global step: the job finds it as step_<step>.pt, the newest
    entries: dict[str, Any]  # what it holds besides tensors (read_plain_entries)
    new_run_dir: Optional[Path]

    @property
    def progress(self) -> Optional[Progress]:
        """Where the chosen checkpoint is (None: an `hpcdl run` program's own state)."""
        raw = self.entries.get("progress")
        return Progress.from_dict(raw) if isinstance(raw, dict) else None

    @property
    def where(self) -> str:
        pr = self.progress
        at = pr.position() if pr else f"step {self.step}"
        return f"{self.path.name} ({at})"

    def nothing_to_train(self, cfg: Config) -> Optional[str]:
        """The job's 'nothing to train' line for the chosen checkpoint, as
        hpcdl.nothing_to_train decides it for the newest; None when there is something."""
        progress = self.progress
        if progress is None:
            return None
        es, saved = cfg.trainer.early_stopping, self.entries.get("early_stopping")
        line = line_for(cfg, early_stop.resumed(progress, saved, es), saved)
        return None if line is None else f"{self.path}: {line}"

    def continue_in_place(self, records: tuple[Path, ...] = ()) -> None:
        """Under the run dir's lock: set aside what was saved after the chosen checkpoint,
        with ``records`` (an `hpcdl run` program's metrics_file: rundir.program_records)."""
        run_dir = self.run_dir
        step_file = run_dir.checkpoint_dir / step_file_name(self.step)
        later = [path for step, path in run_dir.step_files() if step > self.step]
        best = run_dir.checkpoint_dir / BEST
        if self.path != best and best.is_file() and _step_of_best(run_dir) > self.step:
            later.append(best)  # its weights are from the epochs set aside
        if self.path == best and step_file.is_file() and not _verifies(step_file):
            later.append(step_file)  # damaged: best.pt's copy takes its place
        restore = not step_file.is_file() or step_file in later  # --from best
        if not later and not restore:
            print(f"--from {self.where}: the newest checkpoint; nothing set aside", flush=True)
            return
        progress, keys = self.progress, _record_keys(run_dir)
        aside = None
        if later:
            aside = run_dir.set_aside_after(later, progress.epoch if progress else None, records)
            print(
                f"--from {self.where}: the {len(later)} checkpoint(s) saved after it, with the "
                f"records of their epochs, moved to {aside}",
                flush=True,
            )
        if restore:  # the job loads the newest step file: best.pt's copy under its name
            copy_atomic(self.path, step_file)
        self._write_record(run_dir, step_file, keys)
        aside_name = aside.name if aside is not None else None
        run_dir.append_attempt(self.lineage(run_dir.path, set_aside=aside_name))

    def branch(self, cfg: Config) -> RunDir:
        """A new run dir (--new-run-dir) holding the run's config, the chosen checkpoint and
        the metrics up to it. The run's own dir is only read, not even locked (its lock
        file names the holder): its checkpoints are complete under their names, so one
        being trained meanwhile changes nothing read here. Built under a temporary name and
        renamed into place, so a failure leaves nothing."""
        assert self.new_run_dir is not None
        target, source = self.new_run_dir, self.run_dir
        staging = temp_path(target)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(staging, ignore_errors=True)  # left by a killed command
            for stale in remove_stale_temps(target):  # copies left by killed commands
                print(f"--new-run-dir: removed {stale}, left by an interrupted copy", flush=True)
            staging.mkdir()
            self._fill(RunDir(staging), replace(cfg, run_dir=str(target)))
            os.rename(staging, target)  # refuses a folder made meanwhile that holds files
            fsync_directory(target.parent)
        except BaseException as err:  # Ctrl-C in a long copy too: no hidden copy left
            shutil.rmtree(staging, ignore_errors=True)
            if not isinstance(err, OSError):
                raise
            raise RunDirError(
                f"--new-run-dir {target}: cannot create it: {os_error_reason(err)}"
            ) from err
        print(f"--new-run-dir {target}: from {source.path}'s {self.where}", flush=True)
        return RunDir(target)

    def discard_branch(self) -> None:
        """A branch whose launch was refused (its job found the checkpoint does not fit the
        overrides, or the submission failed): NEW_DIR holds only copies of what branch()
        took from the run and the refused attempt's records. It is removed, so that the
        same command with the value fixed makes it again (it would say "already exists",
        and NEW_DIR would keep the run's config without the overrides)."""
        assert self.new_run_dir is not None
        shutil.rmtree(self.new_run_dir, ignore_errors=True)
        print(
            f"--new-run-dir {self.new_run_dir}: removed, as nothing was trained in it; "
            "run the command again with the value fixed",
            flush=True,
        )

    def _fill(self, new: RunDir, cfg: Config) -> None:
        source = self.run_dir
        commands = source.path / RunDir.COMMANDS
        if commands.is_file():
            shutil.copy2(commands, new.path / RunDir.COMMANDS)
        metrics = source.path / RunDir.METRICS
        progress = self.progress
        if progress is not None and metrics.is_file():
            shutil.copy2(metrics, new.path / RunDir.METRICS)
            new.metrics.truncate_after_epoch(progress.epoch)
        new.checkpoint_dir.mkdir()
        step_file = new.checkpoint_dir / step_file_name(self.step)
        copy_atomic(self.path, step_file)
        best = source.checkpoint_dir / BEST
        if best.is_file() and self.path != best:
            if 0 <= _step_of_best(source) <= self.step:  # the best as of the chosen one
                copy_atomic(best, new.checkpoint_dir / BEST)
            else:
                print(
                    f"--new-run-dir: {best} was saved after {self.path.name}, so not taken; "
                    "the new run saves its own best.pt when it validates better than its "
                    "best so far",
                    flush=True,
                )
        self._write_record(new, step_file, _record_keys(source))
        new.append_attempt(self.lineage(source.path.resolve()))
        save_config(cfg, new.config_file)  # last: what makes the folder a run dir

    def lineage(self, run_dir: Path, **extra: Optional[str]) -> dict[str, Any]:
        """attempts.jsonl's from_checkpoint record: the run dir and checkpoint the run goes
        on from, where in training it was, and its checksum (the same bytes, wherever they
        are copied), so that the origin of a branch or a rewound run stays on record."""
        digest, _ = stored_checksum(self.path)
        progress = self.progress
        return {
            "event": FROM_CHECKPOINT,
            "run_dir": str(run_dir),
            "checkpoint": self.path.name,
            "global_step": progress.global_step if progress else self.step,
            "epoch": progress.epoch if progress else None,  # as in progress: epochs done
            "step_in_epoch": progress.step_in_epoch if progress else None,
            "checksum": digest.hex(),
            "time": dt.datetime.now().isoformat(timespec="seconds"),
            **extra,
        }

    def _write_record(self, run_dir: RunDir, step_file: Path, keys: list[str]) -> None:
        """checkpoint.json for the chosen checkpoint, with the keys the trainer records
        (none where the run has no record: then the job decides, as before)."""
        if keys and all(key in self.entries for key in keys):
            run_dir.write_checkpoint_record(step_file, {key: self.entries[key] for key in keys})


def choose(
    cfg: Config, run_dir: RunDir, ref: str, *, from_scratch: bool, new_run_dir: Optional[str]
) -> ChosenCheckpoint:
    """The checkpoint `--from ref` names, verified; refused in one line before anything
    changes: an unknown name (the ones there are listed), a damaged file, --from-scratch
    too, best.pt without the training state, an existing --new-run-dir."""
    if from_scratch:
        raise HpcdlError(
            "--from and --from-scratch: give one (--from continues from that checkpoint, "
            "--from-scratch retrains from epoch 1)"
        )
    path = _named(run_dir, ref)  # first: the advice below must name one that exists
    if cfg.script is not None and new_run_dir is not None:
        raise HpcdlError(
            f"--new-run-dir: {run_dir.path} is an `hpcdl run` run, whose program keeps files "
            "of its own in its run dir that hpcdl cannot copy; continue it in place with "
            f"`hpcdl resume {run_dir.path} --from {ref}`"
        )
    target = _new_run_dir(new_run_dir, run_dir)
    try:
        entries = read_plain_entries(path)
    except CheckpointError as err:
        raise HpcdlError(
            f"--from {ref}: {err}; choose another: {checkpoint_listing(run_dir)}"
        ) from None
    step = _step_of(run_dir, path, entries, ref)
    return ChosenCheckpoint(run_dir, path, step, entries, target)


def _new_run_dir(value: Optional[str], run_dir: RunDir) -> Optional[Path]:
    if value is None:
        return None
    target, source = Path(value).expanduser().resolve(), run_dir.path.resolve()
    if target == source or source in target.parents or target in source.parents:
        where = "is" if target == source else "is inside" if source in target.parents else "holds"
        raise RunDirError(
            f"--new-run-dir {value}: {target} {where} the run dir {source}, which a branch "
            f"leaves as it was; give a folder outside it, e.g. {source}-branch"
        )
    if target.exists() or target.is_symlink():
        raise RunDirError(
            f"--new-run-dir {value}: {target} already exists; give a new run dir (it is "
            "never overwritten)"
        )
    return target


def _named(run_dir: RunDir, ref: str) -> Path:
    """The file in run_dir's checkpoints folder that ``ref`` names: best, a step file's
    name or path, or a global step number."""
    folder = run_dir.checkpoint_dir
    if ref.isdigit():
        candidate = folder / step_file_name(int(ref))
    elif os.sep in ref:
        candidate = Path(ref).expanduser().resolve()
        if candidate.parent != folder.resolve():
            raise HpcdlError(
                f"--from {ref}: not in {folder}; --from continues this run from one of its "
                f"own checkpoints ({checkpoint_listing(run_dir)}); for another run's weights, start a "
                f"new run with init_from={ref}"
            )
    else:
        candidate = folder / (BEST if ref == "best" else ref)
    ok = candidate.name == BEST or STEP_FILE.match(candidate.name)
    if candidate.is_dir():  # a program's own checkpoint folder (torch.distributed.checkpoint)
        raise HpcdlError(
            f"--from {ref}: a folder of your program's, not one of hpcdl.api's store files "
            f"(step_N.pt), which --from picks among ({checkpoint_listing(run_dir)}); to go on "
            f"from it, move the newer folders out of {folder} and `hpcdl resume "
            f"{run_dir.path}`"
        )
    if not ok or not candidate.is_file():
        raise HpcdlError(
            f"--from {ref}: no such checkpoint in {folder}; {checkpoint_listing(run_dir)}"
        )
    return candidate


def _step_of(run_dir: RunDir, path: Path, entries: dict[str, Any], ref: str) -> int:
    match = STEP_FILE.match(path.name)
    if match:
        return int(match.group(1))
    if not all(key in entries for key in ("optimizer", "progress")) and not _is_script_run(run_dir):
        raise HpcdlError(
            f"--from {ref}: {path} holds the model's weights only, not the training state to "
            f"continue from; {checkpoint_listing(run_dir)}, or start a new run from its weights with "
            f"init_from={path}"
        )
    progress = entries.get("progress")
    if isinstance(progress, dict) and isinstance(progress.get("global_step"), int):
        return int(progress["global_step"])
    same = [step for step, p in run_dir.step_files() if _same_bytes(p, path)]
    if not same:  # an `hpcdl run` program's best.pt whose step file is gone
        raise HpcdlError(
            f"--from {ref}: no step file holds {path}'s state, so the step it was saved at "
            f"is not known; choose a step file: {checkpoint_listing(run_dir)}"
        )
    return same[0]


def _is_script_run(run_dir: RunDir) -> bool:
    return run_dir.load_config().script is not None


def _step_of_best(run_dir: RunDir) -> int:
    """The global step best.pt was saved at: the step file with the same bytes, else the
    progress it holds; -1 when not known (kept where it is)."""
    best = run_dir.checkpoint_dir / BEST
    for step, path in run_dir.step_files():
        if _same_bytes(path, best):
            return step
    try:
        progress = read_plain_entries(best).get("progress")
    except CheckpointError:
        return -1
    return int(progress["global_step"]) if isinstance(progress, dict) else -1


def _same_bytes(a: Path, b: Path) -> bool:
    """best.pt is a copy of a step file: the same checksum and length in the frame."""
    try:
        return stored_checksum(a) == stored_checksum(b)
    except CheckpointError:
        return False


def _verifies(path: Path) -> bool:
    try:
        read_plain_entries(path)
    except CheckpointError:
        return False
    return True


def checkpoint_listing(run_dir: RunDir) -> str:
    """'the checkpoints there: step_..., ..., best.pt', the middle of a long list cut."""
    names = [path.name for _, path in run_dir.step_files()]
    if len(names) > _LISTED_FIRST + _LISTED_LAST:
        cut = len(names) - _LISTED_FIRST - _LISTED_LAST
        names = [*names[:_LISTED_FIRST], f"({cut} more)", *names[-_LISTED_LAST:]]
    if (run_dir.checkpoint_dir / BEST).is_file():
        names.append("best")
    return f"the checkpoints there: {', '.join(names)}" if names else "it holds no checkpoint"


def _record_keys(run_dir: RunDir) -> list[str]:
    """The keys the trainer writes to checkpoint.json, from the run's record (whichever
    checkpoint it names); none without a record (saved before it, or by a program)."""
    try:
        value = json.loads(run_dir.checkpoint_record_file.read_text())
    except (OSError, ValueError):
        return []
    return [key for key in value if key != "checkpoint"] if isinstance(value, dict) else []
