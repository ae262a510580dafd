"""A stop while the ranks of a local run are still starting (Ctrl-C as they load torch):
recorded from a rank's first moment, over submitit's own handlers, and passed on only once
every rank listens, so that the run stops with a checkpoint instead of failing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

EARLY = """
import os, signal, sys
from hpcdl.signals import record_early_stops, stop_on_signals
from hpcdl.launch.rank_main import _keep_early_stops_over_submitits
from submitit.core.job_environment import JobEnvironment

record_early_stops()
os.kill(os.getpid(), signal.SIGTERM)  # before the job's handlers: recorded, not fatal
_keep_early_stops_over_submitits()
class Env(JobEnvironment):  # submitit's handlers, as process_job puts them in
    def __init__(self):
        pass
Env()._handle_signals(None, None)
os.kill(os.getpid(), signal.SIGHUP)  # submitit would have logged SIGTERM and dropped it
with stop_on_signals(("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR2")) as flag:
    os.kill(os.getpid(), signal.SIGINT)
    print(flag.signal_name, ",".join(flag.received))
"""


def test_a_stop_before_the_jobs_handlers_is_recorded_and_taken_over() -> None:
    done = subprocess.run([sys.executable, "-c", EARLY], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["SIGTERM", "SIGTERM,SIGHUP,SIGINT"]


def test_the_stop_waits_until_every_rank_has_written_to_its_log(tmp_path: Path) -> None:
    """Before every rank has its handlers (it has written nothing yet), the SIGTERM would
    kill it: the stopper keeps it pending and sends it once they all have."""
    from hpcdl.launch.local import RankStopper

    controller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    logs = [tmp_path / f"42_{rank}_log.out" for rank in range(2)]
    paths = SimpleNamespace(folder=tmp_path, stdout=logs[0])
    job = SimpleNamespace(job_id="42", paths=paths, _process=controller)
    previous = signal.getsignal(signal.SIGINT)
    stopper = RankStopper(job, "stopping all ranks at the next step", 2)
    try:
        logs[0].write_text("submitit INFO (...) - Starting with JobEnvironment(...)\n")
        logs[1].write_text("")  # rank 1 started, nothing written yet
        os.kill(os.getpid(), signal.SIGINT)
        assert stopper.stopping and stopper.pending and controller.poll() is None
        stopper.send()  # still nothing from rank 1: still pending
        assert stopper.pending and controller.poll() is None
        # A log with no line for long (a quieter submitit): its rank is long past its start.
        old = time.time() - 10
        os.utime(logs[1], (old, old))
        stopper.send()
        assert not stopper.pending
        assert controller.wait(timeout=30) == -signal.SIGTERM
    finally:
        stopper.restore(previous)
        controller.kill()
    assert signal.getsignal(signal.SIGINT) is previous


def test_slurms_warning_signals_sent_by_hand_stop_the_ranks_as_sigterm(tmp_path: Path) -> None:
    """SIGUSR2 to `hpcdl run cluster=local` ended the command at once (exit 140), its ranks
    left to notice (persona, FSDP): now a stop like SIGTERM."""
    from hpcdl.launch.local import RankStopper

    controller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    logs = [tmp_path / f"43_{rank}_log.out" for rank in range(2)]
    for log in logs:
        log.write_text("submitit INFO (...) - Starting with JobEnvironment(...)\n")
    job = SimpleNamespace(
        job_id="43", paths=SimpleNamespace(folder=tmp_path, stdout=logs[0]), _process=controller
    )
    previous = signal.getsignal(signal.SIGINT)
    stopper = RankStopper(job, "stopping all ranks at the next step", 2)
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        assert stopper.stopping and controller.wait(timeout=30) == -signal.SIGTERM
    finally:
        stopper.restore(previous)
        controller.kill()
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL


def test_ctrl_c_as_the_ranks_start_stops_with_a_checkpoint_not_a_failure(
    tmp_path: Path,
) -> None:
    """A terminal's Ctrl-C to the whole process group the moment the ranks are spawned:
    whenever it lands, the run ends interrupted with a checkpoint (exit 3), or, before
    anything was launched, with `interrupted (Ctrl-C)` (130). Before, a rank killed in its
    start-up made it `error: a rank failed` (exit 1, FAILED)."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "hpcdl.cli.main", "train", f"run_dir={run_dir}"]
    proc = subprocess.Popen(
        [*cmd, "cluster=local", "cluster.tasks_per_node=2", "trainer.max_epochs=200"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not list(run_dir.glob("logs/*_0_log.out")):  # the controller is spawning ranks
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3, output
    assert "error" not in output and "Continue with: hpcdl resume" in output
    assert list((run_dir / "checkpoints").glob("step_*.pt"))
