"""`hpcdl resume RUN_DIR --from CHECKPOINT [--new-run-dir NEW_DIR]`: continue a run from a
checkpoint older than its newest, in place or in a new run dir, and end bit-identical to a
run that had stopped at that checkpoint and resumed. Refusals change nothing; the login
path reads and verifies the chosen checkpoint without torch."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from hpcdl.checkpoint_file import read_plain_entries
from hpcdl.config.schema import ScriptConfig
from hpcdl.errors import HpcdlError
from hpcdl.resume_from import choose
from hpcdl.rundir import open_run_dir
from hpcdl.runlock import hold
from tests.conftest import run_hpcdl, run_without_torch

# 256 samples: 180 training rows, 6 steps of 32 an epoch.
SMALL = ["data=synthetic", "data.num_samples=256", "data.shape=[8]", "data.num_workers=0"]
EPOCH_2 = "step_000000012.pt"
LATER = ["step_000000018.pt", "step_000000024.pt"]
NEW_LR = "optim.lr=0.05"


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 epochs, every checkpoint kept; each test works on a copy."""
    base = tmp_path_factory.mktemp("finished")
    out = run_hpcdl(
        "train", "run_dir=run", "trainer.max_epochs=4", "trainer.keep_last=9", *SMALL, cwd=base
    )
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (base / "run" / "checkpoints").glob("step_*")) == [
        "step_000000006.pt",
        EPOCH_2,
        *LATER,
    ]
    return base / "run"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run without --from: stopped after epoch 2, resumed with the new lr."""
    base = tmp_path_factory.mktemp("reference")
    args = ["trainer.max_epochs=2", "trainer.keep_last=9", *SMALL]
    assert run_hpcdl("train", "run_dir=run", *args, cwd=base).returncode == 0
    out = run_hpcdl("resume", "run", "trainer.max_epochs=4", NEW_LR, cwd=base)
    assert out.returncode == 0, out.stderr
    return base / "run"


@pytest.fixture
def run(finished: Path, tmp_path: Path) -> Path:
    shutil.copytree(finished, tmp_path / "run")
    return tmp_path / "run"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def weights(run_dir: Path) -> str:
    return json.loads((run_dir / "summary.json").read_text())["weights_sha256"]


def metric_rows(run_dir: Path) -> list[list[str]]:
    """metrics.csv without its timing columns (seconds, samples/s)."""
    lines = (run_dir / "metrics.csv").read_text().splitlines()
    return [line.split(",")[:-2] for line in lines]


def test_from_an_older_checkpoint_ends_as_a_run_that_stopped_there(
    run: Path, reference: Path
) -> None:
    history = (run / "metrics.csv").read_text()
    out = run_hpcdl("resume", "run", "--from", EPOCH_2, NEW_LR, cwd=run.parent)
    assert out.returncode == 0, out.stderr
    # The chosen checkpoint's place, said as the job says it (it was 'epoch 2, global
    # step 12' beside the job's 'epoch 3, step 0 of the epoch').
    where = "(epoch 3, step 0 of the epoch, global step 12)"
    assert f"--from {EPOCH_2} {where}: " in out.stdout, out.stdout
    assert f"resumed from {run}/checkpoints/{EPOCH_2} {where}" in out.stdout
    assert weights(run) == weights(reference)
    assert metric_rows(run) == metric_rows(reference)
    # Nothing deleted: the later checkpoints and the records of their epochs are aside.
    aside = run / "checkpoints.set-aside-1"
    assert f"moved to {aside}" in out.stdout
    assert {*LATER, "metrics.csv", "summary.json", "checkpoint.json"} <= {
        p.name for p in aside.iterdir()
    }
    assert (aside / "metrics.csv").read_text() == history
    assert json.loads((aside / "checkpoint.json").read_text())["checkpoint"] == LATER[-1]


def test_the_login_node_sets_the_records_back_to_the_chosen_checkpoint(
    run: Path, tmp_path: Path
) -> None:
    """Before any launch (a Slurm job may wait in the queue): metrics.csv cut back, and
    checkpoint.json describing the chosen checkpoint, so that the login node's 'nothing to
    train' and split checks read the point the run goes on from. Without torch."""
    code = f"""
from hpcdl.resume_from import choose
from hpcdl.rundir import open_run_dir
cfg, run_dir = open_run_dir({str(run)!r})
chosen = choose(cfg, run_dir, {EPOCH_2!r}, from_scratch=False, new_run_dir=None)
assert chosen.nothing_to_train(cfg) is None
chosen.continue_in_place()
"""
    run_without_torch(code, cwd=tmp_path)
    record = json.loads((run / "checkpoint.json").read_text())
    assert record["checkpoint"] == EPOCH_2
    assert record["progress"]["epoch"] == 2 and record["progress"]["global_step"] == 12
    assert [row[0] for row in metric_rows(run)] == ["epoch", "1", "2"]
    assert not (run / "summary.json").exists()
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*"))[-1] == EPOCH_2


def test_the_checkpoint_a_run_goes_on_from_stays_on_record(run: Path, tmp_path: Path) -> None:
    """A branch's only trace of its origin was the command line in commands.log (paths as
    typed, relative to some folder); a run continued in place had none beside the
    set-aside folder. Now attempts.jsonl says which run dir and checkpoint (its checksum)."""
    from hpcdl.checkpoint_file import stored_checksum

    checksum = stored_checksum(run / "checkpoints" / EPOCH_2)[0].hex()
    code = f"""
from hpcdl.resume_from import choose
from hpcdl.rundir import open_run_dir
cfg, run_dir = open_run_dir({str(run)!r})
choose(cfg, run_dir, "12", from_scratch=False, new_run_dir={str(tmp_path / "b")!r}).branch(cfg)
choose(cfg, run_dir, "12", from_scratch=False, new_run_dir=None).continue_in_place()
"""
    run_without_torch(code, cwd=tmp_path)
    expected = {
        "event": "from_checkpoint",
        "checkpoint": EPOCH_2,
        "global_step": 12,
        "epoch": 2,
        "step_in_epoch": 0,
        "checksum": checksum,
    }
    branched = json.loads((tmp_path / "b" / "attempts.jsonl").read_text().splitlines()[-1])
    assert branched.items() >= {**expected, "run_dir": str(run.resolve())}.items()
    in_place = json.loads((run / "attempts.jsonl").read_text().splitlines()[-1])
    assert in_place.items() >= {
        **expected,
        "run_dir": str(run),
        "set_aside": "checkpoints.set-aside-1",
    }.items()


def test_ctrl_c_while_a_branch_is_copied_leaves_no_hidden_copy(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The staging folder (.NEW_DIR.tmp-PID, holding a copy of the checkpoint: gigabytes
    for a large model) was removed on an OSError only, and stayed after a Ctrl-C."""
    import hpcdl.resume_from as resume_from

    def interrupted(source: Path, path: Path) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(resume_from, "copy_atomic", interrupted)
    cfg, run_dir = open_run_dir(run)
    before = sorted(p.name for p in run.parent.iterdir())
    chosen = choose(cfg, run_dir, EPOCH_2, from_scratch=False, new_run_dir=str(tmp_path / "b"))
    with pytest.raises(KeyboardInterrupt):
        chosen.branch(cfg)
    assert sorted(p.name for p in run.parent.iterdir()) == before


def test_copies_left_by_killed_branch_commands_are_removed_by_the_next_branch(
    run: Path, tmp_path: Path, capsys
) -> None:
    """A branch command SIGKILLed while it copied left .NEW_DIR.tmp-PID (a checkpoint's
    copy) for ever. The next branch to that name removes such a copy once its pid is not a
    process here and it has not changed for 10 minutes; a younger one, or one whose pid is
    running, is left alone (its command may still be copying, here or on another node)."""
    import os

    target = tmp_path / "b"
    dead = _a_dead_pid()
    stale, young, alive = (tmp_path / f".b.tmp-{pid}" for pid in (dead, dead + 1, os.getppid()))
    for folder in (stale, young, alive):
        folder.mkdir()
        (folder / "step_000000012.pt").write_bytes(b"partial copy")
    old = os.stat(stale).st_mtime - 3600
    for path in (stale, stale / "step_000000012.pt", alive, alive / "step_000000012.pt"):
        os.utime(path, (old, old))
    cfg, run_dir = open_run_dir(run)
    chosen = choose(cfg, run_dir, EPOCH_2, from_scratch=False, new_run_dir=str(target))
    chosen.branch(cfg)
    assert not stale.exists() and young.exists() and alive.exists()
    assert f"--new-run-dir: removed {stale}, left by an interrupted copy" in capsys.readouterr().out
    assert (target / "config.yaml").is_file()


def _a_dead_pid() -> int:
    """Two pids in a row that are no process here (a finished child's, and the next)."""
    import subprocess

    for _ in range(100):
        child = subprocess.Popen(["true"])
        child.wait()  # (not os.waitpid: where SIGCHLD is ignored, children are reaped unasked)
        if not any(Path(f"/proc/{p}").exists() for p in (child.pid, child.pid + 1)):
            return child.pid
    raise AssertionError("no free pid pair found")


def test_a_branch_leaves_the_run_as_it_was(run: Path, reference: Path) -> None:
    before = snapshot(run)
    out = run_hpcdl(
        "resume", "run", "--from", EPOCH_2, "--new-run-dir", "lr05", NEW_LR, cwd=run.parent
    )
    assert out.returncode == 0, out.stderr
    branch = run.parent / "lr05"
    assert f"resumed from {branch}/checkpoints/{EPOCH_2}" in out.stdout
    assert snapshot(run) == before
    assert weights(branch) == weights(reference)
    assert metric_rows(branch) == metric_rows(reference)
    assert f"run_dir: {branch}" in (branch / "config.yaml").read_text()
    assert "lr: 0.05" in (branch / "config.yaml").read_text()
    # Never overwritten: the same command again is refused, and changes nothing.
    both = snapshot(run), snapshot(branch)
    again = run_hpcdl("resume", "run", "--from", EPOCH_2, "--new-run-dir", "lr05", cwd=run.parent)
    assert again.returncode == 2
    assert again.stderr.startswith("error: --new-run-dir lr05:")
    assert "already exists" in again.stderr
    assert (snapshot(run), snapshot(branch)) == both


def test_a_branch_takes_the_runs_best_checkpoint_from_before_its_point(run: Path) -> None:
    """The run's best.pt, saved before the checkpoint a branch goes on from, is its best
    too: it was not copied, so a branch that never beat it had none (evaluate, predict and
    load_model refused it) while its summary named a best epoch."""
    stalled = ["trainer.max_epochs=5", "optim.lr=1e-12"]  # the weights do not move: no new best
    out = run_hpcdl(
        "resume", "run", "--from", LATER[-1], "--new-run-dir", "b", *stalled, cwd=run.parent
    )
    assert out.returncode == 0, out.stderr
    best = run.parent / "b" / "checkpoints" / "best.pt"
    assert best.read_bytes() == (run / "checkpoints" / "best.pt").read_bytes()
    summary = json.loads((run.parent / "b" / "summary.json").read_text())
    assert summary["best_epoch"] == json.loads((run / "summary.json").read_text())["best_epoch"]
    assert run_hpcdl("evaluate", "b", cwd=run.parent).returncode == 0
    # From before the run's best: not taken, and said so.
    step = read_plain_entries(run / "checkpoints" / "best.pt")["progress"]["global_step"]
    older = sorted(p.name for p in (run / "checkpoints").glob("step_*.pt"))[0]
    assert int(older[5:14]) < step, (older, step)
    out = run_hpcdl("resume", "run", "--from", older, "--new-run-dir", "c", cwd=run.parent)
    assert out.returncode == 0, out.stderr
    assert f"--new-run-dir: {run / 'checkpoints' / 'best.pt'} was saved after {older}" in out.stdout


def test_a_branch_that_trained_then_stopped_on_bad_input_is_kept(run: Path) -> None:
    """Exit status 2 after an epoch of training (non-finite losses, a bad sample) is no
    refusal: the branch was removed "as nothing was trained in it", its metrics with it."""
    (run.parent / "stopper.py").write_text(
        "from hpcdl.errors import DataError\n\n"
        "def after_step(event):\n"
        "    if event.global_step == 20:\n"
        "        raise DataError('shard 7: a sample of another shape')\n"
    )
    out = run_hpcdl(
        "resume", "run", "--from", EPOCH_2, "--new-run-dir", "b", "trainer.max_epochs=4",
        "trainer.step_hooks=[stopper:after_step]", cwd=run.parent,
        env={"PYTHONPATH": str(run.parent)},
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert "removed" not in out.stdout and "shard 7" in out.stderr
    branch = run.parent / "b"
    assert (branch / "checkpoints" / "step_000000018.pt").is_file()  # epoch 3, trained here
    assert "step_hooks" in (branch / "config.yaml").read_text()  # as it was trained


def test_a_branch_its_job_refuses_is_removed_so_the_command_can_be_fixed(run: Path) -> None:
    """The job refuses a checkpoint that does not fit the overrides (another model here):
    NEW_DIR was left behind with the run's config, without the overrides, and the same
    command with the value fixed said "already exists"."""
    before = snapshot(run)
    branch = ["resume", "run", "--from", EPOCH_2, "--new-run-dir", "b"]
    out = run_hpcdl(*branch, "model.hidden_sizes=[16]", "trainer.max_epochs=3", cwd=run.parent)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.count("error:") == 1 and "model.hidden_sizes" in out.stderr, out.stderr
    assert f"--new-run-dir {run.parent / 'b'}: removed" in out.stdout
    assert not (run.parent / "b").exists()
    assert snapshot(run) == before
    out = run_hpcdl(*branch, "trainer.max_epochs=3", cwd=run.parent)
    assert out.returncode == 0, out.stderr
    assert "epoch 3/3" in out.stdout and snapshot(run) == before


def test_from_best_continues_from_the_step_it_was_saved_at(run: Path) -> None:
    """best.pt holds the whole training state (a copy of its step file): with its step
    file purged, the job gets it back under that name and finds it as the newest."""
    from hpcdl.checkpoint_file import read_plain_entries

    step = read_plain_entries(run / "checkpoints" / "best.pt")["progress"]["global_step"]
    step_file = run / "checkpoints" / f"step_{step:09d}.pt"
    step_file.unlink()
    out = run_hpcdl("resume", "run", "--from", "best", "trainer.max_epochs=5", cwd=run.parent)
    assert out.returncode == 0, out.stderr
    assert f"resumed from {step_file} " in out.stdout
    later = [p.name for p in (run / "checkpoints.set-aside-1").glob("step_*")]
    assert all(int(name[5:14]) > step for name in later)


def test_the_newest_checkpoint_of_a_finished_run_has_nothing_to_train(run: Path) -> None:
    before = snapshot(run)
    out = run_hpcdl("resume", "run", "--from", LATER[-1], cwd=run.parent)
    assert out.returncode == 0, out.stderr
    assert "trainer.max_epochs=4: nothing to train" in out.stdout
    assert snapshot(run) == before


def flip_a_byte_in_the_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def weights_only_best(run: Path) -> None:
    from hpcdl.checkpoint import CheckpointStore, read_checkpoint

    state = read_checkpoint(run / "checkpoints" / "best.pt")
    store = CheckpointStore(run / "weights")
    (run / "checkpoints" / "best.pt").unlink()
    store.save({"model": state["model"]}, 1, is_best=True)
    (run / "weights" / "best.pt").rename(run / "checkpoints" / "best.pt")
    shutil.rmtree(run / "weights")


@pytest.mark.parametrize(
    "args, prepare, expected",
    [
        (["--from", "step_000000013.pt"], None, "no such checkpoint in"),
        (["--from", "epoch2"], None, "step_000000006.pt, step_000000012.pt, step_000000018"),
        (["--from", EPOCH_2, "--from-scratch"], None, "--from and --from-scratch: give one"),
        (["--new-run-dir", "b"], None, "--new-run-dir: give the checkpoint to continue from"),
        (["--from", "../other/checkpoints/best.pt"], None, "for another run's weights"),
        (["--from", EPOCH_2], "damaged", "checksum mismatch: the file is corrupt; choose another"),
        (["--from", "best"], "weights_only", "holds the model's weights only"),
        (["--from", EPOCH_2], "held", "is being trained by"),
        # A DCP folder (persona, FSDP: "no such checkpoint", the folder right there).
        (["--from", "step_000000030"], "folder", "a folder of your program's, not one of"),
    ],
)
def test_refusals_are_one_line_and_change_nothing(
    run: Path, args: list[str], prepare: str | None, expected: str
) -> None:
    if prepare == "damaged":
        flip_a_byte_in_the_middle(run / "checkpoints" / EPOCH_2)
    elif prepare == "weights_only":
        weights_only_best(run)
    elif prepare == "folder":
        (run / "checkpoints" / "step_000000030").mkdir()
        (run / "checkpoints" / "step_000000030" / ".metadata").write_bytes(b"dcp")
    before = snapshot(run)
    if prepare == "held":
        _, run_dir = open_run_dir(run)
        with hold(run_dir):
            before = snapshot(run)
            out = run_hpcdl("resume", "run", *args, cwd=run.parent)
    else:
        out = run_hpcdl("resume", "run", *args, cwd=run.parent)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: ")
    assert expected in out.stderr
    assert snapshot(run) == before
    assert not (run.parent / "b").exists()


def test_a_long_list_of_checkpoints_is_shortened(run: Path) -> None:
    for step in (30, 36, 42):
        shutil.copy(run / "checkpoints" / EPOCH_2, run / "checkpoints" / f"step_{step:09d}.pt")
    out = run_hpcdl("resume", "run", "--from", "nope", cwd=run.parent)
    assert out.returncode == 2
    assert (
        "the checkpoints there: step_000000006.pt, step_000000012.pt, (2 more), "
        "step_000000030.pt, step_000000036.pt, step_000000042.pt, best" in out.stderr
    )


def test_a_script_run_continues_in_place_but_is_not_branched(run: Path) -> None:
    """`hpcdl run` programs save with hpcdl.api.checkpoint_store, into the same
    checkpoints folder: --from sets the later ones aside, the program's load_latest()
    finds the chosen one. Its other files in the run dir are its own: no branch."""
    cfg, run_dir = open_run_dir(run)
    script = replace(cfg, script=ScriptConfig(command=["python", "train.py"]))
    with pytest.raises(HpcdlError, match="is an `hpcdl run` run"):
        choose(script, run_dir, EPOCH_2, from_scratch=False, new_run_dir=str(run.parent / "b"))
    # A checkpoint it does not have: named as such (its advice named that one to use).
    with pytest.raises(HpcdlError, match=r"step_000000025\.pt: no such checkpoint in"):
        choose(script, run_dir, "step_000000025.pt", from_scratch=False, new_run_dir="b")
    chosen = choose(script, run_dir, EPOCH_2, from_scratch=False, new_run_dir=None)
    assert chosen.step == 12
    with hold(run_dir):
        chosen.continue_in_place()
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == [
        "step_000000006.pt",
        EPOCH_2,
    ]


def test_a_script_runs_metrics_file_is_set_aside_with_the_checkpoints(run: Path) -> None:
    """The program's metrics_file describes the epochs set aside: it goes with them, on
    --from and on --from-scratch; one outside the run dir is the user's and stays."""
    from hpcdl.rundir import program_records

    cfg, run_dir = open_run_dir(run)
    command = ["python", "train.py"]
    script = replace(cfg, script=ScriptConfig(command=command, metrics_file="result.json"))
    (run / "result.json").write_text('{"acc": 0.9}')
    chosen = choose(script, run_dir, EPOCH_2, from_scratch=False, new_run_dir=None)
    with hold(run_dir):
        chosen.continue_in_place(program_records(script, run_dir))
    assert not (run / "result.json").exists()
    assert (run / "checkpoints.set-aside-1" / "result.json").read_text() == '{"acc": 0.9}'

    (run / "result.json").write_text('{"acc": 0.8}')
    aside = run_dir.set_aside_checkpoints(program_records(script, run_dir))
    assert aside == run / "checkpoints.set-aside-2"
    assert (aside / "result.json").read_text() == '{"acc": 0.8}'
    outside = run.parent / "mine.json"
    outside.write_text("{}")
    elsewhere = replace(script, script=replace(script.script, metrics_file=str(outside)))
    assert program_records(elsewhere, run_dir) == ()


# ----------------------------------------------------------------------------- --dry-run
DRY_END = "# dry run: nothing submitted, nothing written"


def test_a_dry_run_says_where_the_resume_goes_on_and_what_changes_and_writes_nothing(
    run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcdl.cli.main import main

    before = snapshot(run)
    monkeypatch.chdir(run.parent)
    assert main(["resume", "run", "trainer.max_epochs=6", NEW_LR, "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"# run dir: {run}",
        "# goes on from: step_000000024.pt (epoch 5, step 0 of the epoch, global step 24)",
        "# config.yaml: these keys change",
        "  optim.lr: 0.01 -> 0.05",
        "  trainer.max_epochs: 4 -> 6",
        "# trains here, in the foreground: cluster=debug, 1 rank",
        DRY_END,
    ]
    assert main(["resume", "run", "--from", EPOCH_2, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (
        "# goes on from: step_000000012.pt (epoch 3, step 0 of the epoch, global step 12), "
        "--from; 2 later checkpoints would move aside\n"
    ) in out
    assert "# config.yaml: unchanged\n" in out
    assert main(["resume", "run", "--from", EPOCH_2, "--new-run-dir", "b", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# new run dir (not created): {run.parent / 'b'}, from {run}\n")
    assert "move aside" not in out and not (run.parent / "b").exists()
    assert main(["resume", "run", "--from-scratch", "--dry-run"]) == 0
    assert "# goes on from: epoch 1, --from-scratch (its checkpoints would move aside)\n" in (
        capsys.readouterr().out
    )
    assert snapshot(run) == before  # config.yaml, commands.log, checkpoints: as they were


def test_a_dry_run_ends_with_the_refusal_the_resume_would_meet(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpcdl.cli.main import main

    with hold(open_run_dir(run)[1]):  # a writer training it now
        assert main(["resume", str(run), "trainer.max_epochs=6", "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert out.endswith(DRY_END + "\n") and f"error: {run} is being trained by pid" in err
    for step_file in (run / "checkpoints").glob("step_*"):
        step_file.unlink()
    assert main(["resume", str(run), "trainer.max_epochs=6", "--dry-run"]) == 2
    assert "holds no checkpoint to continue from" in capsys.readouterr().err


def test_a_dry_run_on_a_slurm_profile_prints_the_job_without_torch(run: Path) -> None:
    code = (
        "from hpcdl.cli.main import main\n"
        "args = ['resume', 'run', 'cluster=devcluster', 'trainer.max_epochs=6']\n"
        "assert main([*args, '--no-preflight', '--dry-run']) == 0\n"
    )
    out = run_without_torch(code, cwd=run.parent).stdout
    assert "  cluster.launcher: debug -> slurm\n" in out and "#SBATCH --time=10\n" in out
    assert f"#SBATCH --output={run}/logs/%j_0_log.out\n" in out
    assert out.endswith(f"# preflight: skipped (--no-preflight)\n{DRY_END}\n")
