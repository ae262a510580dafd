"""hpcdl's API for programs launched by `hpcdl run` (stdlib; torch only for checkpoints).

    import hpcdl.api as hp
    hp.catch_stop_signals()                # the warning signal sets a flag, not a kill
    store = hp.checkpoint_store()          # atomic, checksummed, weights-only, keep-last-N
    found = store.load_latest()            # a continuation after a requeue resumes here
    for step in ...:
        ...
        if hp.stop_requested():            # the time limit or a preemption is near
            store.save(state, step)
            raise SystemExit(hp.EXIT_REQUEUE)

A program that ignores this API still gets the warning signal forwarded (and is requeued
after it exits); with it, it can save at a step boundary first. Under `hpcdl run
stall_timeout_s=N`, every call of this module's functions is a sign of life, as output is
(hpcdl.script_stall): a loop that asks stop_requested() each step is not ended as stalled.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from hpcdl.env import RankEnv, rank_env_from
from hpcdl.exit_codes import EXIT_INTERRUPTED

if TYPE_CHECKING:
    from hpcdl.checkpoint import CheckpointStore

# Exit with this status to be requeued (after saving), with or without a stop request.
EXIT_REQUEUE = EXIT_INTERRUPTED


_caught: list[int] = []
_exit_hook: list[bool] = []  # the atexit hook, registered once
_last_beat: list[float] = []  # when a call last touched the beat file (time.monotonic())


def _beat() -> None:
    """A sign of life for `hpcdl run stall_timeout_s=N` (HPCDL_BEAT_FILE, set only then)."""
    path = os.environ.get("HPCDL_BEAT_FILE")
    if path:
        from hpcdl.script_stall import beat

        beat(path, _last_beat)


def catch_stop_signals(
    names: tuple[str, ...] = ("SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT"),
) -> None:
    """Turn the stop signals into a flag that stop_requested() reads, instead of their
    default action (ending the program before it can save). Call it once, early. SIGINT
    (Ctrl-C: cluster=debug passes it on as it came, and a program run by hand gets it) is a
    stop request the first time; a second one raises KeyboardInterrupt, as Ctrl-C would."""
    _beat()
    import atexit
    import signal

    def note(signum: int, _frame: object) -> None:
        if signum == signal.SIGINT and signal.SIGINT in _caught:
            raise KeyboardInterrupt
        _caught.append(signum)

    note.hpcdl_stop = True  # type: ignore[attr-defined]  # what _ignore_at_exit looks for
    for name in names:
        signal.signal(signal.Signals[name], note)
    if not _exit_hook:
        atexit.register(_ignore_at_exit)
        _exit_hook.append(True)


def _ignore_at_exit() -> None:
    """Python's exit puts every handler back to the default action before it tears down
    its modules (a second or more after `import torch`): a stop signal arriving then (the
    wrapper's SIGTERM to a rank that is already leaving because another rank was asked to
    stop) would end the program with 143 instead of its status 3. So a signal that is
    still only a stop request is ignored from here on; SIGINT (Ctrl-C, to force it) is not."""
    import signal

    for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        if getattr(signal.getsignal(signum), "hpcdl_stop", False):
            signal.signal(signum, signal.SIG_IGN)


def stop_requested() -> bool:
    """True once hpcdl was asked to stop this attempt (time limit, preemption, scancel)."""
    _beat()
    if _caught:
        return True
    path = os.environ.get("HPCDL_STOP_FILE")
    return path is not None and path != "" and os.path.exists(path)


def run_dir() -> Optional[Path]:
    """The run's directory (the same for every attempt), or None outside `hpcdl run`."""
    _beat()
    value = os.environ.get("HPCDL_RUN_DIR")
    return Path(value) if value else None


def restart_count() -> int:
    """0 for the first attempt; > 0 for a continuation after a requeue."""
    _beat()
    return int(os.environ.get("HPCDL_RESTART_COUNT", "0") or 0)


def rank_env() -> RankEnv:
    """Rank, local rank, world size, master address and port of this process (from the
    RANK/WORLD_SIZE/... that hpcdl or torchrun exported, which win over SLURM_*)."""
    _beat()
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return rank_env_from({k: v for k, v in env.items() if not k.startswith("SLURM_")})
    return rank_env_from(env)


def checkpoint_store(keep_last: int = 2, directory: Optional[str] = None) -> CheckpointStore:
    """The run's checkpoint store (RUN_DIR/checkpoints unless `directory` is given). Save
    from one rank (rank 0) only."""
    _beat()
    from hpcdl.checkpoint import CheckpointStore
    from hpcdl.rundir import RunDir

    if directory is None:
        base = run_dir()
        if base is None:
            raise RuntimeError(
                "hpcdl.api.checkpoint_store: not launched by `hpcdl run`; give directory="
            )
        directory = str(RunDir(base).checkpoint_dir)
    return CheckpointStore(directory, keep_last=keep_last)
