"""`python -m benchmarks.job_process RUN_DIR`: hpcdl's job payload for RUN_DIR in this fresh
process, as a (re)queued job runs it, with the benchmark's records: `called` before the
payload starts, `start` when the trainer takes an epoch's batches (hooks.loop_starts), and
the run's step hooks. Torch's threads come from $HPCDL_BENCH_THREADS, as the suite set them
in its own process. Exit status: 0 when the run completed, 3 when it was interrupted.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

from benchmarks import hooks

THREADS_VAR = "HPCDL_BENCH_THREADS"


def main(argv: Optional[list[str]] = None) -> int:
    (run_dir,) = sys.argv[1:] if argv is None else argv
    hooks.write_record("called", 0, 0, 0, 0)
    import torch

    from hpcdl.job import run_job

    if os.environ.get(THREADS_VAR):
        torch.set_num_threads(int(os.environ[THREADS_VAR]))
    with hooks.loop_starts():
        outcome = run_job(run_dir)
    return 0 if outcome.completed else 3


if __name__ == "__main__":
    sys.exit(main())
