"""commands.log: the commands that changed a run, each under its own verb."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.conftest import run_hpcdl


def verbs(run: Path) -> list[str]:
    return [line.split(" ", 2)[1] for line in (run / "commands.log").read_text().splitlines()]


def test_a_resume_the_job_refused_leaves_no_line(tmp_path: Path) -> None:
    out = run_hpcdl("train", "run_dir=run", "trainer.max_epochs=1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    log = (tmp_path / "run" / "commands.log").read_bytes()
    out = run_hpcdl(
        "resume", "run", "model.hidden_sizes=[10]", "trainer.max_epochs=2", cwd=tmp_path
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "config.yaml: left as it was, without these overrides" in out.stdout
    assert (tmp_path / "run" / "commands.log").read_bytes() == log
    # A resume that is not refused is recorded.
    out = run_hpcdl("resume", "run", "trainer.max_epochs=2", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert verbs(tmp_path / "run") == ["train:", "resume:"]


def test_withdraw_takes_back_only_this_commands_own_last_line(tmp_path: Path, monkeypatch) -> None:
    from hpcdl.rundir import RunDir

    run = RunDir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["hpcdl", "resume", "run"])
    run.record_command("resume")
    before = (tmp_path / "commands.log").read_bytes()
    monkeypatch.setattr(sys, "argv", ["hpcdl", "resume", "run", "optim.lr=0.1"])
    run.withdraw_command("resume")  # not its line: kept
    assert (tmp_path / "commands.log").read_bytes() == before
    run.record_command("resume")
    run.withdraw_command("resume")
    assert (tmp_path / "commands.log").read_bytes() == before


def test_hpcdl_run_is_logged_as_run(tmp_path: Path) -> None:
    out = run_hpcdl(
        "run", "cluster=local", "run_dir=run", "--", sys.executable, "-c", "1", cwd=tmp_path
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert verbs(tmp_path / "run") == ["run:"]
