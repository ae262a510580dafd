"""A process that has done its work leaves at once, without the interpreter's teardown.

After `import torch`, Python's own exit tears down thousands of modules one by one (about
0.7-1 s on a 2-vCPU machine), and C++ static destructors run after it, which abort now and
then while a process group's threads are alive (hpcdl.launch.rank_main). What an exit must
do still runs first: threading's exit hooks and the join of every non-daemon thread (an
asynchronous checkpoint write), then, where asked, the atexit handlers (multiprocessing's
children, DataLoader workers, trackers, tempfile and weakref finalizers, coverage), logging's
flush and the flush of stdout and stderr.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from typing import NoReturn


def end_process(code: int, *, run_atexit: bool) -> NoReturn:
    """Exit with `code` once every non-daemon thread has ended and every stream is flushed;
    with `run_atexit`, after the atexit handlers too."""
    join_threads()
    if run_atexit:
        import atexit

        atexit._run_exitfuncs()  # after the join, as the interpreter's exit runs them
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken: nothing to write
            stream.flush()
    os._exit(code)


def join_threads() -> None:
    """What the interpreter's own exit does first: threading's exit hooks (an executor left
    open lets its idle workers go), then a join of every non-daemon thread."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
        return
    current = threading.current_thread()  # an interpreter without the hook: join them here
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon and thread.is_alive():
            thread.join()
