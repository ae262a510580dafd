"""The stall watchdog: a rank that hangs inside a step dumps its stacks, records the stall
and ends the job with EXIT_STALLED, instead of holding its nodes until the time limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hpcdl.exit_codes import EXIT_STALLED
from hpcdl.watchdog import Stall, Watchdog

# A step hook that hangs (sleeps in a loop, as a rank stuck in a collective would) at one step.
HANG = """\
import os, time

def after_step(event):
    if event.global_step == int(os.environ["HANG_AT"]) and str(event.rank) in os.environ["HANG_RANKS"]:
        while True:
            time.sleep(1)
"""


def recorded_stalls() -> tuple[list[Stall], threading.Event, Callable[[Stall], None]]:
    """(the stalls seen, set at the first, the on_stall that records them)."""
    stalls: list[Stall] = []
    fired = threading.Event()

    def on_stall(stall: Stall) -> None:
        stalls.append(stall)
        fired.set()

    return stalls, fired, on_stall


def test_beats_keep_it_quiet_and_a_missing_beat_names_the_phase() -> None:
    stalls, fired, on_stall = recorded_stalls()
    with Watchdog(0.5, on_stall) as dog:
        for _ in range(10):
            time.sleep(0.1)
            dog.beat()
        assert not stalls
        dog.beat("evaluation")
        assert fired.wait(5)
    assert stalls[0].phase == "evaluation" and stalls[0].seconds > 0.5


def test_a_wait_for_the_other_ranks_keeps_the_deadline_and_is_named() -> None:
    stalls, fired, on_stall = recorded_stalls()
    with Watchdog(0.5, on_stall) as dog:
        dog.beat()
        with dog.waiting("step sums"):  # no beat: the step's deadline still counts
            assert fired.wait(5)
    assert stalls[0].phase == "waiting for the other ranks (step sums)"
    assert stalls[0].seconds > 0.5


def train_in(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """`hpcdl train run_dir=run ARGS` in tmp_path, with tmp_path's modules importable."""
    return subprocess.run(
        [sys.executable, "-m", "hpcdl.cli.main", "train", "run_dir=run", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(tmp_path), **env},
    )


def run_hanging(
    tmp_path: Path, *extra: str, ranks: str = "0"
) -> tuple[subprocess.CompletedProcess, float]:
    (tmp_path / "hang.py").write_text(HANG)
    started = time.monotonic()
    out = train_in(
        tmp_path,
        "trainer.max_epochs=3",
        "trainer.stall_timeout_s=3",
        "trainer.step_hooks=[hang:after_step]",
        *extra,
        HANG_AT="5",
        HANG_RANKS=ranks,
    )
    return out, time.monotonic() - started


def stall_records(run: Path) -> list[dict]:
    lines = (run / "attempts.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == "stall"]


def test_a_rank_hanging_in_a_step_dumps_its_stacks_and_exits(tmp_path) -> None:
    out, took = run_hanging(tmp_path)
    assert out.returncode == EXIT_STALLED, out.stderr[-2000:]
    assert took < 60
    log = out.stderr
    assert "rank 0 made no progress for" in log and "'training'" in log
    assert "hang.py" in log and "after_step" in log  # the stack shows where it hangs
    records = stall_records(tmp_path / "run")
    assert [(r["rank"], r["phase"]) for r in records] == [(0, "training")]


def test_one_hanging_rank_of_two_ends_the_whole_local_job(tmp_path) -> None:
    # Rank 1 hangs inside its step; rank 0 waits in the next step's all-reduce. Rank 1's
    # watchdog fires first and ends it; rank 0's collective then fails (or its own
    # watchdog fires): the job ends non-zero, and no rank is left behind.
    out, took = run_hanging(tmp_path, "cluster=local", "cluster.tasks_per_node=2", ranks="1")
    assert out.returncode != 0
    assert took < 120
    records = stall_records(tmp_path / "run")
    assert (1, "training") in {(r["rank"], r["phase"]) for r in records}
    assert "rank 1 failed: stalled: rank 1 made no progress" in out.stdout + out.stderr
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "run")], capture_output=True, text=True)
    assert left.stdout.strip() == "", "orphaned rank processes"


def test_requeue_on_stall_stops_after_max_requeues(tmp_path, monkeypatch) -> None:
    """A stall that comes back at the same place (with NCCL, a rank waiting on a peer's
    repeatable error) requeues at most cluster.max_requeues times; failed requeues do not
    count."""
    import hpcdl.requeue
    from hpcdl.job import requeue_after_stall
    from hpcdl.rundir import RunDir

    asked: list[str] = []
    monkeypatch.setattr(
        hpcdl.requeue, "requeue", lambda job, path: (asked.append(job), "requeued")[1]
    )
    run = RunDir(tmp_path)
    run.append_attempt({"event": "stall", "action": "requeue failed: no such job"})
    for _ in range(2):
        assert requeue_after_stall("7", run, max_requeues=2) == "requeued"
        run.append_attempt({"event": "stall", "action": "requeued"})
    assert requeue_after_stall("7", run, max_requeues=2) == (
        "not requeued: cluster.max_requeues=2 stall requeues reached"
    )
    assert asked == ["7", "7"]
    # `hpcdl resume` submits a new job (a start with no restart count): its own two.
    run.append_attempt({"event": "start", "job_id": "8", "restart_count": 0})
    assert requeue_after_stall("8", run, max_requeues=2) == "requeued"
    assert asked == ["7", "7", "8"]


# A model whose first forward on rank 1 takes longer than trainer.stall_timeout_s (as a
# compilation or a cold file system can), well within the first step's allowance (2x).
SLOW_FIRST_STEP = """\
import os, time
import torch
import torch.distributed as dist

class SlowStart(torch.nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.layer = torch.nn.Linear(input_shape[0], num_classes)
        self.slept = False

    def forward(self, x):
        if not self.slept and dist.is_initialized():  # in a rank: torchrun's variables
            assert os.environ["RANK"] == os.environ["LOCAL_RANK"] == str(dist.get_rank())
            assert os.environ["WORLD_SIZE"] == os.environ["LOCAL_WORLD_SIZE"] == "2"
        if not self.slept and os.environ.get("RANK") == "1":
            time.sleep(float(os.environ["SLOW_FOR"]))
        self.slept = True
        return self.layer(x)


def after_step(event):  # the collectives' timeout after each step, as rank 0 sees it
    if event.rank == 0:
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        with open("timeouts.txt", "a") as out:
            out.write(f"{backend.options._timeout.total_seconds()}\\n")
"""


def test_a_slow_first_step_on_one_rank_is_allowed_in_the_collectives_too(tmp_path) -> None:
    # Rank 0 waits for rank 1's first step in the step's collectives: they must wait as
    # long as the watchdog's first-step allowance (2 x stall_timeout_s), not time out
    # after stall_timeout_s; later steps' collectives are bounded by stall_timeout_s again.
    # The model also reads torchrun's variables (RANK, ...), as users' code may.
    (tmp_path / "slow.py").write_text(SLOW_FIRST_STEP)
    out = train_in(
        tmp_path,
        "model=custom",
        "model.target=slow:SlowStart",
        "cluster=local",
        "cluster.tasks_per_node=2",
        "trainer.max_epochs=1",
        "trainer.stall_timeout_s=4",
        "trainer.step_hooks=[slow:after_step]",
        SLOW_FOR="6",
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert (tmp_path / "run" / "summary.json").exists()
    seen = set((tmp_path / "timeouts.txt").read_text().split())
    assert seen == {"4.0"}, seen  # from the first step's end on


# A rank stuck in C code that holds the interpreter lock (ctypes.PyDLL keeps it through the
# call): its watchdog thread cannot run, so only faulthandler's timer can end it.
HOLDS_THE_LOCK = """\
import ctypes, sys, time
from hpcdl import watchdog
watchdog.BACKSTOP_S = 1.0
with watchdog.Watchdog(0.5, lambda stall: print("python watchdog ran", flush=True)) as dog:
    time.sleep(0.3)
    dog.beat()
    print("holding the lock", file=sys.stderr, flush=True)
    ctypes.PyDLL(None).sleep(60)
print("not reached", flush=True)
"""


def test_a_rank_holding_the_interpreter_lock_in_c_code_is_ended_by_the_backstop(
    tmp_path: Path,
) -> None:
    from hpcdl.launch.diagnose import root_cause

    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", HOLDS_THE_LOCK], capture_output=True, text=True, timeout=50
    )
    took = time.monotonic() - started
    assert out.returncode == 1 and took < 30, (took, out.stdout, out.stderr)  # not sleep(60)
    assert "not reached" not in out.stdout and "python watchdog ran" not in out.stdout
    assert "holding the lock\nTimeout (0:00:0" in out.stderr, out.stderr
    assert "most recent call first" in out.stderr  # every thread's stack
    # hpcdl status's cause, from that log (as a Slurm task's: stderr in its log).
    (tmp_path / "7_1_log.out").write_text(out.stderr)
    (tmp_path / "7_0_log.out").write_text(
        "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Timed out waiting 15000ms for recv\n"
    )
    rank, cause = root_cause(tmp_path, "7") or (None, "")
    assert rank == 1 and cause.startswith(
        "stalled in C code holding Python's interpreter lock, so its watchdog could not run: "
        "ended 0:00:0"
    ), cause
