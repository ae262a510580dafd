"""`hpcdl status JOB_ID` on a machine where no Slurm answers (a laptop, a workstation
running cluster=local), or one whose Slurm keeps no accounting: one line and exit status 2,
not an UNKNOWN state that looks like an answer. Slurm's commands are stand-in scripts on PATH here."""

from __future__ import annotations

from pathlib import Path

from hpcdl.cli.compose import compose_config
from hpcdl.cli.main import main
from hpcdl.rundir import create_run_dir


def slurm_commands(tmp_path: Path, monkeypatch, **scripts: str) -> None:
    """PATH holds only these commands (squeue=..., sacct=...: shell script bodies)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))


FAILING = "echo 'fatal: Could not establish a configuration source' >&2; exit 1"


def test_a_job_id_without_slurm_on_path_is_one_line_naming_the_run_dir(
    tmp_path, monkeypatch, capsys
) -> None:
    slurm_commands(tmp_path, monkeypatch)
    assert main(["status", "4242"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == (
        "error: job 4242: Slurm's commands (squeue, sacct) are not on PATH here; for a run "
        "trained with cluster=local or debug (`local job <id>`), pass its run dir instead: "
        "hpcdl status RUN_DIR\n"
    )


def test_a_job_id_where_squeue_fails_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    slurm_commands(tmp_path, monkeypatch, squeue=FAILING, sacct=FAILING)
    assert main(["status", "4242"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: job 4242: squeue failed: no Slurm controller answers here; ")
    assert err.endswith("pass its run dir instead: hpcdl status RUN_DIR\n") and err.count("\n") == 1


def test_a_run_dir_and_an_answering_slurm_are_reported_as_before(
    tmp_path, monkeypatch, capsys
) -> None:
    run = create_run_dir(compose_config([f"run_dir={tmp_path / 'run'}"]))[1]
    run.record_submission("77", "devcluster", run.log_dir)
    slurm_commands(tmp_path, monkeypatch, squeue=FAILING, sacct=FAILING)
    # A run dir's report goes on without the scheduler (Job.status() polls it too), with a
    # warning and exit status 1: a script must not take it for an answer.
    assert main(["status", str(run.path)]) == 1
    out, err = capsys.readouterr()
    assert "state: UNKNOWN" in out and "source: none (squeue failed)" in out, out
    assert err.startswith("warning: Slurm does not answer here") and err.count("\n") == 1
    # A Slurm that answers: its state, exit status 0.
    slurm_commands(tmp_path, monkeypatch, squeue="echo '77|RUNNING|0:06|1:00:00|1|n1'")
    assert main(["status", "77"]) == 0
    out = capsys.readouterr().out
    assert "state: RUNNING" in out and "source: squeue" in out, out


def test_a_job_id_this_slurm_does_not_know_without_accounting_is_one_line(
    tmp_path, monkeypatch, capsys
) -> None:
    # A cluster=local run's `local job 4242` asked of a Slurm that answers but keeps no
    # accounting: was state UNKNOWN, exit status 0.
    slurm_commands(tmp_path, monkeypatch, squeue="exit 0", sacct=FAILING)
    assert main(["status", "4242"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == (
        "error: job 4242: not known to this Slurm (squeue does not list it; no accounting, "
        "sacct failed); for a run trained with cluster=local or debug (`local job <id>`), or "
        "a job that has ended, pass its run dir instead: hpcdl status RUN_DIR\n"
    )
    # With its run dir, a real job that left the queue is judged by it, as before.
    run = create_run_dir(compose_config([f"run_dir={tmp_path / 'run'}"]))[1]
    run.record_submission("4242", "devcluster", run.log_dir)
    run.append_attempt({"event": "start", "job_id": "4242"})
    run.append_attempt({"event": "end", "job_id": "4242", "reason": "completed"})
    assert main(["status", str(run.path)]) == 0
    out = capsys.readouterr().out
    assert "state: COMPLETED" in out and "source: run dir (not queued; no accounting)" in out


def test_a_failed_foreground_run_keeps_why_for_status(tmp_path, capsys) -> None:
    """cluster=debug prints to the terminal only: its end record said `failed` and nothing
    else, so `hpcdl status` (or Job.wait() in a later session) could not say why."""
    import contextlib
    import sys

    (tmp_path / "hk.py").write_text(
        "def after(event):\n"
        "    if event.global_step == 3:\n"
        "        raise ValueError('bad sample 17')\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        run = ["train", f"run_dir={tmp_path / 'r'}", "trainer.max_epochs=1"]
        with contextlib.suppress(ValueError):  # the in-process run's own traceback
            main([*run, "trainer.step_hooks=[hk:after]"])
    finally:
        sys.path.remove(str(tmp_path))
    capsys.readouterr()
    assert main(["status", str(tmp_path / "r")]) == 1
    assert "last_end: failed: ValueError: bad sample 17\n" in capsys.readouterr().out
