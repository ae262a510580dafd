"""A local sweep's trial process: `hpcdl resume SWEEP_DIR/<trial>`, as the pool
(hpcdl.sweep.launch) starts it, with its stop signals recorded from its first moment.

The pool passes Ctrl-C on as one SIGTERM once the trial has recorded its start, when its
launcher listens (cluster=local's stopper, or here the early record that cluster=debug's
job takes over: hpcdl.signals). Before that, Python's default SIGTERM killed a trial as it
loaded: FAILED (exit -15) instead of INTERRUPTED.

    python -m hpcdl.cli.sweep_trial RUN_DIR
"""

from __future__ import annotations

import sys


def main() -> None:
    from hpcdl.signals import record_early_stops

    record_early_stops()  # first, before anything heavy is imported
    from hpcdl.cli.main import run_command
    from hpcdl.process_end import end_process

    end_process(run_command(["resume", *sys.argv[1:]]), run_atexit=True)


if __name__ == "__main__":
    main()
