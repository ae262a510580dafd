"""`--fresh-code`: a Slurm run's (or sweep's) code frozen anew for its resume or rerun, the
old copy kept as code.N; refused, with the old copy put back, where it cannot be frozen;
a sweep's refused while a trial that shares it is queued or running. On the dev cluster:
tests/slurm/test_sweeps_slurm.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.errors import HpcdlError
from tests.conftest import run_hpcdl

NET = (
    "from torch import nn\n"
    "def build(input_shape, num_classes):\n"
    "    return nn.Linear(input_shape[0], num_classes)\n"
)
TRAIN = ["model=custom", "model.target=fresh_net:build"]


def frozen_run(tmp_path: Path, *extra: str) -> Path:
    """A Slurm run created (not submitted) with fresh_net frozen into its code/."""
    (tmp_path / "fresh_net.py").write_text(NET)
    out = run_hpcdl(
        "train", "cluster=rivanna_a100", *TRAIN, "run_dir=r", *extra, "--no-launch",
        "--no-preflight", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    # The plain sbatch route, by a path that works from here (slurm/... only from the checkout).
    script = Path(__file__).resolve().parents[1] / "slurm" / "train.sbatch"
    assert f"not launched; e.g. sbatch {script} {tmp_path / 'r'}\n" in out.stdout, out.stdout
    return tmp_path / "r"


def test_refreeze_takes_the_edit_and_keeps_the_old_copy(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from hpcdl.launch.fresh_code import refreeze
    from hpcdl.launch.snapshot import changed_since_frozen
    from hpcdl.rundir import RunDir, open_run_dir

    run = frozen_run(tmp_path)  # tmp_path is not on this process's sys.path: the module is
    cfg, run_dir = open_run_dir(run)  # frozen anew from where it was (no PYTHONPATH again)
    (tmp_path / "fresh_net.py").write_text(NET + "# fixed\n")
    assert changed_since_frozen(run / "code") == ["fresh_net"]
    fresh = refreeze(RunDir(run), [cfg])
    assert fresh is not None and fresh.aside == run / "code.1"
    assert (run / "code" / "fresh_net.py").read_text().endswith("# fixed\n")
    assert (run / "code.1" / "fresh_net.py").read_text() == NET
    assert (run / "code" / "hpcdl" / "trainer.py").is_file()
    assert changed_since_frozen(run / "code") == []
    assert fresh.line("the copy its jobs ran") == (
        f"--fresh-code: {run / 'code'} frozen anew from your code as it is now (the copy its "
        f"jobs ran until now is kept in {run / 'code.1'})"
    )
    assert refreeze(run_dir, [cfg]) is None  # nothing changed since: no code.2, said
    assert capsys.readouterr().out.endswith(
        f"--fresh-code: your code is the same as the copy in {run / 'code'} (hpcdl and your "
        "modules); nothing frozen anew\n"
    )
    assert not (run / "code.2").exists()
    (tmp_path / "fresh_net.py").write_text(NET + "# fixed again\n")
    second = refreeze(run_dir, [cfg])  # a later one: code.2, code.1 left as it is
    assert second is not None and second.aside == run / "code.2"
    second.undo()  # a submission refused after it: the copy before it is back
    assert not (run / "code.2").exists()
    assert (run / "code" / "fresh_net.py").read_text().endswith("# fixed\n")


def test_a_module_no_longer_importable_is_refused_with_the_old_copy_back(
    tmp_path: Path, monkeypatch
) -> None:
    from hpcdl.launch.fresh_code import refreeze
    from hpcdl.rundir import open_run_dir

    run = frozen_run(tmp_path)
    cfg, run_dir = open_run_dir(run)
    (tmp_path / "fresh_net.py").rename(tmp_path / "moved.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = sorted(p.name for p in run.iterdir())
    with pytest.raises(HpcdlError) as err:
        refreeze(run_dir, [cfg])
    assert str(err.value) == (
        f"--fresh-code: fresh_net is neither at {tmp_path / 'fresh_net.py'}, where it was "
        "frozen from, nor importable here; put it back there (or its folder on PYTHONPATH), "
        f"or go on without --fresh-code to run the copy in {run / 'code'}"
    )
    assert sorted(p.name for p in run.iterdir()) == before
    assert (run / "code" / "fresh_net.py").read_text() == NET


def test_a_script_runs_folder_is_recorded_compared_and_frozen_anew(tmp_path: Path) -> None:
    from hpcdl.config.schema import Config, ScriptConfig
    from hpcdl.launch.fresh_code import refreeze, unfrozen_commands
    from hpcdl.launch.snapshot import changed_since_frozen, freeze_script_files
    from hpcdl.rundir import RunDir

    proj = tmp_path / "proj"
    (proj / "util").mkdir(parents=True)
    (proj / "train.py").write_text("print('v1')\n")
    (proj / "util" / "__init__.py").write_text("")
    (proj / "notes").mkdir()  # no Python there: never copied, never compared
    (proj / "chemutils").mkdir()  # a namespace package (no __init__.py): its .py files
    (proj / "chemutils" / "feats.py").write_text("def featurize(x):\n    return x\n")
    (proj / "chemutils" / "data.csv").write_text("1,2\n")
    run = RunDir(tmp_path / "r")
    code = run.code_dir
    command = freeze_script_files(code, ["python", str(proj / "train.py"), "--lr", "0.1"])
    assert command == ["python", str(code / "script" / "train.py"), "--lr", "0.1"]
    assert (code / "SCRIPT").read_text() == f"{proj}\n"
    assert (code / "script" / "chemutils" / "feats.py").is_file()
    assert not (code / "script" / "chemutils" / "data.csv").exists()
    (code / "hpcdl").mkdir()  # as snapshot_code leaves it
    (proj / "notes" / "scratch.txt").write_text("x = 1\n")
    assert changed_since_frozen(code) == []
    (proj / "chemutils" / "feats.py").write_text("def featurize(x):\n    return 2 * x\n")
    assert changed_since_frozen(code) == [f"{proj}/ (chemutils/feats.py edited)"]
    (proj / "chemutils" / "feats.py").write_text("def featurize(x):\n    return x\n")
    (proj / "util" / "io.py").write_text("y = 2\n")
    assert changed_since_frozen(code) == [f"{proj}/ (util/io.py added)"]
    cfg = Config(script=ScriptConfig(command=command))
    assert unfrozen_commands(code, [cfg]) == [["python", str(proj / "train.py"), "--lr", "0.1"]]
    (proj / "train.py").write_text("print('v2')\n")
    fresh = refreeze(run, [cfg])
    assert fresh is not None
    assert (code / "script" / "train.py").read_text() == "print('v2')\n"
    assert (code / "script" / "util" / "io.py").is_file()
    assert (tmp_path / "r" / "code.1" / "script" / "train.py").read_text() == "print('v1')\n"
    (proj / "train.py").unlink()
    with pytest.raises(HpcdlError, match=r"^--fresh-code: .*/proj/train.py \(its script, copied"):
        refreeze(run, [cfg])
    assert (code / "script" / "train.py").read_text() == "print('v2')\n"
    assert not (tmp_path / "r" / "code.2").exists()


def test_a_sweeps_code_is_not_frozen_anew_while_a_trial_runs() -> None:
    from hpcdl.cli.fresh import refuse_busy_trials
    from hpcdl.sweep.ledger import Ledger, TrialRecord

    trials = [TrialRecord(i, [], f"/sw/{i}", state=s) for i, s in enumerate(
        ["COMPLETED", "FAILED", "RUNNING", "PENDING"])]  # fmt: skip
    ledger = Ledger("/sw", "devcluster", "slurm", ["optim.lr"], [], trials=trials)
    with pytest.raises(HpcdlError) as err:
        refuse_busy_trials(ledger)
    assert str(err.value) == (
        "--fresh-code: trials [2, 3] of /sw are PENDING/RUNNING and would load the new code "
        "when requeued (one trial trained by two codes); wait until they end (hpcdl sweep "
        "status /sw) or cancel them (hpcdl cancel /sw), then freeze it anew"
    )
    refuse_busy_trials(Ledger("/sw", "c", "slurm", [], [], trials=trials[:2]))  # none busy
    with pytest.raises(HpcdlError, match=r"trials \[3\] of"):
        refuse_busy_trials(ledger, but=2)  # the trial resumed by hand is its own check


def test_resume_dry_run_fresh_code_says_what_it_would_freeze(tmp_path: Path) -> None:
    run = frozen_run(tmp_path)
    env = {"PYTHONPATH": str(tmp_path)}
    resume = ["resume", "r", "--no-preflight", "--dry-run"]
    with (tmp_path / "fresh_net.py").open("a") as f:
        f.write("# fixed\n")
    warned = run_hpcdl(*resume, cwd=tmp_path, env=env)
    assert warned.returncode == 0, warned.stderr
    assert warned.stderr == (
        f"warning: fresh_net changed since {run / 'code'} was frozen; its job runs that "
        f"frozen copy, not your edits (to run your edits: hpcdl resume {run} --fresh-code)\n"
    )
    out = run_hpcdl(*resume, "--fresh-code", cwd=tmp_path, env=env)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert (
        f"# code: frozen anew into {run / 'code'}, the old copy moved to {run / 'code.1'}; "
        "changed since: fresh_net\n"
    ) in out.stdout
    assert not (run / "code.1").exists()  # a dry run moves nothing
    assert (run / "code" / "fresh_net.py").read_text() == NET
    (tmp_path / "fresh_net.py").write_text(NET)  # the edit undone: the same code again
    same = run_hpcdl(*resume, "--fresh-code", cwd=tmp_path, env=env)
    assert same.returncode == 0 and same.stderr == "", same.stderr
    assert (
        f"# code: your code is the same as the copy in {run / 'code'}; nothing frozen anew\n"
    ) in same.stdout


def test_fresh_code_on_a_local_run_says_there_is_nothing_to_freeze(tmp_path: Path) -> None:
    out = run_hpcdl("train", "run_dir=r", "trainer.max_epochs=1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    resumed = run_hpcdl("resume", "r", "trainer.max_epochs=2", "--fresh-code", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith(
        "--fresh-code: cluster=debug trains here, with your code as it is now; nothing is frozen\n"
    ), resumed.stdout
    assert "epoch 2/2" in resumed.stdout + resumed.stderr
    assert not (tmp_path / "r" / "code").exists()
