"""cluster=debug: one rank, in this process, in the foreground."""

from __future__ import annotations

from hpcdl.errors import HpcdlError
from hpcdl.exit_codes import EXIT_BAD_INPUT
from hpcdl.rundir import RunDir


def run_in_process(run_dir: RunDir) -> int:
    from hpcdl.job import run_job
    from hpcdl.launch.foreground import record_end, record_start
    from hpcdl.workdir import in_workdir

    # In the folder the run was created from, as every launcher runs it (hpcdl.workdir).
    with in_workdir(run_dir.load_config().workdir):
        record_start(run_dir, "debug", None, 1)
        try:
            code = run_job(str(run_dir.path)).exit_code
        except HpcdlError as err:  # bad input found by the job: one line, exit 2 (as local)
            record_end(run_dir, "debug", None, EXIT_BAD_INPUT, err)
            raise
        except KeyboardInterrupt:
            record_end(run_dir, "debug", None, None)
            raise
        except BaseException as err:  # a traceback
            record_end(run_dir, "debug", None, None, err)
            raise
    record_end(run_dir, "debug", None, code)
    return code
