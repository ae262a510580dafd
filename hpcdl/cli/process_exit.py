"""The end of an `hpcdl` process once its command has finished."""

from __future__ import annotations

import os
import sys


def ignore_ctrl_c_while_exiting() -> None:
    """The command has finished: what is left is Python's exit, where a Ctrl-C ended a
    completed run with 130 and no word. It is ignored there (SIG_IGN: Python resets its
    own handlers to the default while it exits), so the status is the command's."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def leave_now(code: int) -> None:
    """Where torch is loaded, end with `code` without the interpreter's teardown (about a
    second after the command's last line; hpcdl.process_end), the atexit handlers run.
    Else return, and Python exits as usual (a login node's commands load no torch). Only
    a process started as `hpcdl` or `python -m hpcdl.cli.main` leaves here: a notebook or
    another program that calls main() goes on."""
    program = os.path.basename(sys.argv[0]) if sys.argv else ""
    if "torch" in sys.modules and program in ("hpcdl", "main.py"):
        from hpcdl.process_end import end_process

        end_process(code, run_atexit=True)
