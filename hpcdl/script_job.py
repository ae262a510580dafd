"""The job payload of `hpcdl run`: the user's own program, one per rank (srun) or one
torchrun per node, with hpcdl's stop contract around it.

    MASTER_PORT agreed by the job's wrappers (hpcdl.script_port) -> the rank env exported
    (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, HPCDL_*) ->
    the program in its own process group -> on a stop signal:
    the stop file appears and the signal is forwarded -> the program's exit decides:
    0 = completed, 3 (EXIT_INTERRUPTED) or any exit after a stop = requeue, else failed.
    With stall_timeout_s, a program silent that long (hpcdl.script_stall) has its stacks
    dumped, a stall recorded, and is ended: status 4 (EXIT_STALLED), as hpcdl train's.

Stdlib only: the program imports torch itself if it wants it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Optional

from hpcdl.env import RankEnv, rank_env_from
from hpcdl.exit_codes import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_OK, EXIT_STALLED
from hpcdl.script_group import GroupWatch
from hpcdl.script_port import PortError, agreed_port
from hpcdl.script_stall import StallWatch, dump_stacks, with_stack_dump

if TYPE_CHECKING:
    from pathlib import Path

    from hpcdl.config.schema import Config, ScriptConfig
    from hpcdl.job import JobOutcome
    from hpcdl.rundir import RunDir
    from hpcdl.signals import StopFlag

# How often the wrapper looks at the program and at the stop flag.
POLL_S = 0.2
# A program still running this long after a stop gets a line saying how to end it.
STOP_HINT_S = 60.0
# A rank's program that fails ends the others' (as torchrun does): its wrapper makes the
# attempt's failed file, which every wrapper looks for this often (a stat on the shared run
# dir); without it, a peer in init_process_group or a collective waits out its timeout
# (30 minutes in gloo), and a peer that needs no collective runs on unaware.
PEER_POLL_S = 1.0
# How long a program asked to stop because a peer failed, or one whose processes outlive
# it, has to end before SIGKILL.
GRACE_S = 10.0
# `$HPCDL_RUN_DIR` or `${HPCDL_RUN_DIR}` in the command, quoted so that the shell left it:
# replaced by the run dir, the value the program's variable of that name holds. A sweep's
# trials share the working directory; `--out '$HPCDL_RUN_DIR/ck'` gives each its own folder
# without a shell around the program.
RUN_DIR_REF = re.compile(r"\$(?:\{HPCDL_RUN_DIR\}|HPCDL_RUN_DIR(?![A-Za-z0-9_]))")
# A stalled program's phase in its `stall` record (hpcdl train's are the trainer's).
STALL_PHASE = "no output and no hpcdl.api call"


def _forwarded(name: str | None, launcher: str) -> str:
    """The stop signal the program gets: the one we got, but SIGTERM for a hangup (a program
    that handles stops handles SIGTERM; SIGHUP would kill it unsaved), and for Ctrl-C under
    cluster=local: there the terminal's SIGINT reaches this wrapper itself, and the
    foreground command's SIGTERM follows it; the program gets one SIGTERM for the two."""
    if name in (None, "SIGHUP") or (name == "SIGINT" and launcher == "local"):
        return "SIGTERM"
    return str(name)


def _forced(stop: StopFlag, launcher: str) -> bool:
    """A second stop on this machine (cluster=debug, cluster=local): end the program now. A
    second Ctrl-C (SIGINT from the terminal), or a second signal to `hpcdl` itself, which
    the foreground command forwards as SIGTERM (one Ctrl-C under cluster=local gives one
    of each). Only there: on Slurm, srun and slurmstepd may both deliver one scancel's
    signal."""
    if launcher not in ("debug", "local"):
        return False
    return stop.received.count("SIGINT") >= 2 or stop.received.count("SIGTERM") >= 2


def run_script(cfg: Config, run_dir: RunDir, stop: StopFlag) -> JobOutcome:
    from hpcdl.job import JobOutcome

    assert cfg.script is not None
    started, started_at = time.monotonic(), time.time()
    env = rank_env_from(os.environ)
    stop_file = run_dir.stop_file(env.job_id, env.restart_count)
    command = program_command(cfg.script, cfg, env)
    if command[0] != sys.executable and shutil.which(command[0]) is None:
        print(f"hpcdl: {command[0]!r} is not found in the job's environment (PATH)", flush=True)
        return JobOutcome(env.rank, False, None, {}, 0, failed_exit_code=127)
    try:  # the derived port, or the next candidate where it is taken (hpcdl.script_port)
        port = agreed_port(env, run_dir.ports_dir, cfg.cluster.rendezvous_timeout_s)
    except PortError as err:
        print(f"hpcdl: {err}", flush=True)
        return JobOutcome(env.rank, False, None, {}, 0, failed_exit_code=EXIT_BAD_INPUT)
    env = replace(env, master_port=port)
    command = with_run_dir(program_command(cfg.script, cfg, env), str(run_dir.path))
    stop_file.unlink(missing_ok=True)  # a rerun of a local run reuses the attempt's name
    child_env = {**os.environ, **program_env(cfg, env, run_dir, stop_file)}
    # hpcdl's job sets PYTHONSAFEPATH (its frozen code must win over the submit dir); the
    # program must see its own folder first, to import the modules beside it.
    child_env.pop("PYTHONSAFEPATH", None)
    watch, dumps = None, False  # dumps: the program prints its stacks on STACK_SIGNAL
    if cfg.script.stall_timeout_s is not None:
        watch = stall_watch(cfg.script.stall_timeout_s, run_dir, env, child_env)
        dumped = with_stack_dump(command) if watch is not None else None
        command, dumps = (dumped, True) if dumped is not None else (command, False)
    torchrun = cfg.script.launcher.value == "torchrun"
    # How torchrun ends on a stop (status 1), hpcdl's or the command's own (`-- torchrun`).
    torchrun_stop = "hpcdl's SIGTERM" if torchrun else "the stop" if _is_torchrun(command) else None
    warning = _warning_signal(cfg.cluster.signal)
    proc = subprocess.Popen(
        command,
        env=child_env,
        start_new_session=True,
        # torchrun dies of the warning signal (it handles only TERM, INT, HUP, QUIT), and
        # Slurm sends it to every process of the step: torchrun and its workers ignore it
        # (a program that wants it installs its own handler, as hpcdl.api does).
        preexec_fn=(lambda: signal.signal(warning, signal.SIG_IGN)) if torchrun else None,
    )
    peers = PeerFailure(run_dir, env)
    # torchrun's own rendezvous listens whatever the program does: not watched.
    group = GroupWatch(proc.pid, env.world_size) if env.is_main and not torchrun else None
    forwarded = forced = hinted = False
    stop_s = None  # when the wrapper saw the stop (time.time())
    stalled = False
    kill_at: Optional[float] = None  # a stalled program's SIGKILL (time.monotonic())
    while proc.poll() is None:
        if kill_at is not None and time.monotonic() >= kill_at:
            print(f"hpcdl: the program did not end within {GRACE_S:.0f} s: SIGKILL", flush=True)
            _signal_group(proc.pid, "SIGKILL")
            kill_at = None
        if stop.requested and not forwarded:
            stop_s = time.time() - POLL_S  # Slurm's signal may have reached the program first
            _touch(stop_file)
            # torchrun turns SIGTERM into SIGTERM to each worker and waits up to 30 s for
            # them (hpcdl.api treats it as a stop request: the workers save and exit).
            name = "SIGTERM" if torchrun else _forwarded(stop.signal_name, env.launcher)
            _signal_group(proc.pid, name)
            forwarded = True
            if env.launcher == "debug":  # alone at the terminal: say what a second one does
                print(
                    f"hpcdl: {stop.signal_name}: asking the program to stop ({name}); "
                    "Ctrl-C again ends it now",
                    flush=True,
                )
        elif forwarded and not forced and _forced(stop, env.launcher):
            print("hpcdl: asked again: ending the program now (SIGKILL)", flush=True)
            _signal_group(proc.pid, "SIGKILL")
            forced = True
        elif forwarded and not hinted and stop_s is not None and time.time() - stop_s > STOP_HINT_S:
            print(
                f"hpcdl: the program has not ended {STOP_HINT_S:.0f} s after the stop; one that "
                "hangs there (a rank waiting in a collective for peers that have stopped; "
                "Lightning's SIGTERM handler under DDP: docs/scripts.md#pytorch-lightning) "
                "ends with a second stop (Ctrl-C, SIGTERM)",
                flush=True,
            )
            hinted = True
        if not stop.requested and not stalled:
            peers.end_if_one_failed(proc.pid)
            if group is not None:
                group.poll()
            silent_s = watch.silent_s() if watch is not None and peers.failed is None else None
            if silent_s is not None:
                end_stalled(cfg, run_dir, env, proc.pid, silent_s, dumps, peers)
                stalled, kill_at = True, time.monotonic() + GRACE_S
        time.sleep(POLL_S)
    if stop.requested:  # Slurm may have signalled (and ended) the program itself first
        _touch(stop_file)
        stop_s = stop_s if stop_s is not None else time.time() - POLL_S
    code = proc.returncode
    note = group.note() if group is not None and not stop.requested else None
    if note is not None:
        print(note, flush=True)
    failed = code not in (EXIT_OK, EXIT_INTERRUPTED) and not stop.requested
    if failed and peers.failed is None and not stalled:
        peers.report(_status(code))  # first: the others end theirs meanwhile
    _end_left_processes(proc.pid)
    wall_s = time.monotonic() - started
    if env.is_main:  # before the summary: its wall_s_total counts this attempt
        run_dir.record_program_end(wall_s, EXIT_STALLED if stalled else _status(code))
    if stalled:
        print(f"hpcdl: the stalled program ended (status {_status(code)})", flush=True)
        return JobOutcome(env.rank, False, None, {}, 0, failed_exit_code=EXIT_STALLED)
    if peers.failed is not None:  # ended by us: the job's status is the failed peer's
        peer_rank, peer_status = peers.failed
        print(
            f"hpcdl: the program ended with status {_status(code)}, after rank {peer_rank}'s "
            "had failed",
            flush=True,
        )
        return JobOutcome(env.rank, False, None, {}, 0, failed_exit_code=peer_status)
    stopped = stop.requested or code == EXIT_INTERRUPTED
    if code == EXIT_OK and not stop.requested:
        total_s = run_dir.program_wall_s() if env.is_main else wall_s  # only rank 0's is kept
        summary = _summary(cfg, run_dir, wall_s, total_s, started_at)
        if env.is_main:
            run_dir.write_summary(summary)
        return JobOutcome(env.rank, True, None, summary if env.is_main else {}, 0)
    if stopped:
        if code != EXIT_INTERRUPTED:  # hpcdl cannot know whether the program saved
            saved_s = stop_s if stop_s is not None else time.time()
            print(f"hpcdl: {_unconfirmed_stop(code, torchrun_stop, run_dir, saved_s)}", flush=True)
        return JobOutcome(env.rank, False, stop.signal_name, {}, 0)
    print(f"hpcdl: the program exited with status {_status(code)}", flush=True)
    return JobOutcome(env.rank, False, None, {}, 0, failed_exit_code=_status(code))


def stall_watch(
    timeout_s: float, run_dir: RunDir, env: RankEnv, child_env: dict[str, str]
) -> Optional[StallWatch]:
    """stall_timeout_s's watch of this rank's program, its beat file in the program's
    environment; None where its output is no log file (cluster=debug: the terminal)."""
    beat_file = run_dir.beat_file(env.job_id, env.restart_count, env.rank)
    watch = StallWatch(timeout_s, beat_file)
    if not watch.watches_output:
        print(
            f"hpcdl: note: stall_timeout_s={timeout_s:g} is not watched here: the program's "
            "output goes to a terminal or a pipe, not to a rank log (cluster=debug); run "
            "with cluster=local or on Slurm to have it watched",
            flush=True,
        )
        return None
    with contextlib.suppress(OSError):  # a rerun of a local run reuses the attempt's name
        beat_file.unlink(missing_ok=True)
    child_env["HPCDL_BEAT_FILE"] = str(beat_file)
    return watch


def end_stalled(
    cfg: Config,
    run_dir: RunDir,
    env: RankEnv,
    pid: int,
    silent_s: float,
    dumps: bool,
    peers: PeerFailure,
) -> None:
    """A program silent for stall_timeout_s: one line (the stall watchdog's, which
    hpcdl.launch.diagnose reads), its threads' stacks, a `stall` record as hpcdl train's
    watchdog writes it, the other ranks told (status 4), then SIGTERM; the caller sends
    SIGKILL after GRACE_S."""
    from hpcdl.job import requeue_after_stall

    assert cfg.script is not None and cfg.script.stall_timeout_s is not None
    timeout_s = cfg.script.stall_timeout_s
    then = "its threads' stacks follow, then it is ended" if dumps else "it is ended"
    # A new line first: the program's last output may have no end of line (a progress bar).
    print(
        f"\nhpcdl: rank {env.rank} made no progress for {silent_s:.0f} s (no output and no "
        f"hpcdl.api call, stall_timeout_s={timeout_s:g}); {then} (SIGTERM, SIGKILL after "
        f"{GRACE_S:.0f} s)",
        flush=True,
    )
    if dumps:
        dump_stacks(pid)
    record: dict[str, Any] = {
        "event": "stall",
        "job_id": env.job_id,
        "rank": env.rank,
        "phase": STALL_PHASE,
        "seconds": round(silent_s, 1),
    }
    first = peers.report(EXIT_STALLED)  # the other ranks end theirs meanwhile
    if cfg.cluster.requeue_on_stall and first and env.launcher == "slurm" and env.job_id:
        record["action"] = requeue_after_stall(env.job_id, run_dir, cfg.cluster.max_requeues)
    with contextlib.suppress(OSError):  # the run dir's file system may be what hangs
        run_dir.append_attempt(record)
    _signal_group(pid, "SIGTERM")


def _unconfirmed_stop(
    code: int, torchrun_stop: Optional[str], run_dir: RunDir, since_s: float
) -> str:
    """A stop the program did not confirm with status 3: what it ended with, and the
    checkpoint it saved meanwhile in hpcdl.api's store if any (one it writes itself is not
    seen). torchrun always ends with status 1 on a stop, after a SignalException traceback
    of its own, whatever its workers did: `torchrun_stop` says which stop it got."""
    saved = [path.name for _, path in run_dir.step_files() if _mtime(path) >= since_s]
    found = (
        f"{saved[-1]} was saved after the stop"
        if saved
        else "hpcdl.api's checkpoint store got no checkpoint after the stop (one your "
        "program writes itself is not looked for)"
    )
    if torchrun_stop is not None:
        return (
            f"torchrun exited with status {_status(code)} on {torchrun_stop} (its "
            f"SignalException traceback above is how it ends); {found}"
        )
    return (
        f"the program exited with status {_status(code)} when asked to stop; {found} "
        "(status 3 would confirm that it saved: docs/scripts.md)"
    )


def _is_torchrun(command: list[str]) -> bool:
    """`torchrun ...` or `python -m torch.distributed.run ...`."""
    name = os.path.basename(command[0])
    module = command[2] if len(command) > 2 and command[1] == "-m" else None
    return name == "torchrun" or module in ("torch.distributed.run", "torch.distributed.launch")


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


class PeerFailure:
    """The attempt's failed file (next to its stop file): made by the first wrapper whose
    program fails ("<rank> <status>"), looked for by the others, which then end theirs:
    SIGTERM, SIGKILL after GRACE_S. Only for jobs of several wrappers with a job id."""

    def __init__(self, run_dir: RunDir, env: RankEnv) -> None:
        self.rank = env.rank
        self.path: Path | None = None
        if env.world_size > 1 and env.job_id:
            stop_file = run_dir.stop_file(env.job_id, env.restart_count)
            self.path = stop_file.with_name(stop_file.name + ".failed")
        self.failed: tuple[int, int] | None = None  # (rank, status) once it ended ours
        self._next_look = time.monotonic() + PEER_POLL_S
        self._kill_at: float | None = None

    def report(self, status: int) -> bool:
        """Whether this rank's is the job's first failure (always, for a job of one)."""
        if self.path is None:
            return True
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "x") as f:
                f.write(f"{self.rank} {status}\n")
        except OSError:  # FileExistsError: another rank failed first
            return False
        return True

    def end_if_one_failed(self, pid: int) -> None:
        now = time.monotonic()
        if self._kill_at is not None and now >= self._kill_at:
            print(f"hpcdl: the program did not end within {GRACE_S:.0f} s: SIGKILL", flush=True)
            _signal_group(pid, "SIGKILL")
            self._kill_at = float("inf")
        if self.path is None or self.failed is not None or now < self._next_look:
            return
        self._next_look = now + PEER_POLL_S
        try:
            rank, status = (int(v) for v in self.path.read_text().split())
        except (OSError, ValueError):  # none yet (or being written)
            return
        self.failed = (rank, status)
        # A stalled peer's status is its wrapper's (4), not its program's.
        what = "stalled (status 4)" if status == EXIT_STALLED else f"exited with status {status}"
        print(
            f"hpcdl: rank {rank}'s program {what}: ending this rank's program (SIGTERM, "
            f"SIGKILL after {GRACE_S:.0f} s)",
            flush=True,
        )
        _signal_group(pid, "SIGTERM")
        self._kill_at = now + GRACE_S


def _end_left_processes(pid: int) -> None:
    """Processes the program started that outlive it, in its process group (a data server,
    a forgotten Popen): SIGTERM, SIGKILL after GRACE_S, as torchrun does; a job's rank
    must not leave them running on the node."""
    if not _group_alive(pid):
        return
    print("hpcdl: the program left processes running: ending them (SIGTERM)", flush=True)
    _signal_group(pid, "SIGTERM")
    deadline = time.monotonic() + GRACE_S
    while _group_alive(pid) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    if _group_alive(pid):
        _signal_group(pid, "SIGKILL")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def program_command(script: ScriptConfig, cfg: Config, env: RankEnv) -> list[str]:
    if script.entry is not None:
        kwargs = json.dumps(script.entry_kwargs)
        base = [sys.executable, "-u", "-m", "hpcdl.entry", script.entry, kwargs]
    else:
        base = list(script.command)
    if script.launcher.value != "torchrun":
        return base
    from hpcdl.config.schema import tasks_per_node

    if base and os.path.basename(base[0]).startswith("python"):
        base = base[1:]  # torchrun starts the interpreter itself
    if base and base[0] == "-u":
        base = base[1:]
    return [
        "torchrun",
        f"--nnodes={cfg.cluster.nodes}",
        f"--nproc-per-node={tasks_per_node(cfg.cluster)}",
        f"--node-rank={env.node_rank}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={env.master_addr}:{env.master_port}",
        f"--rdzv-id={env.job_id or 'hpcdl'}",
        *base,
    ]


def with_run_dir(command: list[str], run_dir: str) -> list[str]:
    """The command with `$HPCDL_RUN_DIR` (RUN_DIR_REF) replaced by the run dir."""
    return [RUN_DIR_REF.sub(lambda _: run_dir, token) for token in command]


def cuda_on_node() -> bool:
    """Whether this node has an NVIDIA driver (its control device or its /proc entry),
    known without importing torch."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia/version")


def program_env(cfg: Config, env: RankEnv, run_dir: RunDir, stop_file: Any) -> dict[str, str]:
    """The variables torch.distributed (env://) and torchrun-style scripts read, and
    hpcdl's own."""
    from hpcdl.config.schema import tasks_per_node
    from hpcdl.env import torchrun_variables
    from hpcdl.threads import THREADS_VAR, threads_per_rank, usable_cpus

    per_node = tasks_per_node(cfg.cluster)
    gpus = cfg.cluster.gpus_per_node
    variables = {
        "HPCDL_RUN_DIR": str(run_dir.path),
        "HPCDL_STOP_FILE": str(stop_file),
        "HPCDL_RESTART_COUNT": str(env.restart_count),
        "HPCDL_JOB_ID": env.job_id or "",
        "MASTER_ADDR": env.master_addr,
        "MASTER_PORT": str(env.master_port),
    }
    if cfg.script is not None and cfg.script.launcher.value == "torchrun":
        return variables  # torchrun sets the per-worker ones itself
    variables.update(torchrun_variables(env, per_node))
    # cuda:N only where the node has an NVIDIA driver: a GPU request Slurm granted without
    # one (the dev cluster's placeholder GPUs) gets the CPU, as hpcdl train's ranks do.
    cuda = gpus and cuda_on_node()
    variables["HPCDL_DEVICE"] = f"cuda:{env.local_rank % gpus}" if cuda else "cpu"
    # The node's CPUs shared among its ranks, as torchrun does (hpcdl.threads).
    threads = threads_per_rank(os.environ, env.launcher, per_node, usable_cpus())
    if threads is not None:
        variables[THREADS_VAR] = str(threads)
    return variables


def _warning_signal(name: str) -> signal.Signals:
    return signal.Signals["SIG" + name.upper().removeprefix("SIG")]


def _touch(path: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def _signal_group(pid: int, signal_name: str) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError, KeyError):  # gone already
        os.killpg(pid, signal.Signals[signal_name])


def _status(code: int) -> int:
    """A program killed by signal N reports -N; a shell would say 128 + N."""
    return 128 - code if code < 0 else code


def _summary(
    cfg: Config, run_dir: RunDir, wall_s: float, wall_s_total: float, started_at: float
) -> dict[str, Any]:
    """wall_s: this attempt's program; wall_s_total: every attempt's (RunDir.program_wall_s);
    started_at: when this attempt began (time.time()), which its metrics file is newer than."""
    assert cfg.script is not None
    summary: dict[str, Any] = {"outcome": "completed", "exit_code": 0}
    # The program's processes: torchrun's workers, not the one Slurm task per node.
    summary.update({"world_size": cfg.world_size, "wall_s": wall_s, "wall_s_total": wall_s_total})
    if cfg.script.metrics_file:
        path = run_dir.path / cfg.script.metrics_file
        metrics = read_program_metrics(path)
        if not metrics:
            in_sweep = run_dir.is_sweep_trial()
            line = missing_metrics(cfg.script.metrics_file, path, in_sweep)
            print(f"hpcdl: warning: {line}", flush=True)
        elif _mtime(path) < started_at:
            print(f"hpcdl: warning: {stale_metrics(cfg.script.metrics_file, path)}", flush=True)
        summary.update(metrics)
    return summary


def stale_metrics(name: str, path: Any) -> str:
    """One line on a metrics file the attempt that completed did not write: its values are
    an earlier attempt's (Lightning's loggers start a new version_N folder each attempt)."""
    return (
        f"metrics_file={name}: {path} was last written before this attempt started, so its "
        "values are an earlier attempt's; write it in every attempt (a logger that makes a "
        "new version_N folder each time: give it version=0)"
    )


def missing_metrics(name: str, path: Any, in_sweep: bool = False) -> str:
    """One line on a metrics file that gave nothing, and where the program must write it
    (in_sweep: the run is a sweep's trial, whose working directory the others share)."""
    what = "holds no JSON object or CSV row" if os.path.exists(path) else "was not written"
    line = (
        f"metrics_file={name}: {path} {what}; a relative metrics_file is read from the run dir: "
        f"write it to $HPCDL_RUN_DIR/{name} (hpcdl.api.run_dir() / {name!r})"
    )
    if not os.path.isabs(name) and os.path.exists(name):
        line += f" ({os.path.abspath(name)} exists in the working directory" + (
            ", which trials running at once share)" if in_sweep else ")"
        )
    return line


def read_program_metrics(path: Any) -> dict[str, Any]:
    """The program's metrics file: a JSON object, or a CSV with a header (the last row)."""
    from hpcdl.rundir import MetricsLog

    if not os.path.exists(path):
        return {}
    if str(path).endswith(".csv"):
        # Each column's last value: a logger that writes train and val metrics on rows of
        # their own (Lightning's CSVLogger) leaves the others empty in each.
        merged: dict[str, Any] = {}
        for row in MetricsLog(path).read():
            merged.update({k: v for k, v in row.items() if v not in (None, "")})
        return merged
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
