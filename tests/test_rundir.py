"""The run directory's owner (hpcdl.rundir), the atomic writer, step hooks, and run dirs
written by earlier versions."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from hpcdl.atomic import atomic_file, write_atomic
from hpcdl.errors import ConfigError
from hpcdl.rundir import RUN_DIR_LAYOUT, RunDir, SweepDir, open_run_dir
from hpcdl.step_sums import StepSums

REPO = Path(__file__).resolve().parents[1]
OLD_RUN = REPO / "tests" / "data" / "run_v0"  # written by hpcdl before RunDir existed


def documented_layout() -> list[tuple[str, str]]:
    text = (REPO / "docs" / "checkpoints.md").read_text()
    block = text.split("<!-- run-dir-layout")[1].split("<!-- end run-dir-layout -->")[0]
    rows = re.findall(r"^\| `([^`]+)` \| (.+) \|$", block, flags=re.M)
    return [(name, what.strip()) for name, what in rows]


def test_the_docs_table_is_the_layout_rundir_owns() -> None:
    assert documented_layout() == list(RUN_DIR_LAYOUT)


def test_the_layout_lists_every_name_rundir_uses() -> None:
    constants = {
        value
        for cls in (RunDir,)
        for key, value in vars(cls).items()
        if key.isupper() and isinstance(value, str) and key != "EVAL_METRICS"
    } | {RunDir.CODE, RunDir.CODE_ASIDE, RunDir.LOGS}
    listed = {name.split("/")[0] for name, _ in RUN_DIR_LAYOUT}
    assert constants == listed


def test_no_other_module_spells_a_run_dir_file_name() -> None:
    names = [n.rstrip("/") for n, _ in RUN_DIR_LAYOUT if "." in n or n == "checkpoints/"]
    names += [SweepDir.LEDGER, SweepDir.LOCK, RunDir.EVAL_METRICS]
    offenders = []
    for path in (REPO / "hpcdl").rglob("*.py"):
        if path.name == "rundir.py":
            continue
        text = path.read_text()
        offenders += [f"{path.name}: {n}" for n in names if f'"{n}"' in text or f"'{n}'" in text]
    assert offenders == []


def test_submission_history_and_attempts(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert run.read_submission() is None and run.read_attempts() == []
    run.record_submission("11", "devcluster", run.log_dir)
    run.record_submission("12", "rivanna_a100", tmp_path / "elsewhere")
    record = run.read_submission()
    assert record is not None and record["job_id"] == "12"
    assert [h["job_id"] for h in record["history"]] == ["11", "12"]
    assert run.rank_log("12", 3) == tmp_path / "elsewhere" / "12_3_log.out"
    run.append_attempt({"event": "start"})
    with open(tmp_path / RunDir.ATTEMPTS, "a") as f:
        f.write('{"event": "en')  # cut short by a kill
    assert run.read_attempts() == [{"event": "start"}]


def test_a_record_appended_after_a_cut_line_is_not_lost_with_it(tmp_path: Path) -> None:
    """A line cut short (a kill mid-write, a full disk) once swallowed the next record,
    appended onto it: the next attempt's start was lost from attempts.jsonl."""
    run = RunDir(tmp_path)
    run.append_attempt({"event": "start", "attempt": 1})
    with open(tmp_path / RunDir.ATTEMPTS, "a") as f:
        f.write('{"event": "en')  # the end record, cut short
    run.append_attempt({"event": "start", "attempt": 2})
    assert run.read_attempts() == [
        {"event": "start", "attempt": 1},
        {"event": "start", "attempt": 2},
    ]
    (tmp_path / RunDir.COMMANDS).write_text("2026-11-26T10:00:00 train: hpcdl tr")
    run.record_command("resume")
    run.withdraw_command("resume")  # takes back its own line only
    assert (tmp_path / RunDir.COMMANDS).read_text() == "2026-11-26T10:00:00 train: hpcdl tr\n"


def test_atomic_file_leaves_the_old_file_when_the_writer_fails(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    write_atomic(path, "old")
    with pytest.raises(RuntimeError), atomic_file(path) as f:
        f.write(b"half of the new")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]
    write_atomic(path, [b"new ", memoryview(b"file")])
    assert path.read_text() == "new file"


def test_step_sums_round_trip_by_name() -> None:
    packed = StepSums.pack(
        torch.device("cpu"),
        stats=[torch.tensor(3.0)],
        loss_sum=torch.tensor(2.5),
        num_samples=4.0,
        loss_count=torch.tensor(10.0),
        save_due=1.0,
    )
    assert packed.dtype == torch.float64 and packed.numel() == 7
    sums = StepSums.unpack(packed * 2)  # as if summed over two ranks
    assert (sums.loss_sum, sums.num_samples, sums.save_due, sums.num_stop) == (5.0, 8.0, 2.0, 0.0)
    assert sums.loss_count == 20.0 and sums.mean_loss == 0.25
    assert sums.stats == (6.0,) and not sums.nonfinite
    # One rank's NaN or inf makes the sum non-finite: every rank skips the step.
    for bad in (float("nan"), float("inf")):
        other = StepSums.pack(torch.device("cpu"), stats=[0.0], loss_sum=torch.tensor(bad))
        assert StepSums.unpack(packed + other).nonfinite
    with pytest.raises(TypeError, match="nope"):
        StepSums.pack(torch.device("cpu"), nope=1.0)


def test_a_step_hook_sees_every_step(hpcdl, tmp_path: Path) -> None:
    (tmp_path / "myhooks.py").write_text(
        "import json, os\n"
        "def record(event):\n"
        "    with open(os.environ['HOOK_LOG'], 'a') as f:\n"
        "        f.write(json.dumps([event.global_step, event.epoch, event.step_in_epoch]) + '\\n')\n"
    )
    log = tmp_path / "events.jsonl"
    env = {"PYTHONPATH": str(tmp_path), "HOOK_LOG": str(log)}
    out = hpcdl(
        "train",
        "run_dir=run",
        "trainer.max_epochs=2",
        "trainer.step_hooks=[myhooks:record]",
        env=env,
    )
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e[0] for e in events] == list(range(1, 27))  # 13 steps per epoch
    assert events[12] == [13, 0, 13] and events[13] == [14, 1, 1]


def test_a_step_hook_that_cannot_be_found_is_one_line(hpcdl, tmp_path: Path) -> None:
    out = hpcdl("train", "run_dir=bad", "trainer.step_hooks=[nosuchmod_xyz:f]")
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert "trainer.step_hooks[0]='nosuchmod_xyz:f': cannot import" in out.stderr
    out = hpcdl("train", "run_dir=bad2", "trainer.step_hooks=[no_colon]")
    assert out.returncode == 2 and "trainer.step_hooks[0]='no_colon'" in out.stderr
    assert not (tmp_path / "bad2").exists()  # refused before the run dir is made


def test_hook_names_are_checked_without_importing() -> None:
    from hpcdl.config.validate import check_target_form

    check_target_form("trainer.step_hooks[0]", "a.b:c")
    with pytest.raises(ConfigError, match=r"package\.module:name"):
        check_target_form("trainer.step_hooks[0]", "a.b.c")


@pytest.fixture
def old_run(tmp_path: Path) -> Path:
    run = tmp_path / "old"
    shutil.copytree(OLD_RUN, run)
    return run


def test_a_run_dir_from_before_rundir_still_shows_status(old_run: Path) -> None:
    from hpcdl.launch.monitor import run_status, state_from_run_dir

    _, run = open_run_dir(old_run)
    info = run_status(run)
    assert info["attempts"] == 2 and info["requeues"] == 1
    assert info["last_epoch"] == 2
    assert (
        info["weights_sha256"]
        == json.loads((old_run / "summary.json").read_text())["weights_sha256"]
    )
    assert state_from_run_dir(run) == "COMPLETED"


def test_a_run_dir_from_before_rundir_still_evaluates_and_resumes(hpcdl, old_run: Path) -> None:
    out = hpcdl("evaluate", str(old_run), "--checkpoint", "best")
    assert out.returncode == 0, out.stderr
    assert (old_run / "eval" / "best" / "metrics.json").exists()
    out = hpcdl("resume", str(old_run), "trainer.max_epochs=3")
    assert out.returncode == 0, out.stderr
    assert "resumed from" in out.stdout and "global step 26" in out.stdout
    summary = json.loads((old_run / "summary.json").read_text())
    assert summary["epochs"] == 3 and summary["steps"] == 39
    assert [r.split(",")[0] for r in (old_run / "metrics.csv").read_text().splitlines()] == [
        "epoch",
        "1",
        "2",
        "3",
    ]


def test_a_damaged_json_record_is_one_line_naming_it(tmp_path: Path, capsys) -> None:
    """Written atomically by hpcdl, so only an outside edit damages one: it was a
    JSONDecodeError traceback from hpcdl status."""
    from hpcdl.cli.main import main
    from hpcdl.errors import RunDirError

    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", "trainer.max_epochs=1"]) == 0
    (run / "slurm.json").write_text('{"job_id": "12", ')
    with pytest.raises(RunDirError, match=r"slurm.json: not valid JSON \(line 1\)"):
        RunDir(run).read_submission()
    (run / "slurm.json").unlink()
    (run / "summary.json").write_bytes(b"\xff\xfe")
    capsys.readouterr()
    assert main(["status", str(run)]) != 0
    err = capsys.readouterr().err
    assert err == (
        f"error: {run / 'summary.json'}: not valid JSON (its bytes); it was changed outside "
        "hpcdl: put back a copy or move it aside\n"
    )


def test_a_job_refused_as_busy_leaves_the_training_jobs_records_as_they_were(
    tmp_path: Path,
) -> None:
    from hpcdl.cli.compose import compose_config
    from hpcdl.rundir import create_run_dir

    run = create_run_dir(compose_config([f"run_dir={tmp_path / 'r'}"]))[1]
    run.append_attempt({"event": "start", "job_id": "12", "restart_count": 0})
    run.append_attempt({"event": "start", "job_id": "12", "restart_count": 1})  # requeued
    # A second job sbatch'ed on the run dir by hand while job 12 trains: refused (busy).
    run.append_attempt({"event": "start", "job_id": "14", "restart_count": 0})
    run.append_attempt({"event": "end", "job_id": "14", "reason": "busy", "action": "exit"})
    run.append_attempt({"event": "end", "job_id": "12", "reason": "timeout"})
    assert [(a["event"], a["job_id"]) for a in run.read_attempts()] == [
        ("start", "12"),
        ("start", "12"),
        ("end", "12"),
    ]
    assert run.requeues() == 1
    # Its start (no restart count) no longer counts as a new submission: job 12's
    # requeues still count against cluster.max_requeues.
    assert len(run.attempts_of_submission()) == 3
