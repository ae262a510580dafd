"""Exit statuses of `hpcdl` commands and of every rank, defined once."""

EXIT_OK = 0
EXIT_FAILED = 1  # an unexpected error (a traceback is in the log)
EXIT_BAD_INPUT = 2  # bad input, reported in one line; nothing was written
EXIT_INTERRUPTED = 3  # stopped on a signal after saving a checkpoint; resume continues it
EXIT_STALLED = 4  # no progress for trainer.stall_timeout_s: stacks dumped to the log
EXIT_CTRL_C = 130  # Ctrl-C before the command could act on it (as a shell reports SIGINT)
EXIT_BROKEN_PIPE = 141  # the output's reader went away (`hpcdl ... | head`), as on SIGPIPE
