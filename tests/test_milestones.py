"""trainer.keep_every_epochs: the checkpoint saved at the end of every K-th epoch is a
milestone, kept by the purge beyond trainer.keep_last forever. Which files are milestones
follows from each file's own progress and the setting it was saved with (or this run's),
so milestones survive requeues, resumes and a changed setting; exact resume is unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pytest
import torch

from hpcdl import checkpoint
from hpcdl.checkpoint import CheckpointStore
from hpcdl.cli.compose import compose_config
from hpcdl.errors import ConfigError
from tests import fault_hook
from tests.conftest import run_hpcdl

# 256 samples: 180 training rows, 6 steps of 32 an epoch.
SMALL = ["data=synthetic", "data.num_samples=256", "data.shape=[8]", "data.num_workers=0"]


def epoch_end(epoch: int, keep_every_epochs: Optional[int], *, step_in_epoch: int = 0) -> dict:
    """A state as the trainer saves it at the end of `epoch` (6 steps an epoch)."""
    step = 6 * epoch + step_in_epoch
    return {
        "model": {"weight": torch.full((2, 2), float(step))},
        "progress": {"epoch": epoch, "step_in_epoch": step_in_epoch, "global_step": step},
        "keep_every_epochs": keep_every_epochs,
    }


def save_epochs(store: CheckpointStore, epochs: range, keep_every_epochs: Optional[int]) -> None:
    for epoch in epochs:
        store.save(epoch_end(epoch, keep_every_epochs), 6 * epoch)


def epochs_on_disk(directory: Path) -> list[int]:
    return [step // 6 for step, _ in CheckpointStore(directory).list_steps()]


# ----------------------------------------------------------------------------- the store
def test_the_purge_keeps_every_kth_epoch_end_beyond_keep_last(tmp_path: Path) -> None:
    save_epochs(CheckpointStore(tmp_path, keep_last=1), range(1, 8), 2)
    assert epochs_on_disk(tmp_path) == [2, 4, 6, 7]


def test_mid_epoch_checkpoints_are_never_milestones(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last=1)
    store.save(epoch_end(1, 1, step_in_epoch=3), 9)  # checkpoint_every_steps, mid-epoch 2
    store.save(epoch_end(1, 1, step_in_epoch=5), 11)
    store.save(epoch_end(2, 1), 12)
    assert [step for step, _ in store.list_steps()] == [12]


def test_an_epochs_last_step_saved_before_the_epoch_ended_is_no_milestone(
    tmp_path: Path,
) -> None:
    # Its progress still says epoch 1, step 6 of it: the trainer saves the step again once
    # the epoch has ended (tested below with a run), so that the file says epoch 2 is done.
    store = CheckpointStore(tmp_path, keep_last=1)
    store.save(epoch_end(1, 1, step_in_epoch=6), 12)
    store.save(epoch_end(2, 1, step_in_epoch=1), 13)
    assert [step for step, _ in store.list_steps()] == [13]


def test_milestones_stay_when_the_option_is_turned_off_or_changed(tmp_path: Path) -> None:
    save_epochs(CheckpointStore(tmp_path, keep_last=1), range(1, 5), 2)
    assert epochs_on_disk(tmp_path) == [2, 4]
    # A resume with the option off: the milestones stay, and none are added.
    save_epochs(CheckpointStore(tmp_path, keep_last=1), range(5, 7), None)
    assert epochs_on_disk(tmp_path) == [2, 4, 6]
    # Another K: they stay, and its own milestones are added, epoch 6's too (on disk when
    # the option was set again).
    save_epochs(CheckpointStore(tmp_path, keep_last=1), range(7, 11), 3)
    assert epochs_on_disk(tmp_path) == [2, 4, 6, 9, 10]


def test_an_epoch_end_on_disk_when_the_option_is_set_stays_a_milestone(tmp_path: Path) -> None:
    save_epochs(CheckpointStore(tmp_path, keep_last=2), range(1, 3), None)
    # Resumed with keep_every_epochs=2: epoch 2's file, still on disk, is one of its
    # milestones, although the file itself was saved without the option ...
    save_epochs(CheckpointStore(tmp_path, keep_last=1), range(3, 5), 2)
    assert epochs_on_disk(tmp_path) == [2, 4]
    # ... and stays one under another setting, as the milestones saved with it do.
    save_epochs(CheckpointStore(tmp_path, keep_last=1), range(5, 8), 3)
    assert epochs_on_disk(tmp_path) == [2, 4, 6, 7]


def test_a_damaged_file_beyond_keep_last_is_purged_as_before(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last=1)
    (tmp_path / "step_000000006.pt").write_bytes(b"not a checkpoint")
    store.save(epoch_end(2, 1), 12)
    assert [step for step, _ in store.list_steps()] == [12]


def test_each_file_is_read_once_per_store(tmp_path: Path, monkeypatch) -> None:
    read = []

    def counted(path: Path) -> checkpoint.Mark:
        read.append(path.name)
        return real(path)

    real = checkpoint.milestone_mark
    monkeypatch.setattr(checkpoint, "milestone_mark", counted)
    save_epochs(CheckpointStore(tmp_path, keep_last=1), range(1, 6), 1)
    assert len(read) == len(set(read)) == 5
    assert epochs_on_disk(tmp_path) == [1, 2, 3, 4, 5]


def test_keep_every_epochs_below_1_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        compose_config(["trainer.keep_every_epochs=0"])
    assert str(info.value) == "trainer.keep_every_epochs=0: must be > 0"
    assert compose_config([]).trainer.keep_every_epochs is None  # off by default


# ----------------------------------------------------------------------------- runs
def train(cwd: Path, *args: str, fault: Optional[str] = None) -> None:
    hook = [fault_hook.OVERRIDE] if fault else []
    out = run_hpcdl("train", *args, *SMALL, *hook, cwd=cwd, env=fault_hook.env(fault))
    assert out.returncode == (3 if fault else 0), out.stdout + out.stderr


def resume(cwd: Path, *args: str) -> None:
    out = run_hpcdl("resume", *args, cwd=cwd, env=fault_hook.env(None))
    assert out.returncode == 0, out.stdout + out.stderr


def weights(run_dir: Path) -> str:
    return json.loads((run_dir / "summary.json").read_text())["weights_sha256"]


@pytest.mark.slow
def test_a_stopped_run_keeps_its_milestones_and_ends_with_the_same_weights(
    tmp_path: Path,
) -> None:
    # No validation split: no best.pt, whose save at an improving epoch's end would hide
    # a missing milestone save.
    no_val = ["trainer.max_epochs=5", "data.val_fraction=0", "data.test_fraction=0.3"]
    train(tmp_path, "run_dir=ref", *no_val)
    # Saves every 3 steps land on each epoch's last step, before the epoch has ended; the
    # stop after step 12 (agreed during the step after the signal) saves epoch 2's last
    # step before it has ended too. The epoch-end saves must still mark the milestones.
    args = [
        "trainer.keep_every_epochs=2",
        "trainer.keep_last=1",
        "trainer.checkpoint_every_steps=3",
    ]
    train(tmp_path, "run_dir=run", *no_val, *args, fault="SIGTERM@11")
    resume(tmp_path, "run")
    assert epochs_on_disk(tmp_path / "run" / "checkpoints") == [2, 4, 5]
    assert weights(tmp_path / "run") == weights(tmp_path / "ref")


@pytest.mark.slow
def test_resumes_that_set_and_change_the_option_keep_the_milestones(tmp_path: Path) -> None:
    checkpoints = tmp_path / "run" / "checkpoints"
    train(tmp_path, "run_dir=run", "trainer.max_epochs=2")
    assert epochs_on_disk(checkpoints) == [1, 2]
    # The purge in the background thread of trainer.async_checkpoint.
    more = ["trainer.keep_last=1", "trainer.async_checkpoint=true"]
    resume(tmp_path, "run", "trainer.max_epochs=4", "trainer.keep_every_epochs=2", *more)
    assert epochs_on_disk(checkpoints) == [2, 4]
    resume(tmp_path, "run", "trainer.max_epochs=7", "trainer.keep_every_epochs=3")
    assert epochs_on_disk(checkpoints) == [2, 4, 6, 7]
    # `hpcdl resume --from` offers them.
    out = run_hpcdl("resume", "run", "--from", "999", cwd=tmp_path)
    assert out.returncode == 2
    there = "the checkpoints there: step_000000012.pt, step_000000024.pt, step_000000036.pt"
    assert there in out.stderr
