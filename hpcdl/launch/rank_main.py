"""A rank's process: ``python -m hpcdl.launch.rank_main LOG_DIR`` runs submitit's job
runner (what ``-m submitit.core._submit`` runs), then leaves at once.

Why not let the interpreter wind down: torch's DistributedDataParallel keeps its process
group alive past ``destroy_process_group`` (gloo's or NCCL's threads go on running), and
tearing a process down with those threads alive (C++ static destructors after Python has
finalized) aborts now and then: "terminate called without an active exception", and Slurm
marks a job whose ranks all finished their work FAILED (exit 6:0, "srun: error: n2: task 3:
Aborted"). A rank whose job has returned has nothing left to do; once its result is
pickled, its non-daemon threads have finished and its output is flushed, it exits with
``os._exit``. A ``sys.exit(n)`` from the job (a stop after a checkpoint, bad input) leaves
the same way with n; an exception prints its traceback and leaves with 1 (with an NCCL
process group the failing rank has not destroyed, the teardown could also wait on peers).

A stop signal that comes while the rank starts is recorded from the first moment
(hpcdl.signals.record_early_stops), also over submitit's own handlers, which would only log
a SIGTERM ("Bypassing signal SIGTERM"); the job's handlers take it over when they go in.
SIGCONT, which Slurm sends before each of those SIGTERMs, gets its default action back
instead of submitit's handler, which logged it as noise in every rank's log.

A job that returns a failure (an `hpcdl run` program that failed: the launcher reads its
status from the returned outcome) is no success, whatever submitit's "Job completed
successfully" would say: those two lines of its log say that it failed instead.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import traceback
from typing import Any, NoReturn, Optional

from hpcdl.errors import HpcdlError
from hpcdl.launch.launcher_watch import FOREGROUND_VAR, record_orphaned_end, watch_foreground

USAGE = "usage: python -m hpcdl.launch.rank_main LOG_DIR"
# cluster=local: the GPUs the ranks get, as the launching shell named them (submitit's local
# executor would give them the machine's first ones, 0..gpus_per_node-1).
LOCAL_GPUS_VAR = "HPCDL_LOCAL_CUDA_VISIBLE_DEVICES"


def rank_command(python: str, folder: str) -> str:
    """The command every task of a job runs (in submitit's place: see the module's text)."""
    return f"{python} -u -m hpcdl.launch.rank_main {shlex.quote(folder)}"


def exit_status(code: object) -> int:
    """SystemExit's code as the process's exit status (as Python itself maps it)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def leave(code: int) -> NoReturn:
    """Exit with ``code`` once every non-daemon thread has ended (an asynchronous checkpoint
    write, say) and every stream is flushed; no interpreter or C++ teardown runs after, and
    no atexit handler (hpcdl.process_end)."""
    from hpcdl.process_end import end_process

    record_orphaned_end(code)  # cluster=local whose launching command was killed
    end_process(code, run_atexit=False)


def run(folder: str) -> NoReturn:
    from hpcdl.signals import record_early_stops

    record_early_stops()  # first: Ctrl-C as the ranks start saves instead of killing them
    from submitit.core.submission import process_job

    _keep_early_stops_over_submitits()

    if os.environ.get("SUBMITIT_EXECUTOR") == "local":
        if LOCAL_GPUS_VAR in os.environ:
            os.environ["CUDA_VISIBLE_DEVICES"] = os.environ[LOCAL_GPUS_VAR]  # before CUDA
        if FOREGROUND_VAR in os.environ:
            watch_foreground(os.environ[FOREGROUND_VAR])
    try:
        process_job(folder)
    except SystemExit as stop:
        leave(exit_status(stop.code))
    except HpcdlError as error:  # bad input found by the job: its one line, no traceback
        print("".join(traceback.format_exception_only(error)).strip(), file=sys.stderr)
        leave(1)
    except Exception:  # as the interpreter would report it, then out without its teardown
        traceback.print_exc()
        leave(1)
    leave(0)


def _keep_early_stops_over_submitits() -> None:
    """submitit puts in its handlers just before it calls the job: put ours back after."""
    from submitit.core.job_environment import JobEnvironment

    from hpcdl.signals import record_early_stops

    original = getattr(JobEnvironment, "_handle_signals", None)
    if original is None:  # another submitit: its handlers stay until the job's go in
        return

    def handle_signals(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        record_early_stops()
        submission = args[1] if len(args) > 1 else kwargs.get("submission")
        logging.getLogger("submitit").addFilter(FailureNotSuccess(submission))
        # Slurm sends SIGCONT before the SIGTERM of every scancel, requeue and preemption
        # (in case the job was suspended); submitit's handler only logged it, once per
        # signal ("Bypassing signal SIGCONT"). Its default action continues a stopped
        # process and is otherwise nothing.
        signal.signal(signal.SIGCONT, signal.SIG_DFL)

    JobEnvironment._handle_signals = handle_signals  # type: ignore[method-assign]


# What submitit logs once the job function has returned, whatever it returned.
SUCCESS_LINES = ("Job completed successfully", "Exiting after successful completion")


class FailureNotSuccess(logging.Filter):
    """submitit's success lines, for a job whose returned outcome reports a failure
    (`failed_exit_code`, hpcdl.job.JobOutcome), rewritten to say so. The outcome is read
    from the submission submitit ran (its `_result`, set as the function returns)."""

    def __init__(self, submission: Any) -> None:
        super().__init__()
        self.submission = submission

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() not in SUCCESS_LINES:
            return True
        status = getattr(getattr(self.submission, "_result", None), "failed_exit_code", None)
        if status is not None:
            ended = "Job ended" if record.getMessage() == SUCCESS_LINES[0] else "Exiting"
            record.msg, record.args = f"{ended}: failed (status {status}), not a success", ()
        return True


def main(argv: Optional[list[str]] = None) -> NoReturn:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.exit(USAGE)
    run(args[0])


if __name__ == "__main__":
    main()
