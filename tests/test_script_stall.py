"""`hpcdl run ... stall_timeout_s=N`: a rank whose program gives no sign of life (output,
an hpcdl.api call) for N seconds has its stacks dumped into its log, a stall recorded, and
is ended with status 4, so that the job frees its nodes (hpcdl.script_stall)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdl.cli.run import seconds_of
from hpcdl.errors import ConfigError
from hpcdl.exit_codes import EXIT_BAD_INPUT, EXIT_OK, EXIT_STALLED
from hpcdl.script_stall import BOOTSTRAP, StallWatch, beat, with_stack_dump
from tests.conftest import REPO, run_hpcdl

# Rank 1 waits for a peer that never comes (as at a barrier rank 0 never reaches); rank 0
# works on, printing.
HANG = """\
import os, time

def wait_for_peers():
    while True:
        time.sleep(1)

print(f"rank {os.environ['RANK']} starts", flush=True)
if os.environ["RANK"] == "1":
    wait_for_peers()
for i in range(200):
    print("working", i, flush=True)
    time.sleep(0.3)
"""

# Slow work that says so: 3 s of lines, then 3 s of hpcdl.api calls without a line.
SLOW = """\
import time
import hpcdl.api as hp

for i in range(10):
    print("step", i, flush=True)
    time.sleep(0.3)
for i in range(15):
    hp.stop_requested()
    time.sleep(0.2)
"""

SHOW = """\
import json, sys
print(json.dumps({"argv": sys.argv, "name": __name__, "path0": sys.path[0], "file": __file__}))
"""


def test_python_commands_are_started_through_the_bootstrap() -> None:
    py = sys.executable
    assert with_stack_dump([py, "train.py", "--lr", "1"]) == [
        py,
        "-c",
        BOOTSTRAP,
        "train.py",
        "--lr",
        "1",
    ]
    assert with_stack_dump(["python3", "-u", "-X", "dev", "-W", "ignore", "t.py"]) == [
        "python3", "-u", "-X", "dev", "-W", "ignore", "-c", BOOTSTRAP, "t.py",
    ]  # fmt: skip
    assert with_stack_dump(["python", "-u", "-m", "hpcdl.entry", "m:f", "{}"]) == [
        "python", "-u", "-c", BOOTSTRAP, "-m", "hpcdl.entry", "m:f", "{}",
    ]  # fmt: skip
    for other in (["bash", "run.sh"], ["torchrun", "t.py"], ["python", "-c", "pass"],
                  ["python", "-um", "pkg"], ["python"], ["python", "-m"]):  # fmt: skip
        assert with_stack_dump(other) is None, other


@pytest.mark.parametrize("form", ["script", "module"])
def test_the_bootstrap_runs_the_program_as_python_would(tmp_path: Path, form: str) -> None:
    """The same sys.argv, __name__, __file__ and first sys.path entry as without it."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "show.py").write_text(SHOW)
    target = ["pkg/show.py", "--lr", "1"] if form == "script" else ["-m", "pkg.show", "--lr", "1"]

    def seen(command: list[str]) -> dict:
        out = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    plain = [sys.executable, *target]
    booted = with_stack_dump(plain)
    assert booted is not None and seen(booted) == seen(plain)


def test_output_and_api_beats_keep_the_watch_quiet_and_silence_is_caught(tmp_path: Path) -> None:
    log = os.open(tmp_path / "rank.log", os.O_WRONLY | os.O_CREAT)
    beats = tmp_path / "beats" / "rank0"
    try:
        watch = StallWatch(0.5, beats, fds=(log,))
        assert watch.watches_output
        last: list[float] = []
        for i in range(12):  # 1.2 s: output first, then hpcdl.api's beats
            time.sleep(0.1)
            if i < 6:
                os.write(log, b"step\n")
            else:
                last.clear()  # past beat()'s own rate limit, for this test's pace
                beat(str(beats), last)
                os.utime(beats, ns=(i, i))  # a new mtime, also on a coarse-grained clock
            assert watch.silent_s() is None, i
        deadline = time.monotonic() + 5
        silent = None
        while silent is None and time.monotonic() < deadline:
            time.sleep(0.05)
            silent = watch.silent_s()
        assert silent is not None and 0.5 < silent < 1.5
    finally:
        os.close(log)


def test_a_terminal_or_pipe_is_not_watched(tmp_path: Path) -> None:
    read, write = os.pipe()
    try:
        assert not StallWatch(1.0, tmp_path / "beat", fds=(write,)).watches_output
    finally:
        os.close(read)
        os.close(write)


@pytest.mark.parametrize("value", ["abc", "0", "-5", "inf", "nan", ""])
def test_a_bad_timeout_is_refused_naming_the_key(value: str) -> None:
    with pytest.raises(ConfigError) as err:
        seconds_of("stall_timeout_s", value)
    assert str(err.value).startswith(f"stall_timeout_s={value!r}: ") and "\n" not in str(err.value)
    assert seconds_of("stall_timeout_s", "1800") == 1800.0


def test_a_bad_timeout_stops_hpcdl_run_before_anything_runs(tmp_path: Path) -> None:
    (tmp_path / "hang.py").write_text(HANG)
    args = [
        "run",
        "cluster=local",
        "stall_timeout_s=30min",
        "run_dir=run",
        "--",
        "python",
        "hang.py",
    ]
    out = run_hpcdl(*args, cwd=tmp_path, timeout=120)
    assert out.returncode == EXIT_BAD_INPUT, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: stall_timeout_s='30min': "), lines
    assert not (tmp_path / "run").exists()


def stall_records(run: Path) -> list[dict]:
    records = map(json.loads, (run / "attempts.jsonl").read_text().splitlines())
    return [r for r in records if r["event"] == "stall"]


def rank_log(run: Path, rank: int) -> Path:
    [path] = (run / "logs").glob(f"*_{rank}_log.out")
    return path


@pytest.mark.slow
def test_a_silent_rank_is_ended_with_its_stack_and_the_stall_recorded(tmp_path: Path) -> None:
    (tmp_path / "hang.py").write_text(HANG)
    run = tmp_path / "run"
    command = [sys.executable, "-m", "hpcdl.cli.main", "run", "cluster=local",
               "cluster.tasks_per_node=2", "stall_timeout_s=5", "run_dir=run", "--",
               "python", "hang.py"]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    # While it runs, `hpcdl status` shows each rank's last output: rank 1's goes stale.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (
        (run / "logs").is_dir() and any("rank 1 starts" in p.read_text() for p in (run / "logs").glob("*_1_log.out"))
    ):  # fmt: skip
        time.sleep(0.2)
    time.sleep(1.5)
    status = run_hpcdl("status", "run", cwd=tmp_path, timeout=60)
    stdout, stderr = proc.communicate(timeout=120)
    took = time.monotonic() - started
    assert "state: RUNNING" in status.stdout, status.stdout + status.stderr
    ago = {
        int(r): int(s) for r, s in re.findall(r"rank (\d): last output (\d+) s ago", status.stdout)
    }
    assert ago.keys() == {0, 1} and ago[0] <= 1 < ago[1] < 5, status.stdout

    assert proc.returncode == EXIT_STALLED, stdout + stderr
    assert took < 40  # start-up, the 5 s timeout, the dump, not rank 0's 60 s of work
    assert [(r["rank"], r["phase"]) for r in stall_records(run)] == [
        (1, "no output and no hpcdl.api call")
    ]
    log = rank_log(run, 1).read_text()
    said = (
        r"rank 1 made no progress for [56] s \(no output and no hpcdl.api call, stall_timeout_s=5\)"
    )
    assert re.search("^hpcdl: " + said, log, re.M), log
    assert 'hang.py", line 5 in wait_for_peers' in log, log  # the hanging line
    assert "completed successfully" not in log
    assert "ending this rank's program" in rank_log(run, 0).read_text()  # rank 0's, ended too
    assert re.search("error: rank 1: stalled: " + said, stderr), stderr
    after = run_hpcdl("status", "run", cwd=tmp_path, timeout=60)
    assert re.search("cause: rank 1: stalled: " + said, after.stdout), after.stdout
    assert "state: FAILED" in after.stdout and "last output" not in after.stdout


@pytest.mark.slow
def test_a_slow_program_that_prints_or_calls_the_api_is_not_stopped(tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text(SLOW)
    out = run_hpcdl(
        "run", "cluster=local", "stall_timeout_s=2", "run_dir=run", "--", "python", "slow.py",
        cwd=tmp_path, timeout=120, env={"PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert out.returncode == EXIT_OK, out.stdout + out.stderr
    assert stall_records(tmp_path / "run") == []
    assert "step 9" in out.stdout


def test_only_the_first_stalled_rank_on_slurm_requeues_with_requeue_on_stall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cluster.requeue_on_stall for `hpcdl run`: the rank whose stall is the job's first
    failure requeues the job (one requeue per stall, counted against max_requeues); a rank
    that stalls after it only records its stall. Each program is ended (SIGTERM)."""
    from dataclasses import replace

    import hpcdl.requeue
    from hpcdl.config.schema import Config, ScriptConfig
    from hpcdl.env import RankEnv
    from hpcdl.rundir import RunDir
    from hpcdl.script_job import PeerFailure, end_stalled

    asked: list[str] = []
    monkeypatch.setattr(
        hpcdl.requeue, "requeue", lambda job, path: (asked.append(job), "requeued")[1]
    )
    base = Config()
    cfg = replace(
        base,
        script=ScriptConfig(command=["python", "x.py"], stall_timeout_s=3.0),
        cluster=replace(base.cluster, requeue_on_stall=True),
    )
    run = RunDir(tmp_path)
    for rank in (1, 0):
        env = RankEnv(rank=rank, world_size=2, launcher="slurm", job_id="51")
        program = subprocess.Popen(["sleep", "60"], start_new_session=True)
        end_stalled(cfg, run, env, program.pid, 3.2, False, PeerFailure(run, env))
        assert program.wait(timeout=10) == -15  # SIGTERM
    assert asked == ["51"]
    assert stall_records(tmp_path) == [
        {"event": "stall", "job_id": "51", "rank": 1, "phase": "no output and no hpcdl.api call",
         "seconds": 3.2, "action": "requeued"},
        {"event": "stall", "job_id": "51", "rank": 0, "phase": "no output and no hpcdl.api call",
         "seconds": 3.2},
    ]  # fmt: skip
    # Rank 0's end record, as the requeue's SIGTERM ends its wrapper: the stall's requeue,
    # not "an outside scontrol requeue, or a failed node" (a trial on the dev cluster).
    from hpcdl.launch.slurm_job import stall_requeue

    assert stall_requeue(run) == "requeued after rank 1 stalled (cluster.requeue_on_stall)"
    run.append_attempt({"event": "start", "job_id": "51", "restart_count": 1})
    assert stall_requeue(run) is None  # the next attempt's own requeue would be an outsider's
