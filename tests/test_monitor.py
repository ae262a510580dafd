"""`hpcdl status | logs | cancel` on runs that were not (only) Slurm jobs, and their edges,
without a cluster: the scheduler's answers are scripted (hpcdl.launch.monitor.job_state)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpcdl.cli.compose import compose_config
from hpcdl.cli.main import main
from hpcdl.config.schema import ScriptConfig
from hpcdl.launch.foreground import record_end, record_start
from hpcdl.launch.slurm_state import ENDED_UNFINISHED
from hpcdl.rundir import RunDir, create_run_dir


def new_run(tmp_path: Path, name: str = "run") -> RunDir:
    return create_run_dir(compose_config([f"run_dir={tmp_path / name}"]))[1]


def scheduler(monkeypatch, state: str) -> list[str]:
    """job_state() answers `state` for every job; the job ids asked about."""
    asked: list[str] = []

    def job_state(job_id: str) -> dict[str, str]:
        asked.append(job_id)
        return {"job_id": job_id, "state": state, "source": "sacct"}

    monkeypatch.setattr("hpcdl.launch.monitor.job_state", job_state)
    return asked


def status_lines(run: RunDir, capsys) -> dict[str, str]:
    """`hpcdl status RUN_DIR`'s lines, its exit status checked: 1 for a run that ended
    without completing (a script polling it), else 0."""
    code = main(["status", str(run.path)])
    lines = capsys.readouterr().out.splitlines()
    report = {k.strip(): v.strip() for k, _, v in (line.partition(": ") for line in lines)}
    assert code == (1 if report["state"] in ENDED_UNFINISHED else 0), report
    return report


def local_run(run: RunDir, job_id: str, exit_code: int | None, num_ranks: int = 2) -> None:
    """A cluster=local attempt as hpcdl.launch.local records it, with its ranks' logs."""
    record_start(run, "local", job_id, num_ranks)
    run.log_dir.mkdir(exist_ok=True)
    for rank in range(num_ranks):
        (run.log_dir / f"{job_id}_{rank}_log.out").write_text(f"rank {rank} of job {job_id}\n")
    if exit_code is not None:
        record_end(run, "local", job_id, exit_code)


def slurm_attempt(run: RunDir, job_id: str, reason: str) -> None:
    run.append_attempt({"event": "start", "job_id": job_id, "restart_count": 0})
    run.append_attempt({"event": "end", "job_id": job_id, "reason": reason, "action": "exit"})


def test_status_and_logs_of_a_local_run_come_from_its_run_dir(tmp_path, capsys) -> None:
    run = new_run(tmp_path)
    local_run(run, "4711", exit_code=3)
    report = status_lines(run, capsys)
    assert report["job_id"] == "4711" and report["state"] == "INTERRUPTED"
    assert report["source"] == "run dir (cluster=local, run in the foreground, not on Slurm)"
    assert report["attempts"] == "1" and report["last_end"] == "interrupted"
    assert main(["logs", str(run.path), "--rank", "1"]) == 0
    assert capsys.readouterr().out == "rank 1 of job 4711\n"

    local_run(run, "4712", exit_code=0)  # resumed: the newest attempt's logs and state
    run.write_summary({"test_accuracy": 0.9})
    report = status_lines(run, capsys)
    assert (report["job_id"], report["state"], report["attempts"]) == ("4712", "COMPLETED", "2")
    assert main(["logs", str(run.path)]) == 0
    assert capsys.readouterr().out == "rank 0 of job 4712\n"


def test_a_run_dir_not_launched_yet_says_so(tmp_path, capsys) -> None:
    run = new_run(tmp_path)  # `hpcdl train --no-launch`
    report = status_lines(run, capsys)
    assert (report["state"], report["source"]) == (
        "NOT_STARTED",
        "run dir (no attempt has started)",
    )
    assert main(["logs", str(run.path)]) == 2
    assert capsys.readouterr().err == f"error: {run.path}: not launched yet; no log to show\n"


def test_a_local_run_is_running_while_its_lock_holder_lives(tmp_path, capsys) -> None:
    from hpcdl.runlock import hold

    run = new_run(tmp_path)
    run.write_summary({"test_accuracy": 0.9})  # of an earlier attempt, resumed for more epochs
    with hold(run):  # this process trains it
        local_run(run, "99", exit_code=None)
        report = status_lines(run, capsys)
        assert report["state"] == "RUNNING" and report["where"].startswith("pid ")
        assert main(["cancel", str(run.path)]) == 2
        err = capsys.readouterr().err
        assert "stop it with Ctrl-C in its terminal" in err and "(it saves a checkpoint;" in err
    report = status_lines(run, capsys)  # gone without an end record: killed
    assert report["state"] == "FAILED" and "where" not in report


def test_cancel_of_a_foreground_hpcdl_run_says_what_its_program_gets(tmp_path, capsys) -> None:
    # Before: "(it saves a checkpoint; ...)", which hpcdl cannot promise of a program.
    from hpcdl.runlock import hold

    script = ScriptConfig(command=["python", "train.py"])
    cfg = compose_config([f"run_dir={tmp_path / 'prog'}"], script=script)
    run = create_run_dir(cfg)[1]
    with hold(run):
        local_run(run, "98", exit_code=None)
        assert main(["cancel", str(run.path)]) == 2
        err = capsys.readouterr().err
        assert "(its program gets SIGTERM, and a second kill ends it;" in err, err


def test_a_debug_run_has_no_log_files_and_says_so_in_one_line(tmp_path, capsys) -> None:
    run = new_run(tmp_path)
    record_start(run, "debug", None, 1)
    record_end(run, "debug", None, 1)
    report = status_lines(run, capsys)
    assert report["state"] == "FAILED" and "job_id" not in report
    assert report["source"] == "run dir (cluster=debug, run in the foreground, not on Slurm)"
    assert main(["logs", str(run.path)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: {run.path}: no log file for rank 0; a cluster=debug run prints to the console "
        "only (the terminal that ran it)\n"
    )
    assert main(["cancel", str(run.path)]) == 0
    assert "has ended (FAILED); nothing to cancel" in capsys.readouterr().out


def test_a_slurm_run_resumed_locally_shows_the_local_attempt(tmp_path, monkeypatch, capsys) -> None:
    run = new_run(tmp_path)
    run.record_submission("22", "devcluster", run.log_dir)
    slurm_attempt(run, "22", "timeout")
    asked = scheduler(monkeypatch, "TIMEOUT")
    local_run(run, "5150", exit_code=0)  # `hpcdl resume RUN cluster=local`
    run.write_summary({"test_accuracy": 0.9})
    report = status_lines(run, capsys)
    assert (report["job_id"], report["state"], report["last_end"]) == (
        "5150",
        "COMPLETED",
        "completed",
    )
    assert report["attempts"] == "2" and asked == []
    assert main(["logs", str(run.path), "--rank", "1"]) == 0
    assert capsys.readouterr().out == "rank 1 of job 5150\n"

    run.record_submission("23", "devcluster", run.log_dir)  # then resumed on Slurm again
    scheduler(monkeypatch, "PENDING")
    report = status_lines(run, capsys)
    assert (report["job_id"], report["state"]) == ("23", "PENDING")


def slurm_job_stops(
    run: RunDir,
    monkeypatch,
    signal_name: str | None,
    left_s: float | None,
    restart_count: int = 0,
) -> None:
    """One attempt of Slurm job 22 as its rank 0 records it (hpcdl.launch.slurm_job.main):
    training stopped on `signal_name` (None: `hpcdl run`'s program asked to stop) with
    `left_s` seconds to the time limit; no Slurm to requeue it. restart_count: 0 for a
    submitted job, more for a requeued one."""
    from hpcdl.job import JobOutcome
    from hpcdl.launch import slurm_job

    for name in ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_ARRAY_JOB_ID", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "22")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setattr(slurm_job, "seconds_left", lambda job_id: left_s)
    monkeypatch.setattr(slurm_job, "restarts_now", lambda job_id: None)  # scontrol: none
    monkeypatch.setattr(
        slurm_job,
        "start_record",
        lambda env, n: {"event": "start", "job_id": "22", "restart_count": restart_count},
    )
    stopped = JobOutcome(0, completed=False, signal_name=signal_name, summary={}, global_step=5)
    monkeypatch.setattr("hpcdl.job.run_job", lambda run_dir, stop: stopped)
    with pytest.raises(SystemExit) as leaving:
        slurm_job.main(str(run.path))
    assert leaving.value.code == 3


@pytest.mark.parametrize(
    ("signal_name", "left_s", "reason", "state"),
    [
        ("SIGTERM", 3000.0, "cancelled", "CANCELLED"),  # scancel: was FAILED
        (None, 3000.0, "requested", "INTERRUPTED"),  # the program stopped itself: was FAILED
        ("SIGUSR2", 40.0, "timeout", "TIMEOUT"),
        ("SIGUSR2", 3000.0, "preempted", "PREEMPTED"),
        # Slurm's SIGTERM at the time limit, its warning not acted on in time: was
        # `cancelled` (CANCELLED without accounting; TIMEOUT beside `last_end: cancelled`
        # with it).
        ("SIGTERM", -24.0, "timeout", "TIMEOUT"),
    ],
)
def test_a_slurm_job_gone_from_the_queue_is_judged_by_its_end_record(
    tmp_path, monkeypatch, capsys, signal_name, left_s, reason, state
) -> None:
    # No accounting: once squeue no longer lists the job, the run dir's last end decides.
    run = create_run_dir(
        compose_config(
            [f"run_dir={tmp_path / 'run'}", "cluster=devcluster", "cluster.max_requeues=0"]
        )
    )[1]
    run.record_submission("22", "devcluster", run.log_dir)
    slurm_job_stops(run, monkeypatch, signal_name, left_s)
    monkeypatch.setattr(
        "hpcdl.launch.slurm_state.query", lambda cmd: "" if "squeue" in cmd else None
    )
    report = status_lines(run, capsys)
    assert report["last_end"].startswith(reason)
    assert (report["state"], report["source"]) == (state, "run dir (not queued; no accounting)")
    assert "cause" not in report  # a stop it recorded: no error to look for in its logs


def test_every_end_reason_hpcdl_writes_has_its_state() -> None:
    import re

    from hpcdl.launch import foreground, monitor

    written = set(foreground.END_REASONS.values()) | {"failed"}
    source = (Path(monitor.__file__).parent / "slurm_job.py").read_text()
    written |= set(re.findall(r'"reason": "(\w+)"', source))
    written |= set(re.findall(r'return "(\w+)"', source))  # classify()
    assert written - {"requeued"} <= set(monitor.END_STATES), written
    assert "requeued" not in monitor.END_STATES  # the job comes back under its id


def test_the_rank_past_an_ended_jobs_world_size_is_named(tmp_path, monkeypatch, capsys) -> None:
    run = new_run(tmp_path)
    run.record_submission("3", "devcluster", run.log_dir)
    run.log_dir.mkdir()
    for rank in range(4):
        run.rank_log("3", rank).write_text("...\n")
    run.rank_log("3_1", 0).write_text("an array task's log, not a rank of job 3\n")
    scheduler(monkeypatch, "COMPLETED")
    for follow in ([], ["-f"]):
        assert main(["logs", str(run.path), "--rank", "7", *follow]) == 2
        assert capsys.readouterr().err == (
            "error: --rank 7: job 3 (COMPLETED) had world size 4, ranks 0-3; pass one of those\n"
        )
    scheduler(monkeypatch, "PENDING")
    assert main(["logs", str(run.path), "--rank", "7"]) == 2
    assert "no log yet (job 3 may still be pending; try -f)" in capsys.readouterr().err


def test_the_rank_past_a_running_jobs_world_size_is_named(tmp_path, monkeypatch, capsys) -> None:
    # Before: `logs --rank 3 -f` of a running one-rank job waited for the log forever.
    run = new_run(tmp_path)
    run.record_submission("5", "devcluster", run.log_dir)
    run.append_attempt({"event": "start", "job_id": "5", "world_size": 1, "start": "now"})
    run.log_dir.mkdir()
    run.rank_log("5", 0).write_text("epoch 1\n")
    scheduler(monkeypatch, "RUNNING")
    for follow in ([], ["-f"]):
        assert main(["logs", str(run.path), "--rank", "3", *follow]) == 2
        assert capsys.readouterr().err == (
            "error: --rank 3: job 5 (RUNNING) has world size 1, ranks 0-0; pass one of those\n"
        )
    # A sweep's array task: its start record has Slurm's own id beside ARRAY_TASK.
    trial = new_run(tmp_path, "trial")
    trial.record_submission("42_0", "devcluster", trial.log_dir)
    start = {"event": "start", "job_id": "43", "array_job": "42", "array_task": "0"}
    trial.append_attempt({**start, "world_size": 1, "start": "now"})
    for follow in ([], ["-f"]):
        assert main(["logs", str(trial.path), "--rank", "1", *follow]) == 2
        assert capsys.readouterr().err == (
            "error: --rank 1: job 42_0 (RUNNING) has world size 1, ranks 0-0; pass one of those\n"
        )


@pytest.mark.parametrize("command", ["status", "logs"])  # cancel: test_sweeps_slurm.py
def test_a_sweep_dir_is_pointed_to_sweep_status(tmp_path, capsys, command) -> None:
    from hpcdl.sweep.ledger import Ledger, TrialRecord, save

    sweep = tmp_path / "sw"
    trials = [TrialRecord(i, [f"optim.lr={i}"], str(sweep / str(i))) for i in range(2)]
    (sweep / "1").mkdir(parents=True)
    RunDir(sweep / "1").record_submission("57", "devcluster", sweep / "logs")  # chained on
    ledger = Ledger(str(sweep), "devcluster", "slurm", ["optim.lr"], [], trials=trials)
    ledger.submissions.append({"array_job_id": "41", "trials": [0, 1]})
    save(ledger)
    assert main([command, str(sweep)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"error: {sweep} is a sweep dir: `hpcdl sweep status {sweep}` shows" in err


def test_status_where_slurm_does_not_answer_warns_and_exits_1(tmp_path, monkeypatch, capsys):
    # Before: `state: UNKNOWN` (a run) or the ledger's stale RUNNING/PENDING (a sweep), with
    # no word of why, and exit status 0.
    from hpcdl.sweep.ledger import Ledger, TrialRecord, save

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("squeue", "sacct"):  # as without SLURM_CONF: installed, but no controller
        (bin_dir / tool).write_text("#!/bin/sh\necho 'fatal: no configuration' >&2\nexit 1\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    run = new_run(tmp_path)
    run.record_submission("8", "devcluster", run.log_dir)
    assert main(["status", str(run.path)]) == 1
    out, err = capsys.readouterr()
    assert "state: UNKNOWN" in out
    assert err == (
        "warning: Slurm does not answer here (squeue and sacct failed), so the job's state is "
        "not known; run this where Slurm answers (is SLURM_CONF set? for the dev cluster: "
        'eval "$(slurm/devcluster env)")\n'
    )
    sweep = tmp_path / "sw"
    trials = [TrialRecord(i, [f"optim.lr={i}"], str(sweep / str(i))) for i in range(2)]
    ledger = Ledger(str(sweep), "devcluster", "slurm", ["optim.lr"], [], trials=trials)
    for t in ledger.trials:
        new_run(tmp_path, f"sw/{t.index}")
        t.job_id, t.state = f"41_{t.index}", "RUNNING"
    ledger.submissions.append({"array_job_id": "41", "trials": [0, 1]})
    save(ledger)
    assert main(["sweep", "status", str(sweep)]) == 1
    out, err = capsys.readouterr()
    assert "RUNNING" in out
    assert err.startswith("warning: Slurm does not answer here (squeue and sacct failed), so the "
                          "trial states shown are the last ones seen; run this where")  # fmt: skip


@pytest.mark.parametrize("command", [["status", "--watch", "10"], ["logs", "-f"]])
def test_ctrl_c_while_watching_ends_quietly_with_130(tmp_path, monkeypatch, capsys, command):
    run = new_run(tmp_path)
    run.record_submission("8", "devcluster", run.log_dir)
    run.log_dir.mkdir()
    run.rank_log("8", 0).write_text("epoch 1\n")
    scheduler(monkeypatch, "RUNNING")

    def ctrl_c(_seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("hpcdl.launch.monitor.time.sleep", ctrl_c)
    try:
        code = main([command[0], str(run.path), *command[1:]])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped main(): the user gets a traceback")
    assert code == 130
    out, err = capsys.readouterr()
    assert err == "" and ("epoch 1" in out or "RUNNING" in out)


@pytest.mark.parametrize(
    ("state", "end", "says"),
    [
        (
            "COMPLETING",
            None,
            "is ending (COMPLETING); wait a few seconds for it to leave the queue",
        ),
        ("RUNNING", {"reason": "cancelled", "action": "exit"}, "is ending (RUNNING); wait a few"),
        ("PENDING", None, "is still PENDING; it resumes by itself when requeued"),
        ("RUNNING", {"reason": "preempted", "action": "requeued"}, "is still RUNNING; it resumes"),
    ],
)
def test_resume_refuses_a_queued_job_and_says_to_wait_for_one_ending(
    tmp_path, monkeypatch, state, end, says
) -> None:
    from hpcdl.cli.resume_cmd import refuse_if_still_queued
    from hpcdl.errors import HpcdlError

    run = new_run(tmp_path)
    run.record_submission("22", "devcluster", run.log_dir)
    run.append_attempt({"event": "start", "job_id": "22", "restart_count": 0})
    if end is not None:
        run.append_attempt({"event": "end", "job_id": "22", **end})
    scheduler(monkeypatch, state)
    with pytest.raises(HpcdlError) as refused:
        refuse_if_still_queued(run)
    assert says in str(refused.value)


def test_a_local_run_records_its_attempt_for_status_and_logs(hpcdl, tmp_path) -> None:
    from tests import fault_hook

    two = ["cluster=local", "cluster.tasks_per_node=2", "trainer.max_epochs=1", "run_dir=run"]
    out = hpcdl("train", *two, fault_hook.OVERRIDE, env=fault_hook.env("SIGTERM@2"))
    assert out.returncode == 3, out.stdout + out.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "attempts.jsonl").open()]
    assert [(r["event"], r["launcher"], r.get("reason")) for r in records] == [
        ("start", "local", None),
        ("end", "local", "interrupted"),
    ]
    status = hpcdl("status", "run")
    assert status.returncode == 1, status.stderr  # ended without completing
    assert "state: INTERRUPTED" in status.stdout and "last_end: interrupted" in status.stdout
    logs = hpcdl("logs", "run", "--rank", "1")
    assert logs.returncode == 0 and "submitit INFO" in logs.stdout
    beyond = hpcdl("logs", "run", "--rank", "2")
    assert beyond.returncode == 2 and "world size 2, ranks 0-1" in beyond.stderr


def test_a_writer_starting_while_status_looks_at_the_lock_is_not_refused(tmp_path) -> None:
    import fcntl
    import threading

    from hpcdl.runlock import hold, is_held

    run = new_run(tmp_path)
    run.lock_file.touch()
    with open(run.lock_file) as looking:  # what is_held() does, here for 0.2 s
        fcntl.flock(looking, fcntl.LOCK_SH | fcntl.LOCK_NB)
        threading.Timer(0.2, fcntl.flock, (looking, fcntl.LOCK_UN)).start()
        with hold(run):
            assert is_held(run)
    assert not is_held(run)


def test_status_logs_and_cancel_of_a_local_run_never_import_torch(tmp_path) -> None:
    from tests.conftest import run_without_torch

    run = new_run(tmp_path)
    local_run(run, "12", exit_code=0)
    code = (
        "from hpcdl.cli.main import main\n"
        f"codes = [main([c, {str(run.path)!r}]) for c in ('status', 'logs', 'cancel')]\n"
        "assert codes == [0, 0, 0], codes\n"
    )
    out = run_without_torch(code, cwd=tmp_path)
    assert "state: COMPLETED" in out.stdout and "rank 0 of job 12" in out.stdout


def test_a_failed_scancel_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scancel = bin_dir / "scancel"
    scancel.write_text(
        "#!/bin/sh\necho 'scancel: error: _establish_config_source: failed' >&2\n"
        "echo 'scancel: fatal: Could not establish a configuration source' >&2\nexit 1\n"
    )
    scancel.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    scheduler(monkeypatch, "RUNNING")
    assert main(["cancel", "123"]) == 2
    assert capsys.readouterr().err == (
        "error: scancel 123 failed: scancel: fatal: Could not establish a configuration source\n"
    )
    scancel.unlink()  # no Slurm here at all
    assert main(["cancel", "123"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: scancel 123 failed: ") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("ref", "state", "source", "code", "says"),
    [
        # Before: "cancelled job 99999", exit 0, for an id nothing knew.
        ("99999", "UNKNOWN", "none (not queued; sacct does not know it)", 2,
         "error: job 99999: neither squeue nor sacct knows it; nothing to cancel"),
        ("99999", "UNKNOWN", "none (not queued; no accounting)", 0,
         "job 99999 is not in Slurm's queue (it has ended, or the id is wrong); nothing"),
        # Before: "cancelled job 3" again, a moment after the first cancel.
        ("3", "COMPLETING", "squeue", 0, "job 3 is ending (COMPLETING); nothing to cancel"),
        # Before: scancel's own "fatal: Could not establish a configuration source".
        ("3", "UNKNOWN", "none (squeue failed)", 2,
         "error: job 3: Slurm does not answer here (squeue and sacct failed), so nothing was "
         "cancelled; run this where Slurm answers (is SLURM_CONF set?"),
    ],
)  # fmt: skip
def test_cancel_says_what_it_did_not_cancel_and_why(
    tmp_path, monkeypatch, capsys, ref, state, source, code, says
) -> None:
    from hpcdl.launch import slurm_state

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scancel").write_text(f"#!/bin/sh\ntouch {tmp_path / 'scancelled'}\n")
    (bin_dir / "scancel").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    answer = {"job_id": ref, "state": state, "source": source}
    monkeypatch.setattr("hpcdl.launch.monitor.job_state", lambda job_id: answer)
    assert source in (slurm_state.SQUEUE_FAILED, slurm_state.NOT_IN_ACCOUNTING,
                      slurm_state.NO_ACCOUNTING, "squeue")  # fmt: skip
    assert main(["cancel", ref]) == code
    out, err = capsys.readouterr()
    assert says in (err if code else out), (out, err)
    assert not (tmp_path / "scancelled").exists()


def test_elapsed_is_shown_in_one_format_whoever_ran_the_job(tmp_path, monkeypatch, capsys) -> None:
    from hpcdl.launch import foreground, monitor, slurm_state

    # squeue's %M and sacct's Elapsed, as hpcdl shows them: [D-]HH:MM:SS.
    answers = {"squeue": "22|RUNNING|0:06|10:00|1|n1\n", "sacct": None}
    monkeypatch.setattr(slurm_state, "query", lambda cmd: answers[cmd[0]])
    assert monitor.job_state("22")["elapsed"] == "00:00:06"  # squeue said 0:06
    assert monitor.job_state("22")["time_limit"] == "00:10:00"  # and 10:00, ten minutes
    answers.update(squeue="", sacct="22|COMPLETED|00:01:05|0:0|n1\n")
    assert monitor.job_state("22")["elapsed"] == "00:01:05"
    # Where it waits and what it is charged to (squeue's %P %a %q, sacct's fields after
    # NodeList); an account accounting does not have, `(null)`, is left out.
    answers.update(squeue="22|PENDING|0:00|10:00|1|(Priority)|gpu|chem-lab|normal\n")
    charged = monitor.job_state("22")
    assert (charged["partition"], charged["account"], charged["qos"]) == ("gpu", "chem-lab", "normal")
    answers.update(squeue="", sacct="22|COMPLETED|00:01:05|0:0|n1|cpu|(null)|normal\n")
    charged = monitor.job_state("22")
    assert (charged["partition"], "account" in charged, charged["qos"]) == ("cpu", False, "normal")
    for slurm, shown in [
        ("0:06", "00:00:06"),
        ("12:34", "00:12:34"),
        ("1:02:03", "01:02:03"),
        ("00:00:06", "00:00:06"),
        ("2-03:04:05", "2-03:04:05"),
        ("INVALID", "INVALID"),
    ]:
        assert slurm_state.normalized_elapsed(slurm) == shown

    # A run in the foreground: from its attempt's records, in the same format.
    times = iter(["2026-11-26T10:00:00", "2026-11-26T11:02:05"])
    monkeypatch.setattr(foreground, "_now", lambda: next(times))
    run = new_run(tmp_path)
    local_run(run, "4711", exit_code=0)
    report = status_lines(run, capsys)
    assert (report["state"], report["elapsed"]) == ("COMPLETED", "01:02:05")
    # A Slurm job gone from the queue on a cluster without accounting: from the run dir.
    answers.update(squeue="", sacct=None)
    run = new_run(tmp_path, "slurm")
    run.record_submission("22", "devcluster", run.log_dir)
    run.append_attempt({"event": "start", "job_id": "22", "start": "2026-11-26T10:00:00"})
    run.append_attempt({"event": "end", "job_id": "22", "end": "2026-11-27T10:00:09"})
    report = status_lines(run, capsys)
    assert (report["source"], report["elapsed"]) == (
        "run dir (not queued; no accounting)",
        "1-00:00:09",
    )


def test_a_running_foreground_attempt_shows_its_elapsed_time_so_far(tmp_path, capsys) -> None:
    import datetime as dt

    from hpcdl.client import Job
    from hpcdl.runlock import hold

    run = new_run(tmp_path)
    an_hour_ago = dt.datetime.now() - dt.timedelta(hours=1)
    with hold(run):
        run.append_attempt(
            {"event": "start", "launcher": "debug", "job_id": None, "after_job": None}
            | {"start": an_hour_ago.isoformat(timespec="seconds")}
        )
        report = Job(run.path).status()  # the Python API's dict: the same string
    assert report["state"] == "RUNNING" and report["elapsed"] in ("01:00:00", "01:00:01")


def test_status_shows_a_regressions_own_metrics_not_only_losses(tmp_path, capsys) -> None:
    """last_metrics: train_loss and every val_* of the last epoch (val_mae, val_r2, a custom
    task's own); test_metrics: every test_* of summary.json. Printed as `name value` pairs."""
    run = new_run(tmp_path)
    local_run(run, "4711", exit_code=0, num_ranks=1)
    row = {"epoch": 2, "step": 14, "train_loss": 0.68606, "train_mae": 2.1}
    run.metrics.append(
        {**row, "val_loss": 0.29091, "val_mae": 1.36631, "val_r2": 0.6791, "lr": 0.01}
    )
    run.write_summary({"test_loss": 0.19, "test_mae": 1.0173, "test_r2": 0.669, "epochs": 2})
    report = status_lines(run, capsys)
    assert (
        report["last_metrics"] == "train_loss 0.6861  val_loss 0.2909  val_mae 1.366  val_r2 0.6791"
    )
    assert report["test_metrics"] == "test_loss 0.19  test_mae 1.017  test_r2 0.669"
    from hpcdl.client import Job

    status = Job(run.path).status()  # the Python API keeps every digit, and test_accuracy
    assert status["last_metrics"]["val_mae"] == pytest.approx(1.36631)
    assert status["test_metrics"]["test_r2"] == 0.669 and status["test_accuracy"] is None


def test_a_resume_killed_without_an_end_is_not_shown_as_the_earlier_completion(
    tmp_path, capsys
) -> None:
    """A completed run resumed for more epochs, then killed (no end record): last_end says
    it was killed, not the first attempt's 'completed', and the first attempt's test metrics
    and weights hash (of weights trained on since) are not shown as the run's."""
    run = new_run(tmp_path)
    local_run(run, "4711", exit_code=0, num_ranks=1)
    run.write_summary({"test_loss": 0.5, "test_accuracy": 0.8, "weights_sha256": "ab" * 32})
    assert "test_metrics" in status_lines(run, capsys)
    local_run(run, "4712", exit_code=None, num_ranks=1)  # the resume, killed
    report = status_lines(run, capsys)
    assert report["state"] == "FAILED" and report["attempts"] == "2"
    assert report["last_end"].startswith("none recorded: killed")
    assert "test_metrics" not in report and "weights_sha256" not in report


def test_an_array_by_its_own_id_is_headlined_as_a_whole(monkeypatch, capsys) -> None:
    """`hpcdl status 52`: the array's state, not that of whichever task Slurm listed first
    (squeue) or last (sacct)."""
    from hpcdl.launch import monitor, slurm_state

    # Task 0 failed, task 1 completed: sacct lists 52_1 last.
    answers = {
        "squeue": "",
        "sacct": "52_0|FAILED|00:00:05|1:0|n1\n52_1|COMPLETED|00:00:09|0:0|n2\n",
        "scontrol": "",  # the controller has forgotten the array: no batch script
    }
    monkeypatch.setattr(slurm_state, "query", lambda cmd: answers[cmd[0]])
    assert main(["status", "52"]) == 1  # a task failed: the array failed
    out = capsys.readouterr().out
    assert "job_id: 52\n" in out and "state: FAILED\n" in out, out
    assert "array_tasks: 52_0 FAILED, 52_1 COMPLETED" in out
    assert "elapsed" not in out and "exit_code" not in out  # one task's, not the array's
    # One task runs, the next waits (squeue lists the pending one first), task 0 is done.
    answers.update(
        squeue="52_[2-3%1]|PENDING|0:00|10:00|1|(JobArrayTaskLimit)\n"
        "52_1|RUNNING|0:04|10:00|1|n1\n",
        sacct="52_0|COMPLETED\n52_1|RUNNING\n52_[2-3%1]|PENDING\n",
    )
    state = monitor.job_state("52")
    assert state["job_id"] == "52" and state["state"] == "RUNNING", state
    assert state["array_tasks"] == "52_0 COMPLETED, 52_1 RUNNING, 52_[2-3%1] PENDING"
    # Both tasks just started (as on the dev cluster, 2 s after the sweep was queued): squeue
    # lists them, sacct still the array's one record, not yet its tasks'.
    answers.update(
        squeue="52_1|RUNNING|0:02|10:00|2|n[1-2]\n52_0|RUNNING|0:02|10:00|2|n[1-2]\n",
        sacct="52|PENDING\n",
    )
    state = monitor.job_state("52")
    assert state["job_id"] == "52" and state["state"] == "RUNNING", state
    assert state["array_tasks"] == "52_0 RUNNING, 52_1 RUNNING"
    answers.update(
        squeue="52_[2-3%1]|PENDING|0:00|10:00|1|(JobArrayTaskLimit)\n"
        "52_1|COMPLETING|0:04|10:00|1|n1\n",
        sacct="52_0|COMPLETED\n",
    )
    assert monitor.job_state("52")["state"] == "COMPLETING"  # still active, not done
    # Every task still waits: squeue's one line is the array's too.
    answers.update(squeue="52_[0-3%1]|PENDING|0:00|10:00|1|(Priority)\n", sacct="")
    state = monitor.job_state("52")
    assert (state["job_id"], state["state"]) == ("52", "PENDING"), state
    assert state["array_tasks"] == "52_[0-3%1] PENDING"
    # A task alone is reported as before.
    answers.update(squeue="52_1|RUNNING|0:04|10:00|1|n1\n")
    assert monitor.job_state("52_1") == {
        "job_id": "52_1",
        "state": "RUNNING",
        "elapsed": "00:00:04",
        "time_limit": "00:10:00",
        "nodes": "1",
        "where": "n1",
        "source": "squeue",
    }


def test_a_requeued_job_waiting_to_start_again_counts_its_requeue(
    tmp_path, monkeypatch, capsys
) -> None:
    """After `scontrol requeue` (or its own requeue on the warning signal) the job pends
    under its id with no new start record yet: Slurm has counted the restart, so does
    status (was `requeues: 0` until the next attempt started)."""
    run = new_run(tmp_path)
    run.record_submission("4", "devcluster", run.log_dir)
    run.append_attempt({"event": "start", "job_id": "4", "restart_count": 0})
    run.append_attempt(
        {"event": "end", "job_id": "4", "reason": "requeued", "action": "requeued by Slurm"}
    )
    scheduler(monkeypatch, "PENDING")
    report = status_lines(run, capsys)
    assert report["state"] == "PENDING" and report["attempts"] == "1", report
    assert report["requeues"] == "1", report
    scheduler(monkeypatch, "CANCELLED")  # cancelled while it waited: it never came back
    assert status_lines(run, capsys)["requeues"] == "0"
    scheduler(monkeypatch, "RUNNING")  # started again: counted once, by its start record
    run.append_attempt({"event": "start", "job_id": "4", "restart_count": 1})
    report = status_lines(run, capsys)
    assert report["attempts"] == "2" and report["requeues"] == "1", report
    # A time limit it requeued itself after, then waiting again; a failed requeue is none.
    run.append_attempt({"event": "end", "job_id": "4", "reason": "timeout", "action": "requeued"})
    scheduler(monkeypatch, "PENDING")
    assert status_lines(run, capsys)["requeues"] == "2"
    run.append_attempt({"event": "start", "job_id": "4", "restart_count": 2})
    run.append_attempt(
        {"event": "end", "job_id": "4", "reason": "timeout", "action": "requeue failed: denied"}
    )
    assert status_lines(run, capsys)["requeues"] == "2"
    # Requeued, then cancelled while it waited; `hpcdl resume` submits job 5: no requeue.
    run.append_attempt({"event": "start", "job_id": "4", "restart_count": 3})
    run.append_attempt({"event": "end", "job_id": "4", "reason": "requeued", "action": "x"})
    assert status_lines(run, capsys)["requeues"] == "4"
    run.record_submission("5", "devcluster", run.log_dir)
    assert status_lines(run, capsys)["requeues"] == "3"
    # cluster.requeue=chain: the stop names the next job, which waits for it.
    run.append_attempt({"event": "start", "job_id": "5", "restart_count": 0})
    run.append_attempt(
        {
            "event": "end",
            "job_id": "5",
            "reason": "timeout",
            "action": "chained: job 6 (afterany:5)",
        }
    )
    run.record_submission("6", "devcluster", run.log_dir)
    assert status_lines(run, capsys)["requeues"] == "4"


def test_sweep_status_counts_a_requeued_trial_waiting_to_start_again(
    tmp_path, monkeypatch, capsys
) -> None:
    from hpcdl.sweep import states
    from hpcdl.sweep.ledger import Ledger, TrialRecord, save

    sweep = tmp_path / "sw"
    trials = []
    for i in range(2):
        cfg = compose_config([f"run_dir={sweep / str(i)}"])
        create_run_dir(cfg)
        trials.append(TrialRecord(i, [f"optim.lr={i}"], str(sweep / str(i)), job_id=f"41_{i}"))
    ledger = Ledger(str(sweep), "devcluster", "slurm", ["optim.lr"], [], trials=trials)
    ledger.submissions.append({"array_job_id": "41", "trials": [0, 1]})
    save(ledger)
    requeued = RunDir(sweep / "1")
    # Slurm's own id of an array task's job ("41" here: the task that started last keeps
    # the array's), beside the array and the task.
    requeued.append_attempt(
        {"event": "start", "job_id": "41", "array_job": "41", "array_task": "1", "restart_count": 0}
    )
    requeued.append_attempt(
        {"event": "end", "job_id": "41", "reason": "preempted", "action": "requeued"}
    )
    RunDir(sweep / "0").append_attempt(
        {"event": "start", "job_id": "42", "array_job": "41", "array_task": "0", "restart_count": 0}
    )
    answers = {"sacct": "41_0|RUNNING\n41_1|PENDING\n", "squeue": "41_0|RUNNING\n41_1|PENDING\n"}
    monkeypatch.setattr(states, "query", lambda cmd: answers[cmd[0]])
    main(["sweep", "status", str(sweep)])
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if "41_" in line]
    # trial, state, requeues
    assert [(r[3].strip(), r[4].strip(), r[6].strip()) for r in rows] == [
        ("41_0", "RUNNING", "0"),
        ("41_1", "PENDING", "1"),
    ], rows


def test_a_trial_that_stopped_itself_is_not_blamed_on_its_exit_status(
    tmp_path, monkeypatch, capsys
) -> None:
    """An array task that saved and stopped at its time limit past cluster.max_requeues
    exits 3, which Slurm calls FAILED: its last_end says why, and neither `hpcdl status
    SWEEP_DIR/1` nor `sweep status` names srun's 'Exited with exit code 3' as the cause
    (they did for array tasks: the end record has Slurm's own job id, not 41_1)."""
    from hpcdl.launch import slurm_state
    from hpcdl.sweep import states
    from hpcdl.sweep.ledger import Ledger, TrialRecord, save

    sweep = tmp_path / "sw"
    trials = []
    for i in range(2):
        create_run_dir(compose_config([f"run_dir={sweep / str(i)}"]))
        trials.append(TrialRecord(i, [f"optim.lr={i}"], str(sweep / str(i)), job_id=f"41_{i}"))
    ledger = Ledger(str(sweep), "devcluster", "slurm", ["optim.lr"], [], trials=trials)
    ledger.submissions.append({"array_job_id": "41", "trials": [0, 1]})
    save(ledger)
    (sweep / "logs").mkdir()
    for i, job in enumerate(["42", "41"]):
        run = RunDir(sweep / str(i))
        start = {"event": "start", "job_id": job, "array_job": "41", "array_task": str(i)}
        run.append_attempt({**start, "restart_count": 0})
        (sweep / "logs" / f"41_{i}_0_log.out").write_text(
            "srun: error: n1: task 0: Exited with exit code 3\n"
            if i
            else "Traceback (most recent call last):\nRuntimeError: boom\n"
        )
    action = "not requeued: cluster.max_requeues=0 timeouts reached"
    RunDir(sweep / "1").append_attempt(
        {"event": "end", "job_id": "41", "reason": "timeout", "action": action}
    )
    RunDir(sweep / "0").append_attempt(
        {"event": "end", "job_id": "42", "reason": "failed", "error": "RuntimeError: boom"}
    )
    answers = {"sacct": "41_0|FAILED\n41_1|FAILED\n", "squeue": ""}
    monkeypatch.setattr(states, "query", lambda cmd: answers[cmd[0]])
    assert main(["sweep", "status", str(sweep)]) == 1
    out = capsys.readouterr().out
    assert "trial 0 failed: stopped" not in out, out  # an error is no stop of its own
    assert f"trial 1 timed out: {action}\n" in out, out  # and TIMEOUT in its row
    answers.update(sacct="41_1|FAILED|00:01:09|3:0|n1\n", scontrol="")
    monkeypatch.setattr(slurm_state, "query", lambda cmd: answers[cmd[0]])
    report = status_lines(RunDir(sweep / "1"), capsys)
    # hpcdl status says TIMEOUT too (it said FAILED: Slurm's word for the exit status 3).
    assert report["state"] == "TIMEOUT" and report["last_end"] == f"timeout ({action})"
    assert "cause" not in report, report


@pytest.mark.parametrize("ref", ["25_", "_25", "25__1", "25_1_2"])
def test_a_malformed_job_id_is_refused_before_slurm_is_asked(monkeypatch, capsys, ref) -> None:
    """`hpcdl status 25_` was asked of squeue and sacct, and the error blamed a cluster
    without accounting."""
    asked = scheduler(monkeypatch, "RUNNING")
    assert main(["status", ref]) == 2
    assert capsys.readouterr().err == (
        f"error: {ref}: neither a run dir nor a Slurm job id (JOBID, ARRAYID or ARRAYID_TASKID)\n"
    )
    assert asked == []
    assert main(["status", "25_1"]) == 0 and asked == ["25_1"]


def test_a_time_limit_where_squeue_cannot_say_is_a_time_limit(tmp_path, monkeypatch) -> None:
    """Inside a container without Slurm's commands squeue cannot give the time left: the
    warning was taken for a preemption, requeued past cluster.max_requeues for ever. The
    job's own clock (its start plus cluster.timeout_min) decides there."""
    from hpcdl.launch import slurm_job

    overrides = ["cluster=devcluster", "cluster.max_requeues=0", "cluster.timeout_min=1"]
    run = create_run_dir(compose_config([f"run_dir={tmp_path / 'run'}", *overrides]))[1]
    slurm_job_stops(run, monkeypatch, "SIGUSR2", left_s=None)
    end = run.read_attempts()[-1]
    assert (end["reason"], end["action"]) == (
        "timeout",
        "not requeued: cluster.max_requeues=0 timeouts reached",
    )
    # With an hour to go by its clock, the same warning is a preemption.
    assert slurm_job.classify("SIGUSR2", "SIGUSR2", "1", 30, limit_left_s=3600.0) == "preempted"
    assert slurm_job.classify("SIGUSR2", "SIGUSR2", "1", 30, limit_left_s=100.0) == "timeout"


def test_an_array_task_cancelled_before_it_ran_is_cancelled_not_unknown(
    monkeypatch, capsys
) -> None:
    """`scancel 38` while 38_1 and 38_2 waited: sacct keeps one record for them,
    `38_[1-2%1]`, and none under their own ids. `hpcdl status 38_1` said 'neither squeue
    nor sacct knows it; check the id' (and `hpcdl status SWEEP_DIR/1` UNKNOWN), while
    `hpcdl sweep status` said CANCELLED."""
    from hpcdl.launch import slurm_state

    def query(cmd: list[str]) -> str:
        if cmd[0] == "squeue":
            return "" if "-j" in cmd else "1|RUNNING\n"
        if cmd[0] == "scontrol":
            return ""  # the controller has forgotten the array: no batch script
        array = "38_0|CANCELLED by 0|00:00:08|0:0|n1\n38_[1-2%1]|CANCELLED by 0|00:00:00|0:0|None\n"
        return array if cmd[cmd.index("-j") + 1] == "38" else ""

    monkeypatch.setattr(slurm_state, "query", query)
    assert main(["status", "38_1"]) == 1
    out = capsys.readouterr().out
    assert "job_id: 38_1\n" in out and "state: CANCELLED\n" in out, out
    assert "source: sacct (the array's record 38_[1-2%1]: it never ran)" in out
    assert main(["status", "38_5"]) == 2  # no such task: as before
    assert "neither squeue nor sacct knows it" in capsys.readouterr().err


def test_an_array_task_cancelled_alone_while_it_waited_is_listed_and_cancelled(
    monkeypatch, capsys
) -> None:
    """`scancel 30_3` while 30_[1-3%1] waited: Slurm 22.05 drops the task from the array's
    pending record (squeue and sacct then say 30_[1-2%1]) and keeps no record of it; only
    the batch script's `--array=0-3%1` still names it. `hpcdl status 30` listed 30_0 to
    30_2 without it, and `hpcdl status 30_3` said 'neither squeue nor sacct knows it'.
    The answers are the dev cluster's (`sbatch --array=0-3%1`), as hpcdl asks."""
    from hpcdl.launch import slurm_state

    script = "#!/bin/bash\n#SBATCH --array=0-3%1\nsleep 20\n"
    squeue = {  # -j ID -> its answer; tasks squeue does not list: "" (exit status 0)
        "30": "30_[1-2%1]|PENDING|0:00|1:00:00|1|(JobArrayTaskLimit)\n"
        "30_0|RUNNING|0:03|1:00:00|1|n1\n",
    }
    sacct = {"30": "30_0|RUNNING\n30_[1-2%1]|PENDING\n"}
    controller: dict[str, str] = {"30": script}

    def query(cmd: list[str]) -> str | None:
        if cmd[0] == "scontrol":
            return controller.get(cmd[3], "")  # rc 0 and nothing once it is forgotten
        if cmd[0] == "squeue":
            return squeue.get(cmd[cmd.index("-j") + 1], "") if "-j" in cmd else "1|RUNNING\n"
        return None if sacct is None else sacct.get(cmd[cmd.index("-j") + 1], "")

    monkeypatch.setattr(slurm_state, "query", query)
    state = slurm_state.job_state("30")
    assert state["state"] == "RUNNING", state
    assert state["array_tasks"] == "30_0 RUNNING, 30_[1-2%1] PENDING, 30_3 CANCELLED"
    assert main(["status", "30_3"]) == 1  # ended without completing
    out = capsys.readouterr().out
    assert "job_id: 30_3\n" in out and "state: CANCELLED\n" in out, out
    assert "source: the array's batch script (--array=0-3%1)" in out, out
    # Every task has ended; the controller still holds the array (MinJobAge).
    squeue["30"] = ""
    sacct["30"] = "30_0|COMPLETED|00:00:20|0:0|n1\n30_1|COMPLETED|00:00:20|0:0|n1\n" + (
        "30_2|COMPLETED|00:00:20|0:0|n1\n"
    )
    assert main(["status", "30"]) == 1
    out = capsys.readouterr().out
    assert "state: CANCELLED\n" in out, out
    assert "array_tasks: 30_0 COMPLETED, 30_1 COMPLETED, 30_2 COMPLETED, 30_3 CANCELLED" in out
    # `--array=0-4%1`, `scancel 34_2` while 34_[1-4%1] waited: squeue says 34_[1,3-4%1] at
    # once, sacct keeps 34_[1-4%1] PENDING until the next task starts. It was listed twice
    # (squeue's range and sacct's), and `hpcdl status 34_2` was PENDING.
    controller["34"] = script.replace("0-3%1", "0-4%1")
    squeue["34"] = "34_[1,3-4%1]|PENDING|0:00|1:00:00|1|(JobArrayTaskLimit)\n" + (
        "34_0|RUNNING|0:03|1:00:00|1|n1\n"
    )
    sacct["34"] = "34_0|RUNNING\n34_[1-4%1]|PENDING\n"
    state = slurm_state.job_state("34")
    assert state["array_tasks"] == "34_0 RUNNING, 34_[1,3-4%1] PENDING, 34_2 CANCELLED"
    state = slurm_state.job_state("34_2")
    assert state["state"] == "CANCELLED", state
    # Without accounting (sacct fails) a task that has ended is in no record either: nothing
    # is called CANCELLED on the batch script's word.
    sacct = None
    assert slurm_state.job_state("30_0")["state"] == "UNKNOWN"
    squeue["30"] = "30_2|RUNNING|0:03|1:00:00|1|n1\n"
    assert slurm_state.job_state("30")["array_tasks"] == "30_2 RUNNING"
    # Once the controller has forgotten the array, no Slurm record names 30_3: as before.
    sacct = {"30": "30_0|COMPLETED\n30_1|COMPLETED\n30_2|COMPLETED\n"}
    squeue["30"] = ""
    del controller["30"]
    assert main(["status", "30_3"]) == 2
    assert "neither squeue nor sacct knows it" in capsys.readouterr().err
    assert main(["status", "30_9"]) == 2  # no such task


def test_array_task_ids_read_as_sbatch_writes_them() -> None:
    from hpcdl.launch.slurm_state import task_ids

    assert task_ids("52_[1-2%1]") == ["52_1", "52_2"]
    assert task_ids("52_[1,3-4%1]") == ["52_1", "52_3", "52_4"]
    assert task_ids("52_[0-6:3]") == ["52_0", "52_3", "52_6"]  # a batch script's step
    assert task_ids("52_3") == ["52_3"] and task_ids("52_[x]") == ["52_[x]"]


def test_a_job_ended_at_its_time_limit_before_its_warning_requeues_as_a_time_limit(
    tmp_path, monkeypatch
) -> None:
    """Slurm's SIGTERM at the time limit (the warning came too late): the job saved, so it
    comes back as after the warning, counted against cluster.max_requeues (was recorded as
    `cancelled` and never came back)."""
    from hpcdl.launch import slurm_job

    came_back: list[str] = []
    monkeypatch.setattr(
        slurm_job,
        "come_back",
        lambda cfg, path, env, job_id: came_back.append(job_id) or "requeued",
    )
    for limit in (1, 0):
        name = f"run{limit}"
        overrides = [
            f"run_dir={tmp_path / name}",
            "cluster=devcluster",
            f"cluster.max_requeues={limit}",
        ]
        run = create_run_dir(compose_config(overrides))[1]
        slurm_job_stops(run, monkeypatch, "SIGTERM", left_s=-24.0)
        end = run.read_attempts()[-1]
        assert (end["reason"], end["signal"]) == ("timeout", "SIGTERM")
        if limit:
            assert end["action"] == "requeued" and came_back == ["22"]
        else:
            assert end["action"] == "not requeued: cluster.max_requeues=0 timeouts reached"
    assert came_back == ["22"]


def test_max_requeues_counts_per_submission(tmp_path, monkeypatch) -> None:
    """A run out of time-limit requeues, continued with `hpcdl resume` (a new job: its start
    has no restart count), requeues again at its next limit, up to cluster.max_requeues
    (it was refused every time: the count spanned every submission the run ever had, so
    each `hpcdl resume` bought one allocation). Requeued attempts of the same job count."""
    from hpcdl.launch import slurm_job

    came_back: list[str] = []
    monkeypatch.setattr(
        slurm_job,
        "come_back",
        lambda cfg, path, env, job_id: came_back.append(job_id) or "requeued",
    )
    overrides = [f"run_dir={tmp_path / 'run'}", "cluster=devcluster", "cluster.max_requeues=1"]
    run = create_run_dir(compose_config(overrides))[1]
    out_of_requeues = "not requeued: cluster.max_requeues=1 timeouts reached"
    for restart_count, action in [
        (0, "requeued"),  # the first submission: its one requeue
        (1, out_of_requeues),
        (0, "requeued"),  # `hpcdl resume`: a new submission, its own requeue
        (1, out_of_requeues),
    ]:
        slurm_job_stops(run, monkeypatch, "SIGUSR2", 40.0, restart_count)
        end = run.read_attempts()[-1]
        assert (end["reason"], end["action"]) == ("timeout", action)
    assert came_back == ["22", "22"]


def test_an_array_task_cancelled_while_queued_is_cancelled_not_pending(
    tmp_path, monkeypatch, capsys
) -> None:
    # Before: PENDING from its array's sacct record while other tasks waited, then UNKNOWN.
    from hpcdl.launch.slurm_state import ARRAY_RECORD, NOT_IN_ACCOUNTING

    trial = new_run(tmp_path, "trial")
    trial.record_submission("38_2", "devcluster", trial.log_dir)
    answers = [
        {"state": "PENDING", "source": f"{ARRAY_RECORD} 38_[1-2%1]: it never ran)"},
        {"state": "UNKNOWN", "source": NOT_IN_ACCOUNTING},
    ]
    for answer in answers:
        monkeypatch.setattr(
            "hpcdl.launch.monitor.job_state", lambda job_id, a=answer: {"job_id": job_id, **a}
        )
        assert status_lines(trial, capsys)["state"] == "CANCELLED"
    # The same task once it has run: the scheduler's word, then the run dir's, as before.
    trial.append_attempt({"event": "start", "job_id": "40", "array_job": "38", "array_task": "2"})
    assert status_lines(trial, capsys)["state"] != "CANCELLED"


def test_logs_of_an_earlier_job_of_the_run(tmp_path, monkeypatch, capsys) -> None:
    """After a resume (or a chain's next link) `hpcdl logs` shows the newest job's log; the
    failed one before it was only in logs/*.out."""
    run = new_run(tmp_path)
    run.log_dir.mkdir()
    for job, text in (("7", "NameError: bug\n"), ("9", "epoch 1\n")):
        run.record_submission(job, "devcluster", run.log_dir)
        run.rank_log(job, 0).write_text(text)
    scheduler(monkeypatch, "COMPLETED")
    assert main(["logs", str(run.path)]) == 0
    assert capsys.readouterr().out == "epoch 1\n"
    assert main(["logs", str(run.path), "--job", "7"]) == 0
    assert capsys.readouterr().out == "NameError: bug\n"
    assert main(["logs", str(run.path), "--job", "8"]) == 2
    assert (
        capsys.readouterr().err == f"error: --job 8: not a job of {run.path}; its jobs: 7, 9\n"
    )


def test_logs_of_an_earlier_local_attempt(tmp_path, capsys) -> None:
    """A cluster=local run resumed: its first attempt's rank log (the crash) was refused as
    `its Slurm jobs: none` (persona, FSDP)."""
    run = new_run(tmp_path)
    run.log_dir.mkdir()
    for job, text in (("9036", "ValueError: bad batch\n"), ("9100", "epoch 1\n")):
        run.append_attempt({"event": "start", "launcher": "local", "job_id": job, "world_size": 2})
        (run.log_dir / f"{job}_1_log.out").write_text(text)
        run.append_attempt({"event": "end", "launcher": "local", "job_id": job, "reason": "failed"})
    assert main(["logs", str(run.path), "--job", "9036", "--rank", "1"]) == 0
    assert capsys.readouterr().out == "ValueError: bad batch\n"
    assert main(["logs", str(run.path), "--job", "1"]) == 2
    assert capsys.readouterr().err == (
        f"error: --job 1: not a job of {run.path}; its jobs: 9036 (local), 9100 (local)\n"
    )


def test_a_big_sweeps_cancel_names_its_trials_and_jobs_as_ranges() -> None:
    """`hpcdl cancel SWEEP_DIR` of 1002 trials printed every index and job id (12 KB)."""
    from hpcdl.cli.cancel import job_ranges
    from hpcdl.number_ranges import number_ranges

    assert number_ranges([*range(1, 1000), 1001, 1003, 1004]) == "1-999, 1001, 1003-1004"
    jobs = [f"28_{i}" for i in range(1, 1000)] + ["30_0", "30_2", "45", "31_7"]
    assert job_ranges(jobs) == "28_[1-999], 30_[0,2], 45, 31_7"


def test_a_pending_jobs_reason_is_said_in_words(monkeypatch, capsys) -> None:
    """squeue's `(AssocGrpCPUMinutesLimit)` under `where`, unexplained, for a job that will
    not start until the account's allocation is renewed (a support ticket's question)."""
    from hpcdl.launch import monitor, slurm_state

    answers = {"squeue": "41|PENDING|0:00|10:00|1|(AssocGrpCPUMinutesLimit)\n", "sacct": None}
    monkeypatch.setattr(slurm_state, "query", lambda cmd: answers[cmd[0]])
    state = monitor.job_state("41")
    assert state["pending"] == (
        "waits until the allocation (CPU-minutes) is renewed: it is used up; ask your site, or "
        "use another cluster.account (AssocGrpCPUMinutesLimit)"
    )
    answers["squeue"] = "42|PENDING|0:00|10:00|1|(QOSMaxWallDurationPerJobLimit)\n"
    assert monitor.job_state("42")["pending"].startswith(
        "never starts: cluster.timeout_min is over the QOS's MaxWall"
    )
    answers["squeue"] = "43|PENDING|0:00|10:00|1|(SomethingNew)\n"
    assert "pending" not in monitor.job_state("43")  # not known here: squeue's word only
    answers["squeue"] = "44|RUNNING|0:06|10:00|1|n1\n"
    assert "pending" not in monitor.job_state("44")


def test_a_run_stopped_short_is_given_its_next_command_and_a_peers_loss_is_a_consequence(
    tmp_path, monkeypatch, capsys
) -> None:
    from hpcdl.checkpoint_file import step_file_name

    # Out of requeues at a time limit: FAILED by Slurm (it exited 3), saved, healthy.
    run = new_run(tmp_path)
    run.record_submission("22", "devcluster", run.log_dir)
    run.append_attempt({"event": "start", "job_id": "22", "restart_count": 0})
    run.append_attempt(
        {"event": "end", "job_id": "22", "reason": "timeout",
         "action": "not requeued: cluster.max_requeues=1 timeouts reached"}
    )  # fmt: skip
    scheduler(monkeypatch, "FAILED")
    report = status_lines(run, capsys)  # no checkpoint: only a longer limit helps
    assert report["state"] == "TIMEOUT"
    assert report["next"] == (
        f"hpcdl resume {run.path} cluster.timeout_min=MINUTES (no checkpoint was saved before "
        "the limit: it starts again from the beginning, so give it a longer one)"
    )
    killed = new_run(tmp_path, "killed")  # Slurm's kill at the limit, before any save
    killed.record_submission("21", "devcluster", killed.log_dir)
    killed.append_attempt({"event": "start", "job_id": "21", "restart_count": 0})
    scheduler(monkeypatch, "TIMEOUT")
    report = status_lines(killed, capsys)
    assert report["state"] == "TIMEOUT" and report["next"].startswith(
        f"hpcdl resume {killed.path} cluster.timeout_min=MINUTES (no checkpoint"
    ), report
    scheduler(monkeypatch, "FAILED")
    run.checkpoint_dir.mkdir(exist_ok=True)
    (run.checkpoint_dir / step_file_name(120)).write_bytes(b"x")
    report = status_lines(run, capsys)
    assert report["state"] == "TIMEOUT"  # its own record says so; Slurm's word was FAILED
    assert report["next"] == (
        f"hpcdl resume {run.path} (continues from the checkpoint saved as it stopped; add "
        "cluster.timeout_min=MINUTES for a longer limit)"
    )
    assert "cause" not in report  # it stopped itself

    # Rank 1 killed: rank 0's end record holds its loss of the peer, the cause names rank 1.
    run.record_submission("23", "devcluster", run.log_dir)
    run.append_attempt({"event": "start", "job_id": "23", "restart_count": 0})
    lost = "RuntimeError: [gloo] Read error [10.0.0.2]:1162: Connection reset by peer"
    run.append_attempt({"event": "end", "job_id": "23", "reason": "failed", "error": lost})
    run.log_dir.mkdir(exist_ok=True)
    (run.log_dir / "23_0_log.out").write_text(f"{lost}\n")
    (run.log_dir / "23_1_log.out").write_text("epoch 1/5\n")  # died without a word
    report = status_lines(run, capsys)
    assert report["cause"].startswith("rank 1: ended without an error of its own"), report
    assert report["last_end"] == f"failed, a consequence of the cause below: {lost}"
    assert report["next"] == (
        f"hpcdl resume {run.path} once the cause is fixed (continues from the newest checkpoint)"
    )


def test_a_running_programs_ranks_show_how_long_ago_each_wrote(tmp_path: Path) -> None:
    """`hpcdl status` of a running `hpcdl run` program: each rank's last output (its log's
    mtime), so that a rank that hangs shows without any timeout; none for cluster=debug."""
    import time

    from hpcdl.launch.monitor import Launch, last_outputs

    run = RunDir(tmp_path)
    run.log_dir.mkdir(parents=True)
    now = time.time()
    for rank, age_s in ((0, 5), (1, 14 * 60), (10, 9000)):
        log = run.log_dir / f"77_{rank}_log.out"
        log.write_text("step\n")
        os.utime(log, (now - age_s, now - age_s))
    (run.log_dir / "76_0_log.out").write_text("an earlier job's\n")
    shown = last_outputs(run, Launch("local", "77"), now)
    assert list(shown.items()) == [
        ("rank 0", "last output 5 s ago"),
        ("rank 1", "last output 14 min ago"),
        ("rank 10", "last output 2.5 h ago"),
    ]
    assert last_outputs(run, Launch("debug", None), now) == {}


def test_a_program_that_did_not_confirm_its_stop_is_not_promised_a_stop_checkpoint(
    tmp_path, monkeypatch, capsys
) -> None:
    """`hpcdl cancel` of an `hpcdl run` program that SIGTERM ended (status 143, no save):
    `next:` promised "the checkpoint saved as it stopped", and the resume redid the work
    since its last periodic save (a trial on the dev cluster)."""
    from hpcdl.checkpoint_file import step_file_name
    from hpcdl.cli.compose import compose_config
    from hpcdl.config.schema import ScriptConfig

    cfg = compose_config([f"run_dir={tmp_path / 'scr'}"], script=ScriptConfig(["python", "t.py"]))
    run = create_run_dir(cfg)[1]
    run.record_submission("31", "devcluster", run.log_dir)
    run.checkpoint_dir.mkdir(exist_ok=True)
    (run.checkpoint_dir / step_file_name(170)).write_bytes(b"x")  # a periodic save
    scheduler(monkeypatch, "CANCELLED")
    for status, promised in ((143, False), (3, True)):
        run.append_attempt({"event": "start", "job_id": "31", "restart_count": 0})
        run.record_program_end(12.0, status)
        run.append_attempt({"event": "end", "job_id": "31", "reason": "cancelled"})
        shown = status_lines(run, capsys)["next"]
        assert ("saved as it stopped" in shown) is promised, shown
        assert ("ended with status 143 when asked to stop, not 3" in shown) is not promised
