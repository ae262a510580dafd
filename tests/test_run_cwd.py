"""Runs read from any folder: the folder a run was created from (config.yaml's workdir) is
where its job, a resume, evaluate and predict resolve its relative paths; data.path and
the other path keys hpcdl knows are absolute from the start."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hpcdl.cli.main import main
from hpcdl.config.paths import absolute, with_absolute_paths
from hpcdl.rundir import RunDir


def small_npz(folder: Path) -> Path:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 4)).astype("float32")
    np.savez(folder / "small.npz", x=x, y=(x[:, 0] > 0).astype("int64"))
    return folder / "small.npz"


def test_relative_data_paths_are_made_absolute_at_compose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcdl.cli.compose import compose_config

    (tmp_path / "data").mkdir()
    np.save(tmp_path / "data" / "small.npy", np.zeros((60, 3), dtype="float32"))
    np.save(tmp_path / "labels.npy", np.zeros(60, dtype="int64"))
    (tmp_path / "runs" / "ref" / "checkpoints").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "data")
    data = ["data=files", "data.path=small.npy", "data.labels_path=../labels.npy"]
    cfg = compose_config([*data, "init_from=../runs/ref"])
    assert cfg.data.path == str(tmp_path / "data" / "small.npy")  # type: ignore[union-attr]
    assert cfg.data.labels_path == str(tmp_path / "labels.npy")  # type: ignore[union-attr]
    assert cfg.init_from == str(tmp_path / "runs" / "ref")


def test_absolute_keeps_absolute_home_and_unset_paths() -> None:
    base = Path("/work/proj")
    assert absolute("/data/x.npz", base) == "/data/x.npz"
    assert absolute("~/x.npz", base) == "~/x.npz"
    assert absolute("???", base) == "???"
    assert absolute("../x/./y.npz", base) == "/work/x/y.npz"


def test_only_the_named_keys_change() -> None:
    from hpcdl.config.schema import Config, FilesConfig

    cfg = Config(data=FilesConfig(path="a.npz", labels_path="b.npy"), init_from="r")
    out = with_absolute_paths(cfg, Path("/p"), only=frozenset({"data.labels_path"}))
    assert (out.data.path, out.data.labels_path, out.init_from) == ("a.npz", "/p/b.npy", "r")  # type: ignore[union-attr]


def test_evaluate_from_another_folder_reads_the_runs_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hpcdl train data=files data.path=small.npz`, then `cd /tmp && hpcdl evaluate RUN`."""
    proj, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    proj.mkdir(), elsewhere.mkdir()
    small_npz(proj)
    monkeypatch.chdir(proj)
    train = ["train", "data=files", "data.path=small.npz", "trainer.max_epochs=1"]
    assert main([*train, "run_dir=runs/f1", "model.hidden_sizes=[8]"]) == 0
    run = proj / "runs" / "f1"
    assert RunDir(run).load_config().data.path == str(proj / "small.npz")  # type: ignore[union-attr]
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["evaluate", str(run), "--checkpoint", "last"]) == 0
    assert "test_accuracy" in capsys.readouterr().out
    # The run's own checkpoints by name, not as files of this folder.
    step = sorted(p.name for p in (run / "checkpoints").glob("step_*"))[-1]
    for which in ("newest", step):
        assert main(["evaluate", str(run), "--checkpoint", which]) == 0, which
        assert f"checkpoint: {run / 'checkpoints' / step}" in capsys.readouterr().out


# Appends the folder it runs in to RUN_DIR/cwd.txt; exits with its first argument (3: the
# run is interrupted, so a plain resume runs it again).
WHERE = """\
import os, sys
with open(os.path.join(os.environ["HPCDL_RUN_DIR"], "cwd.txt"), "a") as f:
    f.write(os.getcwd() + "\\n")
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def two_folders(tmp_path: Path) -> tuple[Path, Path]:
    """A project folder with where.py, and another folder a later command runs in."""
    proj, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    proj.mkdir(), elsewhere.mkdir()
    (proj / "where.py").write_text(WHERE)
    return proj, elsewhere


def cwds(run: Path) -> list[str]:
    return (run / "cwd.txt").read_text().splitlines()


def test_the_run_records_the_folder_it_was_created_from(
    two_folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    proj, _ = two_folders
    monkeypatch.chdir(proj)
    assert main(["run", "run_dir=runs/r1", "--", "python", "where.py", "3"]) == 3
    assert RunDir(proj / "runs" / "r1").load_config().workdir == str(proj)
    assert f"\nworkdir: {proj}\n" in (proj / "runs" / "r1" / "config.yaml").read_text()


def test_a_config_without_a_workdir_is_saved_without_the_key(tmp_path: Path) -> None:
    """A run created before the record: its config.yaml, rewritten by a resume, stays one
    that the hpcdl frozen in its code/ (which does not know the key) can read."""
    from hpcdl.config.convert import load_config, save_config
    from hpcdl.config.schema import Config

    save_config(Config(run_dir=str(tmp_path)), tmp_path / "config.yaml")
    assert "workdir" not in (tmp_path / "config.yaml").read_text()
    assert load_config(tmp_path / "config.yaml").workdir is None


@pytest.mark.parametrize("cluster", ["debug", "local"])
def test_resume_from_another_folder_runs_in_the_runs_folder(
    two_folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, cluster: str
) -> None:
    """`cd /tmp && hpcdl resume /work/x/runs/r1`: the script is found, and runs, where the
    run was created (not /tmp/where.py), on either launcher."""
    proj, elsewhere = two_folders
    monkeypatch.chdir(proj)
    assert main(["run", "run_dir=runs/r1", "--", "python", "where.py", "3"]) == 3
    monkeypatch.chdir(elsewhere)
    overrides = [f"cluster={cluster}", "cluster.tasks_per_node=1"] if cluster == "local" else []
    assert main(["resume", str(proj / "runs" / "r1"), *overrides]) == 3
    assert cwds(proj / "runs" / "r1") == [str(proj), str(proj)]
    assert Path.cwd() == elsewhere  # the command's own folder is left as it was


def test_a_slurm_job_started_elsewhere_runs_in_the_runs_folder(
    two_folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's payload (what each Slurm task runs), started where sbatch ran, e.g. the
    folder of a later `hpcdl resume`, or after a requeue."""
    import os
    import subprocess
    import sys

    proj, elsewhere = two_folders
    monkeypatch.chdir(proj)
    assert main(["run", "run_dir=runs/r1", "--", "python", "where.py", "0"]) == 0
    run = proj / "runs" / "r1"
    job = subprocess.run(
        [sys.executable, "-m", "hpcdl.launch.slurm_job", str(run)],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},
    )
    assert job.returncode == 0, job.stdout + job.stderr
    assert cwds(run) == [str(proj), str(proj)]


# data=custom with a path among its kwargs, which hpcdl cannot tell is a path.
SERIES = """\
import numpy as np
import torch


class Rows(torch.utils.data.Dataset):
    num_classes = 2

    def __init__(self, path):
        table = np.load(path)
        self.x = torch.tensor(table[:, :-1]).float()
        self.y = torch.tensor(table[:, -1]).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def series(path):
    return Rows(path)
"""


def test_evaluate_and_predict_read_data_kwargs_from_the_runs_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`data=custom data.kwargs.path=../series.npy`: evaluate and predict --split from
    another folder read the run's ../series.npy; --output is written where they ran."""
    lab, proj = tmp_path / "lab", tmp_path / "proj"
    elsewhere = tmp_path / "other" / "place"  # where ../series.npy is not the run's
    for folder in (lab, proj, elsewhere):
        folder.mkdir(parents=True)
    (lab / "cwd_series.py").write_text(SERIES)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 3))
    np.save(tmp_path / "series.npy", np.column_stack([x, x[:, 0] > 0]).astype("float32"))
    monkeypatch.syspath_prepend(str(lab))
    monkeypatch.chdir(proj)
    data = ["data=custom", "data.target=cwd_series:series", "data.kwargs.path=../series.npy"]
    train = [*data, "data.num_workers=0", "trainer.max_epochs=1", "model.hidden_sizes=[4]"]
    assert main(["train", *train, "run_dir=runs/c1"]) == 0
    run = proj / "runs" / "c1"
    assert RunDir(run).load_config().data.kwargs == {"path": "../series.npy"}  # type: ignore[union-attr]
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["evaluate", str(run), "--checkpoint", "last"]) == 0
    assert "(6 samples)" in capsys.readouterr().out
    split = ["--split", "test", "--output", "preds.csv", "--checkpoint", "last"]
    assert main(["predict", str(run), *split]) == 0
    assert len((elsewhere / "preds.csv").read_text().splitlines()) == 1 + 6
    assert Path.cwd() == elsewhere


def run_files(run: Path) -> dict[str, bytes]:
    """What a refused or idle resume must leave as it was."""
    names = ("config.yaml", "commands.log", "attempts.jsonl", "summary.json", "cwd.txt")
    return {n: (run / n).read_bytes() for n in names if (run / n).exists()}


@pytest.fixture
def completed(two_folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    """`hpcdl run -- python where.py 0` in proj, completed; the test then runs elsewhere."""
    proj, elsewhere = two_folders
    monkeypatch.chdir(proj)
    assert main(["run", "run_dir=runs/r1", "--", "python", "where.py", "0"]) == 0
    monkeypatch.chdir(elsewhere)
    return proj / "runs" / "r1"


def test_resume_of_a_completed_script_run_changes_nothing(
    completed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = run_files(completed)
    capsys.readouterr()
    assert main(["resume", str(completed)]) == 0
    out = capsys.readouterr().out
    assert out == (
        f"{completed}: its program completed (exit status 0): nothing to resume; to run it "
        f"again from the start, `hpcdl resume {completed} --from-scratch` (moves its "
        "checkpoints/ aside, clears summary.json), or give another command: "
        f"hpcdl resume {completed} -- COMMAND...\n"
    )
    assert main(["resume", str(completed), "cluster.timeout_min=5"]) == 0  # not the command
    assert run_files(completed) == before


def test_from_scratch_runs_a_completed_script_run_again(completed: Path) -> None:
    (completed / "checkpoints").mkdir()
    (completed / "checkpoints" / "step_1.pt").write_text("the program's own")
    assert main(["resume", str(completed), "--from-scratch"]) == 0
    assert len(cwds(completed)) == 2
    assert (completed / "checkpoints.set-aside-1" / "step_1.pt").is_file()
    assert RunDir(completed).read_summary() is not None  # the new attempt's


def test_resume_with_a_new_command_runs_it_from_the_runs_folder(
    completed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hpcdl resume RUN_DIR -- python where.py 3` from another folder: where.py is the
    run's folder's, validated there, and stored as the run's command."""
    assert main(["resume", str(completed), "--", "python", "where.py", "3"]) == 3
    assert RunDir(completed).load_config().script.command == ["python", "where.py", "3"]  # type: ignore[union-attr]
    assert cwds(completed) == [str(completed.parents[1])] * 2
    before = run_files(completed)
    capsys.readouterr()
    assert main(["resume", str(completed), "--", "python", "wehre.py", "0"]) == 2
    proj = completed.parents[1]
    assert capsys.readouterr().err == (
        f"error: wehre.py: no such script (from {proj}; did you mean where.py?); the run's job "
        "starts its program "
        "there (workdir); give its path from there (hpcdl resume RUN_DIR -- COMMAND...), or "
        "workdir=FOLDER where it moved\n"
    )
    assert run_files(completed) == before


def test_a_command_after_dashes_is_refused_for_a_trainer_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train", "run_dir=t1", "--no-launch"]) == 0
    before = run_files(tmp_path / "t1")
    capsys.readouterr()
    assert main(["resume", "t1", "--", "python", "train.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: -- python ...: {tmp_path / 't1'} is an `hpcdl train` run")
    assert err.count("\n") == 1
    assert run_files(tmp_path / "t1") == before


def test_resume_refuses_a_script_gone_from_the_runs_folder(
    two_folders: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The submit-time check, again: not the job failing (and the run then FAILED), nor
    another folder's where.py."""
    proj, elsewhere = two_folders
    monkeypatch.chdir(proj)
    assert main(["run", "run_dir=runs/r1", "--", "python", "where.py", "3"]) == 3
    (proj / "where.py").rename(proj / "moved.py")
    (elsewhere / "where.py").write_text(WHERE)  # the other folder's own where.py
    run = proj / "runs" / "r1"
    before = run_files(run)
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["resume", str(run)]) == 2
    assert capsys.readouterr().err.startswith(f"error: where.py: no such script (from {proj}); ")
    assert run_files(run) == before


def test_resume_of_a_run_whose_folder_is_gone_says_how_to_move_it(
    two_folders: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    proj, elsewhere = two_folders
    monkeypatch.chdir(proj)
    assert main(["run", "run_dir=../runs/r1", "--", "python", "where.py", "3"]) == 3
    run = proj.parent / "runs" / "r1"
    proj.rename(proj.parent / "moved")
    before = run_files(run)
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["resume", str(run)]) == 2
    assert capsys.readouterr().err == (
        f"error: workdir={proj}: no such folder here; it is the folder the run was created "
        "from, where its script and relative paths are found. If they moved, resume with "
        "workdir=NEW_FOLDER (e.g. cd there and add workdir=$PWD)\n"
    )
    assert run_files(run) == before
    assert main(["resume", str(run), "workdir=../moved"]) == 3  # from here, as typed
    assert RunDir(run).load_config().workdir == str(proj.parent / "moved")
    assert cwds(run) == [str(proj), str(proj.parent / "moved")]


def test_a_run_without_a_recorded_workdir_runs_where_resume_runs(
    two_folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs created before hpcdl recorded workdir: as before."""
    proj, elsewhere = two_folders
    monkeypatch.chdir(proj)
    assert main(["run", "run_dir=runs/r1", "--", "python", "where.py", "3"]) == 3
    run = proj / "runs" / "r1"
    text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(text.replace(f"workdir: {proj}\n", ""))
    (elsewhere / "where.py").write_text(WHERE)
    monkeypatch.chdir(elsewhere)
    assert main(["resume", str(run)]) == 3
    assert cwds(run) == [str(proj), str(elsewhere)]


def test_a_new_command_on_slurm_needs_its_script_in_the_frozen_copy(
    completed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On Slurm the job runs the script from code/script/, copied at the first submission:
    a script added since would fail in the job; refused before anything is submitted."""
    proj = completed.parents[1]
    (completed / "code" / "script").mkdir(parents=True)
    (completed / "code" / "script" / "where.py").write_text(WHERE)
    (proj / "added.py").write_text(WHERE)
    before = run_files(completed)
    capsys.readouterr()
    slurm = ["cluster=devcluster", "--no-preflight"]
    assert main(["resume", str(completed), *slurm, "--", "python", "added.py", "0"]) == 2
    assert capsys.readouterr().err == (
        f"error: added.py: not in {completed / 'code' / 'script'}, the copy of the script's "
        "folder made when the run was first submitted, which its jobs run; start a new run "
        "for it (hpcdl run ... -- COMMAND)\n"
    )
    assert run_files(completed) == before


def test_workdir_is_recorded_not_composed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train", "workdir=/tmp", "--no-launch"]) == 2
    assert capsys.readouterr().err == (
        "error: workdir: recorded when the run is created, the folder hpcdl runs in; cd to "
        "the folder the run should start in (hpcdl resume RUN_DIR workdir=FOLDER moves it)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_new_command_resumed_from_another_folder_runs_the_frozen_copy(
    completed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hpcdl resume RUN -- python where.py` typed elsewhere: its script path is the run's
    folder's, so a Slurm job runs the frozen copy of it; it ran the live file (the path was
    looked for in the current folder, not found, and stored relative), with a warning that
    said the frozen copy would run."""
    from hpcdl.launch.snapshot import freeze_script_files

    proj = completed.parents[1]
    slurm = ["cluster=rivanna_a100", "--no-preflight", "--dry-run"]
    capsys.readouterr()
    assert main(["resume", str(completed), *slurm, "--", "python", "where.py", "1"]) == 0
    out = capsys.readouterr().out
    program = out.split("# program")[1].splitlines()[1].strip()
    assert program == f"python {completed / 'code' / 'script' / 'where.py'} 1", out
    # Once frozen (the first submission), a script added since is refused, and taken with
    # --fresh-code, which copies the folder anew.
    freeze_script_files(completed / "code", ["python", "where.py"], str(proj))
    assert (completed / "code" / "SCRIPT").read_text() == f"{proj}\n"
    (proj / "added.py").write_text(WHERE)
    added = ["--", "python", "added.py", "0"]
    assert main(["resume", str(completed), *slurm, *added]) == 2
    assert "added.py: not in" in capsys.readouterr().err
    assert main(["resume", str(completed), *slurm, "--fresh-code", *added]) == 0
    out = capsys.readouterr().out
    assert f"changed since: {proj}/ (added.py added)" in out, out
    assert not (completed / "code.1").exists()


def test_hpcdl_train_keys_are_refused_when_resuming_a_script_run(
    completed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """optim.lr=0.5 was written to config.yaml and read by nothing (the program reads its
    own arguments), so the student thought the learning rate had changed."""
    before = run_files(completed)
    capsys.readouterr()
    assert main(["resume", str(completed), "optim.lr=0.5", "--", "python", "where.py", "0"]) == 2
    assert capsys.readouterr().err == (
        f"error: optim.lr: hpcdl train's key, unused by {completed}, an `hpcdl run` run (its "
        "program reads its own arguments): give its command again after --, e.g. hpcdl "
        f"resume {completed} -- python train.py --lr 0.5\n"
    )
    assert main(["resume", str(completed), "trainer.max_epochs=9"]) == 2
    assert run_files(completed) == before
