"""The Python API's `hpcdl run`: submit_program and submit_program_sweep on cluster=local,
in the command's words (commands.log) and with its one-line refusals, nothing created."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl import JobFailedError, submit_program, submit_program_sweep
from hpcdl.errors import HpcdlError

FIT = (
    "import argparse, json, os, sys\n"
    "ap = argparse.ArgumentParser(); ap.add_argument('--lr', type=float); a = ap.parse_args()\n"
    "if a.lr < 0: sys.exit('lr must be positive')\n"
    "path = os.path.join(os.environ['HPCDL_RUN_DIR'], 'm.json')\n"
    "json.dump({'loss': round(abs(a.lr - 0.3), 6)}, open(path, 'w'))\n"
)


def test_submit_program_runs_the_program_and_records_the_command(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fit.py").write_text(FIT)
    given = ["cluster=local", "cluster.tasks_per_node=1", "metrics_file=m.json", "run_dir=r"]
    job = submit_program(["python", "fit.py", "--lr", "0.1"], given)
    assert job.run_dir == tmp_path / "r" and job.exit_code == 0
    summary = job.wait()
    assert (summary["outcome"], summary["loss"]) == ("completed", 0.2)
    # The program's metrics in its status, not a trained model's (test_*, weights) keys.
    status = job.status()
    assert status["metrics"] == {"loss": 0.2}, status
    assert "test_metrics" not in status and "weights_sha256" not in status
    log = (tmp_path / "r" / "commands.log").read_text()
    assert log.rstrip().endswith(
        "run: hpcdl run cluster=local cluster.tasks_per_node=1 metrics_file=m.json run_dir=r "
        "-- python fit.py --lr 0.1"
    ), log

    failed = submit_program(["python", "fit.py", "--lr=-1"], [*given[:3], "run_dir=bad"])
    with pytest.raises(JobFailedError) as raised:
        failed.wait()
    assert raised.value.state == "FAILED"
    again = failed.resume(command=["python", "fit.py", "--lr", "0.5"])  # -- COMMAND...
    assert again == failed and again.wait()["loss"] == 0.2
    assert (tmp_path / "bad" / "commands.log").read_text().rstrip().endswith(
        f"resume: hpcdl resume {tmp_path / 'bad'} -- python fit.py --lr 0.5"
    )
    with pytest.raises(HpcdlError, match=r"^command='python fit\.py': give the program as"):
        failed.resume(command="python fit.py")


def test_submit_program_sweep_runs_one_trial_per_value(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fit.py").write_text(FIT)
    given = ["cluster=local", "cluster.tasks_per_node=1", "metrics_file=m.json"]
    command = ["python", "fit.py", "--lr={0.1,0.25,0.9}"]
    with pytest.warns(UserWarning, match="trials all run in"):  # no $HPCDL_RUN_DIR in it
        sweep = submit_program_sweep(command, [*given, "hydra.sweep.dir=sw"])
    assert [t["state"] for t in sweep.wait()] == ["COMPLETED"] * 3
    ranked = sweep.summary()
    assert [e["overrides"] for e in ranked] == ["--lr=0.25", "--lr=0.1", "--lr=0.9"]
    assert {e["metric"] for e in ranked} == {"loss"}


@pytest.mark.parametrize(
    ("command", "overrides", "message"),
    [
        ("python fit.py", [], r"^command='python fit\.py': give the program as a list of words"),
        ([], ["cluster=local"], r"give command=\['python', 'train\.py', \.\.\.\] .* not neither$"),
        (["python", "fit.py"], ["entry=m:f"], r"not both$"),
        (["python", 3], [], r"^command=\['python', 3.*\]: each word must be a string$"),
        (["python", "fti.py"], [], r"^fti\.py: no such script"),
        (["python", "fit.py"], ["trainer.max_epochs=3"], r"hpcdl train's key, unused by hpcdl run"),
        (["python", "fit.py"], "cluster=local", r"give a list of strings"),
    ],
)
def test_bad_input_is_one_line_and_creates_nothing(
    tmp_path, monkeypatch, command, overrides, message
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fit.py").write_text(FIT)
    swept = [*command, "--seed={1,2}"] if isinstance(command, list) and command else command
    for call, words in ((submit_program, command), (submit_program_sweep, swept)):
        with pytest.raises(HpcdlError, match=message) as refused:
            call(words, overrides)
        assert "\n" not in str(refused.value)
    with pytest.raises(HpcdlError, match=r"^submit_program_sweep: no list in the command"):
        submit_program_sweep(["python", "fit.py", "--lr=0.1"], ["cluster=local"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fit.py"]


def test_a_function_entry_runs_with_its_keyword_arguments(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "mylab_entry.py").write_text(
        "import json, os\n"
        "def main(lr=0.0):\n"
        "    path = os.path.join(os.environ['HPCDL_RUN_DIR'], 'm.json')\n"
        "    json.dump({'lr_seen': lr}, open(path, 'w'))\n"
    )
    job = submit_program(
        overrides=[
            "cluster=local",
            "cluster.tasks_per_node=1",
            "entry=mylab_entry:main",
            "entry.kwargs.lr=0.5",
            "metrics_file=m.json",
            "run_dir=e",
        ]
    )
    assert job.wait()["lr_seen"] == 0.5


def test_a_failed_jobs_error_names_the_cause_and_the_failing_ranks_log(tmp_path, monkeypatch):
    """JobFailedError named rank 0's log and no cause when rank 1 failed (persona, FSDP)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "two.py").write_text(
        "import os, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    raise ValueError('bad batch on rank 1')\n"
        "time.sleep(60)\n"
    )
    job = submit_program(
        ["python", "two.py"], ["cluster=local", "cluster.tasks_per_node=2", "run_dir=r"]
    )
    with pytest.raises(JobFailedError) as raised:
        job.wait()
    assert "; cause: rank 1: ValueError: bad batch on rank 1" in str(raised.value)
    assert raised.value.log is not None and raised.value.log.name.endswith("_1_log.out")
