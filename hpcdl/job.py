"""The job payload: one call per rank, the same for every launcher.

    env (who am I) -> dist (process group) -> trainer (the loop) <-> checkpoint store

Everything the job needs is in the run dir's config.yaml, decided at submit time, so a
requeued or rerun job resumes from what is on disk, never from a pickled object.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from hpcdl.exit_codes import EXIT_INTERRUPTED, EXIT_OK, EXIT_STALLED

# A stalled rank's report (stacks, the attempt record, a requeue) gets this long before the
# rank exits anyway.
STALL_EXIT_S = 60.0

if TYPE_CHECKING:
    from hpcdl.config.schema import Config
    from hpcdl.env import RankEnv
    from hpcdl.rundir import RunDir
    from hpcdl.signals import StopFlag
    from hpcdl.watchdog import Stall, Watchdog


@dataclass
class JobOutcome:
    rank: int
    completed: bool
    signal_name: Optional[str]
    summary: dict[str, Any]
    global_step: int
    # `hpcdl run`: the user's program failed with this status (no stop was asked for).
    failed_exit_code: Optional[int] = None

    @property
    def exit_code(self) -> int:
        if self.failed_exit_code is not None:
            return self.failed_exit_code
        return EXIT_OK if self.completed else EXIT_INTERRUPTED


def run_job(run_dir: str, stop: Optional[StopFlag] = None) -> JobOutcome:
    """Train the run in `run_dir` as this rank. Stop-signal handlers go in before torch is
    even imported: a warning signal can come within the first seconds of a job (Slurm may
    send it up to 60 s early) and must only set the flag."""
    from hpcdl.errors import warnings_as_lines
    from hpcdl.rundir import RunDir
    from hpcdl.signals import stop_on_signals

    path = RunDir(Path(run_dir))
    cfg = path.load_config()
    with warnings_as_lines():
        if stop is not None:
            return _train(cfg, path, stop)
        with stop_on_signals(stop_signal_names(cfg.cluster.signal)) as flag:
            return _train(cfg, path, flag)


def stop_signal_names(warning: str) -> tuple[str, ...]:
    return ("SIGTERM", "SIGINT", "SIGHUP", "SIG" + warning.upper().removeprefix("SIG"))


def _train(cfg: Config, path: RunDir, stop: StopFlag) -> JobOutcome:
    if cfg.script is not None:  # `hpcdl run`: the user's program, not the trainer
        from hpcdl.script_job import run_script

        return run_script(cfg, path, stop)
    return _train_model(cfg, path, stop)


def _train_model(cfg: Config, path: RunDir, stop: StopFlag) -> JobOutcome:
    from hpcdl.build import build_trainer
    from hpcdl.config.schema import tasks_per_node
    from hpcdl.dist import pick_device, process_group
    from hpcdl.env import rank_env_from, torchrun_variables
    from hpcdl.finalize import finalize_run, write_curves
    from hpcdl.trainer import Outcome
    from hpcdl.watchdog import first_step_allowance

    started = time.monotonic()
    env = rank_env_from(os.environ)
    if env.launcher != "debug":  # a rank's own process: torchrun's variables for users' code
        os.environ.update(torchrun_variables(env, tasks_per_node(cfg.cluster)))
    _share_cpus(cfg, env)
    device = pick_device(cfg.trainer.device.value, env.local_rank)
    if cfg.cluster.gpus_per_node and device.type == "cpu" and env.is_main:
        import torch

        print(
            f"hpcdl: warning: cluster.gpus_per_node={cfg.cluster.gpus_per_node}, but torch "
            f"{torch.__version__} sees no CUDA GPU here, so the ranks train on the CPU "
            "(a CPU-only torch build, or a node without GPUs?); trainer.device=cuda makes "
            "this an error",
            file=sys.stderr,
            flush=True,
        )
    # Until the first step is done (the trainer then sets trainer.stall_timeout_s), the
    # collectives wait as long as the watchdog's first-step allowance.
    first = first_step_allowance(cfg.trainer.stall_timeout_s, cfg.trainer.stall_first_step_s)
    with process_group(env, device, cfg.cluster.rendezvous_timeout_s, first):
        trainer = build_trainer(cfg, env, path, device, stop)
        trainer.attempt_started = started  # its wall time counts from the job's start
        with stall_watchdog(cfg, env, path) as watchdog:
            trainer.watchdog = watchdog
            result = trainer.fit()
        summary: Optional[dict[str, Any]] = None
        if result.outcome == Outcome.completed:
            summary, test = trainer.test_summary(result, time.monotonic() - started)
            if summary is not None:
                finalize_run(path, summary, test, trainer.class_names)
        elif env.is_main:
            write_curves(path)
    sys.stdout.flush()
    return JobOutcome(
        rank=env.rank,
        completed=result.outcome == Outcome.completed,
        signal_name=result.signal_name,
        summary=summary or {},
        global_step=result.progress.global_step,
    )


def _share_cpus(cfg: Config, env: RankEnv) -> None:
    """This rank's share of the node's CPUs as torch's intra-op threads (hpcdl.threads)."""
    import torch

    from hpcdl.config.schema import tasks_per_node
    from hpcdl.threads import threads_per_rank, usable_cpus

    per_node = tasks_per_node(cfg.cluster) if env.launcher != "debug" else 1
    threads = threads_per_rank(os.environ, env.launcher, per_node, usable_cpus())
    if threads is not None and threads != torch.get_num_threads():
        torch.set_num_threads(threads)


def requeue_after_stall(job_id: str, path: RunDir, max_requeues: int) -> str:
    """cluster.requeue_on_stall, at most cluster.max_requeues times a submission: a stall that
    comes back at the same place (a peer's repeatable error, with NCCL a waiting rank's
    stall) would otherwise requeue, and idle the job's GPUs, without end."""
    from hpcdl.requeue import requeue

    def requeued(record: dict[str, Any]) -> bool:
        action = str(record.get("action", ""))
        return action.startswith("requeue") and not action.startswith("requeue failed")

    done = 0
    with contextlib.suppress(OSError):
        done = sum(
            1 for a in path.attempts_of_submission() if a.get("event") == "stall" and requeued(a)
        )
    if done >= max_requeues:
        return f"not requeued: cluster.max_requeues={max_requeues} stall requeues reached"
    return requeue(job_id, path)


def stall_watchdog(cfg: Config, env: RankEnv, path: RunDir) -> Watchdog:
    """trainer.stall_timeout_s: a rank without progress dumps its stacks, records the
    stall in the run dir, maybe requeues the job (cluster.requeue_on_stall), and exits
    with EXIT_STALLED so that the job ends and frees its nodes."""
    from hpcdl.watchdog import Watchdog, dump_stacks

    def on_stall(stall: Stall) -> None:
        # What follows writes to the run dir, whose file system may be what hangs: the
        # rank leaves within STALL_EXIT_S whatever happens.
        backstop = threading.Timer(STALL_EXIT_S, os._exit, (EXIT_STALLED,))
        backstop.daemon = True
        backstop.start()
        dump_stacks(env.rank, stall)
        record = {
            "event": "stall",
            "job_id": env.job_id,
            "rank": env.rank,
            "phase": stall.phase,
            "seconds": round(stall.seconds, 1),
        }
        if cfg.cluster.requeue_on_stall and env.is_main and env.job_id:
            record["action"] = requeue_after_stall(env.job_id, path, cfg.cluster.max_requeues)
        with contextlib.suppress(OSError):  # the run dir's file system may be what hangs
            path.append_attempt(record)
        sys.stdout.flush()
        os._exit(EXIT_STALLED)

    return Watchdog(cfg.trainer.stall_timeout_s, on_stall)
