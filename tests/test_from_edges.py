"""Edges of `hpcdl resume --from` and `--from-scratch`, and of the records a run keeps:
a --new-run-dir nested with the run dir is refused, `hpcdl evaluate` results of the
checkpoints set aside move with them, a local sweep's own resume of a trial is recorded as
the sweep's, and Ctrl-C before training starts ends as an interruption."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_hpcdl

# 256 samples: 180 training rows, 6 steps of 32 an epoch.
SMALL = ["data=synthetic", "data.num_samples=256", "data.shape=[8]", "data.num_workers=0"]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 epochs, every checkpoint kept, best.pt (epoch 3's) and epoch 1's evaluated."""
    base = tmp_path_factory.mktemp("evaluated")
    args = ["run_dir=run", "trainer.max_epochs=3", "trainer.keep_last=9", *SMALL]
    out = run_hpcdl("train", *args, cwd=base)
    assert out.returncode == 0, out.stderr
    for checkpoint in ("best", "step_000000006.pt"):
        out = run_hpcdl("evaluate", "run", "--checkpoint", checkpoint, cwd=base)
        assert out.returncode == 0, out.stderr
    run = base / "run"
    best, newest = run / "checkpoints" / "best.pt", run / "checkpoints" / "step_000000018.pt"
    assert best.read_bytes() == newest.read_bytes()  # set aside by --from 12
    assert json.loads((run / "eval" / "best" / "metrics.json").read_text())["checkpoint"] == str(
        best
    )
    return run


@pytest.fixture
def run(evaluated: Path, tmp_path: Path) -> Path:
    shutil.copytree(evaluated, tmp_path / "run")
    for report in (tmp_path / "run" / "eval").glob("*/metrics.json"):  # as evaluated here
        value = json.loads(report.read_text())
        value["checkpoint"] = value["checkpoint"].replace(str(evaluated), str(tmp_path / "run"))
        report.write_text(json.dumps(value))
    return tmp_path / "run"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "new_run_dir, where",
    [("run/sub", "is inside"), ("run/a/b", "is inside"), ("run", "is"), (".", "holds")],
)
def test_a_new_run_dir_nested_with_the_run_dir_is_refused(
    run: Path, new_run_dir: str, where: str
) -> None:
    """The run dir stays byte for byte as it was: a branch inside it (or around it, or
    the run dir itself) would change it."""
    before, beside = snapshot(run), sorted(p.name for p in run.parent.iterdir())
    out = run_hpcdl("resume", "run", "--from", "12", "--new-run-dir", new_run_dir, cwd=run.parent)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.count("\n") == 1
    target = (run.parent / new_run_dir).resolve()
    assert out.stderr.startswith(
        f"error: --new-run-dir {new_run_dir}: {target} {where} the run dir {run}, "
    )
    assert snapshot(run) == before
    assert sorted(p.name for p in run.parent.iterdir()) == beside


def test_from_sets_aside_the_evaluations_of_the_checkpoints_it_sets_aside(run: Path) -> None:
    """eval/best/ named checkpoints/best.pt, epoch 3's, which --from 12 moves aside (the run
    writes a new best.pt): it moves with it. Epoch 1's evaluation still names its file."""
    best_eval = snapshot(run / "eval" / "best")
    out = run_hpcdl("resume", "run", "--from", "12", cwd=run.parent)
    assert out.returncode == 0, out.stdout + out.stderr
    aside = run / "checkpoints.set-aside-1"
    assert "best.pt" in {p.name for p in aside.iterdir()}
    assert snapshot(aside / "eval" / "best") == best_eval
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["step_000000006"]


def test_from_scratch_sets_aside_the_evaluations_with_the_checkpoints(run: Path) -> None:
    evaluations = snapshot(run / "eval")
    out = run_hpcdl("resume", "run", "--from-scratch", "trainer.max_epochs=1", cwd=run.parent)
    assert out.returncode == 0, out.stdout + out.stderr
    aside = run / "checkpoints.set-aside-1"
    assert f"its checkpoints moved to {aside}" in out.stdout
    assert snapshot(aside / "eval") == evaluations
    assert not (run / "eval").exists()


def test_from_scratch_sets_aside_the_evaluations_of_checkpoints_already_gone(
    run: Path,
) -> None:
    shutil.rmtree(run / "checkpoints")
    evaluations = snapshot(run / "eval")
    out = run_hpcdl("resume", "run", "--from-scratch", "trainer.max_epochs=1", cwd=run.parent)
    assert out.returncode == 0, out.stdout + out.stderr
    assert snapshot(run / "checkpoints.set-aside-1" / "eval") == evaluations
    assert not (run / "eval").exists()


def test_a_local_sweeps_own_resume_of_a_trial_is_recorded_as_the_sweeps(tmp_path: Path) -> None:
    """The pool starts each trial with `hpcdl resume`, which the user never typed:
    commands.log says `sweep: trial N of SWEEP_DIR`. A resume by hand stays `resume:`."""
    sweep = ["cluster=debug", "trainer.max_epochs=1", *SMALL, "optim.lr=choice(0.01)"]
    out = run_hpcdl("train", "-m", *sweep, "hydra.sweep.dir=sw", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    trial = tmp_path / "sw" / "0"
    lines = [line.split(" ", 1)[1] for line in (trial / "commands.log").read_text().splitlines()]
    assert [line.split(" ")[0] for line in lines] == ["train:", "sweep:"]
    assert lines[1] == f"sweep: trial 0 of {tmp_path / 'sw'}"
    out = run_hpcdl("resume", "sw/0", "trainer.max_epochs=2", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    last = (trial / "commands.log").read_text().splitlines()[-1].split(" ", 1)[1]
    assert last.startswith("resume: ") and last.endswith(" resume sw/0 trainer.max_epochs=2")
