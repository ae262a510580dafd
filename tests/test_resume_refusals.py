"""`hpcdl resume` decides on the login node, before launching anything and without torch,
what the job would otherwise find out only after its queue wait: that there is nothing to
train, or that the run's dataset or split is not the one its checkpoints were trained on.
Nothing in the run dir changes when it says so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from hpcdl.cli.resume_cmd import refuse_another_split
from hpcdl.config.schema import Config, CustomDataConfig, FilesConfig
from hpcdl.errors import HpcdlError
from hpcdl.rundir import RunDir
from tests.conftest import run_hpcdl

# 256 samples: 180 training rows, 6 steps of 32 an epoch.
SMALL = ["data=synthetic", "data.num_samples=256", "data.shape=[8]", "data.num_workers=0"]
STEP = "step_000000012.pt"  # the newest checkpoint after 2 epochs


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run that completed trainer.max_epochs=2; each test trains on a copy."""
    base = tmp_path_factory.mktemp("finished")
    out = run_hpcdl("train", "run_dir=run", "trainer.max_epochs=2", *SMALL, cwd=base)
    assert out.returncode == 0, out.stderr
    assert (base / "run" / "checkpoints" / STEP).is_file()
    return base / "run"


@pytest.fixture
def run(finished: Path, tmp_path: Path) -> Path:
    shutil.copytree(finished, tmp_path / "run")
    return tmp_path / "run"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def fake_slurm(tmp_path: Path) -> dict[str, str]:
    """sbatch, sinfo, squeue, scontrol on PATH that only leave a mark: a resume that
    decides on the login node runs none of them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sbatch", "sinfo", "squeue", "scontrol", "sacct"):
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\necho {name} >> {tmp_path / 'slurm_called'}\nexit 1\n")
        tool.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def nothing_line(run: Path, text: str) -> str:
    return f"{run / 'checkpoints' / STEP}: {text}\n"


def test_a_finished_slurm_run_is_told_on_the_login_node_and_submits_nothing(
    run: Path, tmp_path: Path
) -> None:
    before = snapshot(run)
    for overrides in ([], ["cluster=slurm"], ["cluster=local", "cluster.tasks_per_node=2"]):
        out = run_hpcdl("resume", "run", *overrides, cwd=tmp_path, env=fake_slurm(tmp_path))
        assert out.returncode == 0, out.stderr
        assert out.stdout == nothing_line(
            run,
            "the run has trained 2 epochs, trainer.max_epochs=2: nothing to train; to train "
            "on, resume with a larger trainer.max_epochs (e.g. 3)",
        ), overrides
        assert out.stderr == ""
        assert not (tmp_path / "slurm_called").exists()
        shutil.rmtree(tmp_path / "bin")
    # config.yaml (no cluster=slurm in it), commands.log, attempts.jsonl: as they were.
    assert snapshot(run) == before
    out = run_hpcdl("resume", "run", "trainer.max_epochs=5", "trainer.max_steps=10", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == nothing_line(
        run,
        "the run has taken 12 steps, trainer.max_steps=10: nothing to train; to train on, "
        "resume with a larger trainer.max_steps (or trainer.max_steps=null)",
    )
    assert snapshot(run) == before


def test_the_login_node_decision_never_imports_torch(run: Path, tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from hpcdl.cli.main import main\n"
        f"assert main(['resume', {str(run)!r}]) == 0\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "nothing to train" in out.stdout


def test_another_built_in_model_is_refused_on_the_login_node(run: Path, tmp_path: Path) -> None:
    # Before: submitted on Slurm, config.yaml saved with the new model, and every job after
    # it failed on its first node ("... does not fit this run's model").
    before = snapshot(run)
    env = fake_slurm(tmp_path)
    cases = [
        (["model.hidden_sizes=[30,60,8]", "model.dropout=0.2"], "model.hidden_sizes=[30,60,8]: ",
         "hold the weights of model.hidden_sizes=[30,60], which this model cannot take; resume "
         "with model.hidden_sizes=[30,60], or train a new run (hpcdl train "
         "model.hidden_sizes=[30,60,8] ...)"),
        (["model.hidden_sizes=[16]"], "model.hidden_sizes=[16]: ",
         "hold the weights of model.hidden_sizes=[30,60], which this model cannot take; "
         "resume with model.hidden_sizes=[30,60]"),
    ]  # fmt: skip
    for overrides, start, middle in cases:
        out = run_hpcdl("resume", "run", "trainer.max_epochs=4", "cluster=slurm", *overrides,
                        cwd=tmp_path, env=env)  # fmt: skip
        assert out.returncode == 2, out.stdout
        assert out.stderr.startswith(f"error: {start}{run}'s checkpoints ") and middle in out.stderr
        assert out.stderr.count("\n") == 1, out.stderr
    assert not (tmp_path / "slurm_called").exists()
    assert snapshot(run) == before
    # Dropout changes no weight: it trains on (here, on this machine).
    out = run_hpcdl("resume", "run", "trainer.max_epochs=3", "model.dropout=0.1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr


def test_a_resume_that_waited_for_the_lock_sees_the_job_the_other_one_submitted(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Three `hpcdl resume` at once each submitted a job (60, 61, 62); two of them failed in
    # their jobs, "being trained by Slurm job 62". Here the other resume submits job 62
    # while this one waits for the run dir's lock.
    import contextlib

    from hpcdl.cli.main import main
    from hpcdl.runlock import hold

    @contextlib.contextmanager
    def hold_after_the_other(run_dir: RunDir):  # type: ignore[no-untyped-def]
        run_dir.record_submission("62", "slurm", run_dir.log_dir)
        with hold(run_dir):
            yield

    def launched(*args: object) -> int:
        raise AssertionError("launched a second job")

    monkeypatch.setattr("hpcdl.runlock.hold", hold_after_the_other)
    monkeypatch.setattr("hpcdl.cli.main.launch", launched)
    monkeypatch.setattr("hpcdl.launch.monitor.job_state", lambda job: {"state": "PENDING"})
    config = (run / "config.yaml").read_bytes()
    assert main(["resume", str(run), "trainer.max_epochs=4"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: {run}: its job 62 is still PENDING; it resumes by itself when requeued, or "
        f"stop it first with `hpcdl cancel {run}`\n"
    )
    assert (run / "config.yaml").read_bytes() == config


def test_more_epochs_and_from_scratch_still_train(run: Path, tmp_path: Path) -> None:
    out = run_hpcdl("resume", "run", "trainer.max_epochs=3", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "epoch 3/3" in out.stdout
    record = json.loads((run / "checkpoint.json").read_text())
    assert record["checkpoint"] == "step_000000018.pt"
    assert record["progress"]["epoch"] == 3
    # Checkpoints gone: --from-scratch retrains, whatever the records of the old run say.
    shutil.rmtree(run / "checkpoints")
    out = run_hpcdl("resume", "run", "--from-scratch", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "epoch 3/3" in out.stdout and "nothing to train" not in out.stdout


def test_from_scratch_sets_the_checkpoints_left_aside_and_retrains_from_epoch_1(
    run: Path, tmp_path: Path
) -> None:
    old = (run / "checkpoints" / STEP).read_bytes()
    out = run_hpcdl("resume", "run", "--from-scratch", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"its checkpoints moved to {run / 'checkpoints.set-aside-1'}" in out.stdout
    assert "epoch 1/2" in out.stdout and "nothing to train" not in out.stdout
    rows = (run / "metrics.csv").read_text().splitlines()[1:]
    assert [row.split(",")[0] for row in rows] == ["1", "2"]  # its own history, retrained
    assert (run / "checkpoints.set-aside-1" / STEP).read_bytes() == old  # nothing deleted
    assert (run / "checkpoints" / STEP).is_file()  # the retrained run's own
    again = run_hpcdl("resume", "run", "--from-scratch", cwd=tmp_path)
    assert again.returncode == 0 and (run / "checkpoints.set-aside-2" / STEP).is_file()


def test_checkpoints_saved_before_checkpoint_json_are_decided_from_summary_json(
    run: Path, tmp_path: Path
) -> None:
    (run / "checkpoint.json").unlink()
    before = snapshot(run)
    out = run_hpcdl("resume", "run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "resuming" not in out.stdout and "nothing to train" in out.stdout
    assert snapshot(run) == before
    # A summary of another checkpoint than the newest does not tell: the job decides.
    summary = json.loads((run / "summary.json").read_text())
    summary["checkpoint"] = str(run / "checkpoints" / "step_000000006.pt")
    (run / "summary.json").write_text(json.dumps(summary))
    out = run_hpcdl("resume", "run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("resuming run dir: ")
    assert "nothing to train" in out.stdout  # the trainer's backstop


def test_an_early_stopped_run_is_told_on_the_login_node(tmp_path: Path) -> None:
    stop_at_2 = ["trainer.early_stopping.patience=1", "trainer.early_stopping.min_delta=100"]
    out = run_hpcdl(
        "train", "run_dir=run", "trainer.max_epochs=30", *SMALL, *stop_at_2, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    run = tmp_path / "run"
    best = float(next(iter(csv_rows(run / "metrics.csv")))["val_loss"])
    before = snapshot(run)
    out = run_hpcdl("resume", "run", "trainer.max_epochs=50", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == nothing_line(
        run,
        f"the run stopped early after epoch 2 (val_loss did not improve on epoch 1's "
        f"{best:.4g} in 1 evaluation, trainer.early_stopping.patience=1): nothing to train; "
        "to train on, resume with trainer.early_stopping.patience=0 (off) or a larger patience",
    )
    assert snapshot(run) == before
    out = run_hpcdl(
        "resume", "run", "trainer.max_epochs=3", "trainer.early_stopping.patience=0", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert "training goes on" in out.stdout and "epoch 3/3" in out.stdout


def csv_rows(path: Path) -> list[dict[str, str]]:
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_synthetic_data_keys_are_refused_and_loader_keys_are_free(
    run: Path, tmp_path: Path
) -> None:
    before = snapshot(run)
    out = run_hpcdl("resume", "run", "data.seed=1", "trainer.max_epochs=3", cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.splitlines() == [
        f"error: data.seed=1: {run}'s checkpoints were trained on data.seed=0, another "
        "dataset; resume with data.seed=0, or start a new run: the command that made this one "
        f"({run / 'commands.log'}) with data.seed=1 (init_from={run} for its weights only)"
    ]
    for override in ("data.num_samples=300", "data.num_classes=3", "data.noise=2.0"):
        out = run_hpcdl("resume", "run", override, cwd=tmp_path)
        assert out.returncode == 2, out.stdout + out.stderr
        assert out.stderr.startswith(f"error: {override}: ") and out.stderr.count("\n") == 1
    out = run_hpcdl("resume", "run", "data.shape=[4]", cwd=tmp_path)
    assert out.returncode == 2 and "resume with 'data.shape=[8]'" in out.stderr, out.stderr
    assert snapshot(run) == before
    out = run_hpcdl("resume", "run", "data.num_workers=1", "data.in_memory=false", cwd=tmp_path)
    assert out.returncode == 0 and "nothing to train" in out.stdout, out.stderr


def test_a_split_edited_in_config_yaml_is_refused_on_the_login_node(
    run: Path, tmp_path: Path
) -> None:
    raw = yaml.safe_load((run / "config.yaml").read_text())
    raw["data"]["split_seed"] = 3
    (run / "config.yaml").write_text(yaml.safe_dump(raw))
    before = snapshot(run)
    out = run_hpcdl("resume", "run", "trainer.max_epochs=3", cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.splitlines() == [
        f"error: data.split_seed=3 in {run / 'config.yaml'}: {run}'s checkpoints were "
        "trained on the training rows of data.split_seed=0, some of which would be "
        "validation and test rows with data.split_seed=3; resume with data.split_seed=0, or "
        f"start a new run: the command that made this one ({run / 'commands.log'}) with "
        f"data.split_seed=3 (init_from={run} for its weights only)"
    ]
    assert snapshot(run) == before
    # What the advice says trains on.
    out = run_hpcdl("resume", "run", "data.split_seed=0", "trainer.max_epochs=3", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "epoch 3/3" in out.stdout and "changed since this checkpoint" not in out.stdout


def test_a_value_edited_in_config_yaml_is_checked_before_anything_starts(
    run: Path, tmp_path: Path
) -> None:
    """A hand-edited config.yaml (sweeps.md's fix for a failed trial) was submitted
    unchecked: the job failed on its node after the queue wait (persona, sweeps)."""
    raw = yaml.safe_load((run / "config.yaml").read_text())
    raw["optim"]["lr"] = -1
    (run / "config.yaml").write_text(yaml.safe_dump(raw))
    before = snapshot(run)
    line = f"error: {run / 'config.yaml'}: optim.lr=-1.0: must be > 0; fix it there"
    for dry in ([], ["--dry-run"]):
        out = run_hpcdl("resume", "run", *dry, cwd=tmp_path)
        assert (out.returncode, out.stderr.splitlines()) == (2, [line]), out.stdout
        assert snapshot(run) == before
    # An override that fixes it is the value checked.
    out = run_hpcdl("resume", "run", "optim.lr=0.01", "trainer.max_epochs=3", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "epoch 3/3" in out.stdout


def with_step_file(tmp_path: Path) -> RunDir:
    run_dir = RunDir(tmp_path)
    run_dir.checkpoint_dir.mkdir()
    (run_dir.checkpoint_dir / "step_000000004.pt").write_bytes(b"")
    return run_dir


def test_custom_kwargs_and_the_label_column_are_the_dataset(tmp_path: Path) -> None:
    run_dir = with_step_file(tmp_path)
    custom = Config(data=CustomDataConfig(target="lab.data:build", kwargs={"root": "/a", "n": 3}))
    other = replace(custom, data=replace(custom.data, kwargs={"root": "/b", "n": 3}))
    with pytest.raises(HpcdlError) as refused:
        refuse_another_split(plain_data(custom), custom, other, run_dir)
    assert str(refused.value) == (  # the keys that changed, not the whole dict three times
        f"data.kwargs.root=/b: {tmp_path}'s checkpoints were trained on data.kwargs.root=/a, "
        "another dataset; resume with data.kwargs.root=/a, or start a new run: the command "
        f"that made this one ({tmp_path / 'commands.log'}) with data.kwargs.root=/b "
        f"(init_from={tmp_path} for its weights only)"
    )
    added = replace(custom, data=replace(custom.data, kwargs={"root": "/a", "n": 3, "seed": 1}))
    with pytest.raises(HpcdlError, match=r"^data.kwargs.seed=1: .* trained on data.kwargs.seed "
                       r"unset, another dataset; resume with data.kwargs.seed unset, or"):  # fmt: skip
        refuse_another_split(plain_data(custom), custom, added, run_dir)
    loader = replace(custom, data=replace(custom.data, num_workers=0, prefetch_factor=4))
    refuse_another_split(plain_data(custom), custom, loader, run_dir)  # free to change
    files = Config(data=FilesConfig(path="a.csv", label_column="label"))
    other = replace(files, data=replace(files.data, label_column="y"))
    with pytest.raises(HpcdlError, match=r"^data.label_column=y: .* another dataset; resume"):
        refuse_another_split(plain_data(files), files, other, run_dir)
    moved = replace(files, data=replace(files.data, path="moved/a.csv", labels_path="b.npy"))
    refuse_another_split(plain_data(files), files, moved, run_dir)  # free to change
    # Column names with spaces: one pasteable word each (it was '...'"'"'area sqft'"'"'...).
    spaced = replace(files, data=replace(files.data, feature_columns=["rooms", "area sqft"]))
    fewer = replace(files, data=replace(files.data, feature_columns=["rooms"]))
    with pytest.raises(HpcdlError) as refused:
        refuse_another_split(plain_data(spaced), spaced, fewer, run_dir)
    assert "trained on \"data.feature_columns=[rooms,'area sqft']\", another dataset" in str(
        refused.value
    )
    # data=custom's files moved (to scratch): a path to one that exists is free, as data.path
    # is (before: refused as another dataset, with no way to go on).
    scratch = tmp_path / "scratch" / "cells"
    scratch.mkdir(parents=True)
    at_scratch = replace(custom, data=replace(custom.data, kwargs={"root": str(scratch), "n": 3}))
    refuse_another_split(plain_data(custom), custom, at_scratch, run_dir)
    gone = replace(custom, data=replace(custom.data, kwargs={"root": "/nowhere/b", "n": 3}))
    with pytest.raises(HpcdlError, match="another dataset"):  # not there: not a move
        refuse_another_split(plain_data(custom), custom, gone, run_dir)
    with pytest.raises(HpcdlError, match="another dataset"):  # n too: another dataset
        refuse_another_split(plain_data(custom), custom, replace(custom, data=replace(
            custom.data, kwargs={"root": str(scratch), "n": 4})), run_dir)  # fmt: skip


def plain_data(cfg: Config) -> dict:
    from hpcdl.config.convert import to_plain

    return to_plain(cfg)["data"]


def test_checkpoint_json_is_trusted_only_for_the_newest_step_file(tmp_path: Path) -> None:
    run_dir = with_step_file(tmp_path)
    assert run_dir.read_checkpoint_record() is None
    run_dir.write_checkpoint_record(run_dir.checkpoint_dir / "step_000000004.pt", {"x": 1})
    assert run_dir.read_checkpoint_record() == {"checkpoint": "step_000000004.pt", "x": 1}
    (run_dir.checkpoint_dir / "step_000000010.pt").write_bytes(b"")  # saved by an older hpcdl
    assert run_dir.newest_checkpoint() == run_dir.checkpoint_dir / "step_000000010.pt"
    assert run_dir.read_checkpoint_record() is None
    run_dir.checkpoint_record_file.write_text('{"checkpoint": "step_0000')  # cut short
    assert run_dir.read_checkpoint_record() is None
