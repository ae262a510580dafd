"""cluster=local: N ranks on this machine through submitit's local executor, in the foreground.

The ranks see the same kind of environment a Slurm job gets (rank, world, local rank from
submitit), so this is the Slurm code path without a cluster. Ctrl-C or SIGTERM to this
process becomes SIGTERM to every rank: each stops at the next step boundary and saves. The
ranks are in the terminal's foreground process group as well, so a Ctrl-C typed there also
reaches them directly, as SIGINT, before that SIGTERM (an `hpcdl run` program still gets
one signal: hpcdl.script_job).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Optional

from hpcdl.config.schema import Config, tasks_per_node
from hpcdl.errors import HpcdlError, plural
from hpcdl.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED
from hpcdl.launch.diagnose import ERROR_LINE, describe, root_cause
from hpcdl.launch.foreground import record_end, record_start
from hpcdl.launch.launcher_watch import FOREGROUND_VAR, describe_foreground
from hpcdl.launch.logtail import LineEcho
from hpcdl.launch.rank_main import LOCAL_GPUS_VAR
from hpcdl.progress import silence_stdout
from hpcdl.rundir import RunDir
from hpcdl.workdir import in_workdir

# How often the foreground process polls the job and copies rank 0's log to the terminal.
POLL_S = 0.2
# submitit's job-start and job-end lines in each rank's log: kept there, not echoed (a local
# run's terminal shows rank 0's own output). Its warnings and errors are echoed.
SUBMITIT_INFO = b"submitit INFO ("


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def exported(values: Mapping[str, str]) -> Iterator[None]:
    """os.environ with `values` while submitit starts its controller (which copies it), and
    as it was afterwards: a notebook's next runs, in-process ones too, must not inherit one
    run's cluster.env, MASTER_PORT or GPUs (hpcdl.submit runs many in one interpreter)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def ranks_pythonpath(cfg: Config) -> dict[str, str]:
    """PYTHONPATH for the ranks with the folders the config's own modules are imported from
    here appended ({} when it has all): a script of the Python API that put its package on
    sys.path, not on PYTHONPATH, passed the check here, and its ranks could not import it."""
    from hpcdl.launch.slurm import custom_targets
    from hpcdl.launch.snapshot import import_roots

    path = cfg.cluster.env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    entries = [e for e in path.split(os.pathsep) if e]
    known = {str(Path(e).resolve()) for e in entries}
    added = [str(r) for r in import_roots(custom_targets(cfg)) if str(r) not in known]
    return {"PYTHONPATH": os.pathsep.join([*entries, *added])} if added else {}


def local_gpus(cfg: Config, environ: Mapping[str, str]) -> Optional[str]:
    """The CUDA_VISIBLE_DEVICES of the ranks: the first cluster.gpus_per_node of the GPUs
    the launching shell (or cluster.env) shows, as indices or GPU-/MIG- UUIDs, so a run on a
    shared machine or an interactive allocation stays on the GPUs it was given; None
    without a setting (the machine's first GPUs, as submitit's local executor gives them)."""
    visible = cfg.cluster.env.get("CUDA_VISIBLE_DEVICES", environ.get("CUDA_VISIBLE_DEVICES"))
    if visible is None:
        return None
    wanted = cfg.cluster.gpus_per_node
    entries = [entry.strip() for entry in str(visible).split(",") if entry.strip()]
    if wanted > len(entries):
        raise HpcdlError(
            f"cluster.gpus_per_node={wanted}: CUDA_VISIBLE_DEVICES={visible!r} shows "
            f"{len(entries)} GPU(s); ask for at most {len(entries)}, or unset "
            "CUDA_VISIBLE_DEVICES to use the machine's first GPUs"
        )
    return ",".join(entries[:wanted])


def run_local(cfg: Config, run_dir: RunDir) -> int:
    import submitit

    from hpcdl.job import run_job

    num_tasks = tasks_per_node(cfg.cluster)
    from hpcdl.launch.rank_main import rank_command

    class Executor(submitit.LocalExecutor):
        @property
        def _submitit_command_str(self) -> str:
            return rank_command(self.python, str(self.folder))

    executor = Executor(folder=str(run_dir.log_dir))
    executor.update_parameters(
        tasks_per_node=num_tasks,
        nodes=1,
        timeout_min=cfg.cluster.timeout_min,
        gpus_per_node=cfg.cluster.gpus_per_node,
        signal_delay_s=cfg.cluster.signal_delay_s,
        stderr_to_stdout=True,
    )
    ranks_env = {
        FOREGROUND_VAR: describe_foreground(run_dir.lock_file),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        **cfg.cluster.env,
        **ranks_pythonpath(cfg),  # cluster.env's own PYTHONPATH, extended
    }
    gpus = local_gpus(cfg, os.environ)
    if gpus is not None:
        ranks_env[LOCAL_GPUS_VAR] = gpus
    # The controller must not see the terminal's Ctrl-C: on SIGINT it kills ranks after 1 s,
    # which could cut a checkpoint save short. It inherits SIG_IGN; the ranks install their
    # own handlers, and we forward a SIGTERM to it ourselves, from the moment it exists.
    stopper: Optional[RankStopper] = None
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        # The controller, and so every rank, starts in the run's folder (hpcdl.workdir).
        with in_workdir(cfg.workdir), exported(ranks_env):
            job = executor.submit(run_job, str(run_dir.path))
        stopper = RankStopper(job, stopping_what(cfg), num_tasks)
    finally:
        if stopper is None:
            signal.signal(signal.SIGINT, previous)
    try:
        record_start(run_dir, "local", str(job.job_id), num_tasks)
        ranks = plural(num_tasks, "rank")
        print(f"local job {job.job_id}: {ranks}, logs in {run_dir.log_dir}", flush=True)
        _wait(job, stopper)
    finally:
        stopper.restore(previous)
    code = _exit_code(job)
    record_end(run_dir, "local", str(job.job_id), code)
    return code


def stopping_what(cfg: Config) -> str:
    """What the foreground says it does on a stop: `hpcdl train`'s ranks stop at a step
    boundary; an `hpcdl run` program gets SIGTERM from its rank's wrapper (hpcdl.script_job)
    and decides itself."""
    if cfg.script is not None:
        return "asking the program to stop (SIGTERM to each rank; again to end it now)"
    return "stopping all ranks at the next step"


class RankStopper:
    """Ctrl-C, SIGTERM or a hangup to this process: one SIGTERM to submitit's controller,
    which forwards it to every rank. Its handlers go in as it is made."""

    def __init__(self, job: Any, what: str, num_tasks: int) -> None:
        self.job, self.what, self.num_tasks = job, what, num_tasks
        self.stopping = False
        self.pending = False  # a stop asked for before the ranks could take it
        # A hangup (terminal closed, ssh gone) stops the ranks as Ctrl-C does, unless nohup
        # asked for it to be ignored.
        # SIGUSR1/2, Slurm's usual warning signals, sent by hand to try a stop: as SIGTERM
        # (their default action ended this command at once, its ranks left to notice).
        signals = [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2]
        if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
            signals.append(signal.SIGHUP)
        self.old = {s: signal.signal(s, self._forward) for s in signals}

    def restore(self, sigint: Any) -> None:
        """The handlers from before (SIGINT's from before the controller was started)."""
        for s, h in self.old.items():
            signal.signal(s, sigint if s == signal.SIGINT else h)

    def _forward(self, signum: int, _frame: Any) -> None:
        self.stop(signal.Signals(signum).name)

    def stop(self, why: str) -> None:
        if not self.stopping:
            with contextlib.suppress(OSError):  # a hung-up terminal: nowhere to say it
                print(f"\n{why}: {self.what}", flush=True)
        self.stopping = True
        self.send()

    def send(self) -> None:
        # submitit's controller forwards SIGTERM to every task. A SIGTERM that comes before
        # its handler is in, or before a rank's own are (Python's first milliseconds),
        # kills it: no rank trains, and the run looks failed. Each rank has its handlers once
        # it has written to its log (submitit's first line comes after them), so until every
        # rank has, the stop waits.
        process = self.job._process
        if process is None or not _ranks_listening(self.job, self.num_tasks):
            self.pending = True
            return
        self.pending = False
        process.send_signal(signal.SIGTERM)


def _wait(job: Any, stopper: RankStopper) -> None:
    """Until every rank has ended, rank 0's log copied to the terminal."""
    echo = LineEcho(Path(job.paths.stdout), hidden=SUBMITIT_INFO, fold_peer_loss=True)  # rank 0
    while True:
        try:
            echo.poll()
        except OSError:  # the reader went away (`| head`, a closed terminal)
            silence_stdout()
            stopper.stop("output closed")
            echo = LineEcho(Path(os.devnull), hidden=b"")
        if job.done():
            break
        if stopper.pending:
            stopper.send()
        time.sleep(POLL_S)
    with contextlib.suppress(OSError):
        echo.poll(final=True)


# A rank's log that has existed this long without a line: its process has long been past
# its first milliseconds, so has its handlers in (should its first line never come).
SURELY_STARTED_S = 3.0


def _ranks_listening(job: Any, num_tasks: int) -> bool:
    """Whether every rank has written to its log (or had the time to), so has its stop
    handlers in."""
    from submitit.core.utils import JobPaths

    folder = Path(job.paths.folder)
    for rank in range(num_tasks):
        log = JobPaths(folder, job.job_id, rank).stdout
        try:
            stat = log.stat()
        except OSError:
            return False
        if stat.st_size == 0 and time.time() - stat.st_mtime < SURELY_STARTED_S:
            return False
    return True


def _exit_code(job: Any) -> int:
    try:
        outcomes = job.results()
    except Exception as err:  # submitit wraps the rank's exception in its own types
        text = str(err)
        ours = re.findall(r"^\s*(?:\[rank\d+\]: )?hpcdl\.[\w.]+Error: (.*)$", text, flags=re.M)
        if ours:  # bad input found inside the job (data contents, a checkpoint): one line
            print(f"error: {ours[-1]}", file=sys.stderr)
            return EXIT_BAD_INPUT
        logs = Path(job.paths.stdout).parent
        rank, detail = root_cause(logs, job.job_id) or (None, None)
        if detail is None:
            errors = ERROR_LINE.findall(text)
            detail = errors[-1] if errors else text.strip().splitlines()[0]
        who = f"rank {rank}" if rank is not None else "a rank"
        print(f"error: {who} failed: {detail} (logs: {logs})", file=sys.stderr)
        # Also while stopping: the stop's checkpoint may not have been saved ("interrupted;
        # checkpoint saved" would say it was); resume uses the newest valid one either way.
        return EXIT_FAILED
    code = max(o.exit_code for o in outcomes)
    failed = [o.rank for o in outcomes if o.failed_exit_code not in (None, EXIT_INTERRUPTED)]
    if failed and failed != [0]:  # the terminal showed rank 0's log only: name the cause
        logs = Path(job.paths.stdout).parent
        cause = root_cause(logs, job.job_id)
        if cause is not None and cause[0] != 0:
            print(f"error: {describe(cause)} (logs: {logs})", file=sys.stderr)
    return code
