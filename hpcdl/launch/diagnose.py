"""Which rank made a job fail, and why, read from the ranks' logs. Stdlib only: the local
launcher uses it when its job ends badly, `hpcdl status` for a Slurm job that failed.

Log names are submitit's: `<job id>_<task>_log.out` (an array task's job id is
`<array id>_<index>`), stderr merged into stdout.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from hpcdl.watchdog import BACKSTOP_S, WAITING

# A rank whose peer died fails in the collective with one of these: a consequence, not the
# cause, which is another rank's own error (or its death, or its stall).
PEER_GONE = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Timed out waiting",
    "NCCL",
    "Broken pipe",
)
COLLECTIVE_TIMEOUT = "Timed out waiting"
ERROR_LINE = re.compile(r"^\s*(?:\[rank\d+\]: )?(\w[\w.]*(?:Error|Exception): .*)$", re.M)
STALL_LINE = re.compile(r"^hpcdl: (rank \d+ made no progress for .*?);", re.M)
# faulthandler's header when the watchdog's backstop fired (hpcdl.watchdog.BACKSTOP_S): the
# rank's interpreter was held in C code, where its own watchdog thread could not run.
BACKSTOP_LINE = re.compile(r"^Timeout \((\d+:\d\d:\d\d)(?:\.\d+)?\)!$", re.M)
# An `hpcdl run` program's own failure (hpcdl.script_job), and a rank whose program its
# wrapper ended because another rank's had failed: a consequence.
PROGRAM_EXIT = re.compile(r"^hpcdl: the program exited with status (\d+)$", re.M)
PEER_ENDED = re.compile(
    r"^hpcdl: rank \d+'s program (?:exited with status \d+|stalled \(status \d+\)): ending", re.M
)
# hpcdl.script_job's own line for a program it could not start: the cause, also where a
# setup line the job script tolerated (`module purge || true`) left a shell error before it.
PROGRAM_NOT_FOUND = re.compile(r"^hpcdl: ('.+' is not found in the job's environment .*)$", re.M)
# srun's line for a task that died of a signal ("srun: error: n2: task 3: Aborted"; a
# task that merely exited non-zero reads "Exited with exit code N" and is left to its log).
SRUN_TASK_DIED = re.compile(r"^srun: error: (\S+): task (\d+): (?!Exited with)(.+)$", re.M)
# What a process that dies in C/C++ code leaves in its own log.
FATAL_LINE = re.compile(
    r"^(terminate called .*|Fatal Python error: .*|.*Segmentation fault.*|.*core dumped.*)$",
    re.M,
)
# What a job script or srun says when it dies before Python starts (module load, a
# missing interpreter, a bad bind path): the first such line names the cause.
SHELL_ERROR = re.compile(
    # not slurmstepd's banner of a step it ended (a requeue, a time limit, a cancel)
    r"^(?!.*\bCANCELLED AT\b).*(?:error|not found|No such file|Permission denied).*$",
    re.M | re.I,
)

# slurmstepd's line for a task whose program could not start ("slurmstepd-n1: error:
# execve(): /opt/py/bin/python3: No such file or directory"): for hpcdl's ranks, the
# job's interpreter (cluster.python, or the login node's own where it is null).
EXEC_FAILED = re.compile(r"^slurmstepd(?:-(\S+))?: error: execve\(\): (.+?): (.+)$", re.M)
# A cluster.setup line that failed ends the job script (hpcdl.launch.slurm.SETUP_FAILED).
SETUP_FAILED = re.compile(r"^error: (cluster\.setup: `.*` failed \(exit \d+\)); the job stops$", re.M)


def rank_logs(log_dir: Path, job_id: str) -> dict[int, str]:
    """Each task's log text by task number (the rank, for one-node and multi-node jobs alike:
    submitit numbers tasks across the job)."""
    texts: dict[int, str] = {}
    prefix = f"{job_id}_"
    for path in log_dir.glob(f"{job_id}_*_log.out"):
        task = path.name[len(prefix) : -len("_log.out")]
        if task.isdigit():
            texts[int(task)] = path.read_text(errors="replace")
    return dict(sorted(texts.items()))  # by rank: 2 before 10


def root_cause(log_dir: Path, job_id: str) -> Optional[tuple[Optional[int], str]]:
    """(rank, what happened) for a failed job: a stall the watchdog reported (not one of a
    rank waiting for the others), else an error that is not a peer's disappearance, else a
    rank that timed out in a collective, else a task srun saw die of a signal, else a rank
    that ended without any error (killed), else a rank stalled waiting for the others (with
    NCCL a peer's death or failure leaves them no error of their own), else the first
    error, else the first line of a log that reads like an error (the job died before
    Python started); None when the logs say nothing."""
    logs = rank_logs(log_dir, job_id)
    errors: dict[int, str] = {}
    silent: list[int] = []
    waiting: list[tuple[int, str]] = []  # stalled while waiting for the other ranks
    for rank, text in logs.items():
        stalled = STALL_LINE.search(text)
        if stalled and WAITING in stalled.group(1):
            waiting.append((rank, f"stalled: {stalled.group(1)}{_stacks(text, stalled)}"))
            continue
        if stalled:
            return rank, f"stalled: {stalled.group(1)}{_stacks(text, stalled)}"
        held = BACKSTOP_LINE.search(text)
        if held:
            return rank, (
                f"stalled in C code holding Python's interpreter lock, so its watchdog could "
                f"not run: ended {held.group(1)} after its watchdog's last check (stall allowance + "
                f"{BACKSTOP_S:.0f} s; its stacks are in its log)"
            )
        if PEER_ENDED.search(text):
            continue
        found = ERROR_LINE.findall(text)
        exited = PROGRAM_EXIT.search(text)
        not_found = PROGRAM_NOT_FOUND.search(text)
        if found:  # hpcdl's own errors by their class name, as other errors are
            errors[rank] = found[-1].removeprefix("hpcdl.errors.")
        elif exited:
            errors[rank] = program_exit(text, exited)
        elif not_found:
            errors[rank] = not_found.group(1)
        else:
            silent.append(rank)
    own = [(r, e) for r, e in errors.items() if not any(p in e for p in PEER_GONE)]
    if own:
        return own[0]
    # A rank that waited in a collective until its timeout was stuck there (its peers, who
    # then lost it, say "connection closed"): the likelier culprit, e.g. a collective the
    # others never joined.
    waited = [(r, e) for r, e in errors.items() if COLLECTIVE_TIMEOUT in e]
    if waited:
        # Ranks waiting in the training step's own collectives (DDP's gradient all-reduce,
        # the step sums) waited for one that was elsewhere: name that one first, also when
        # it reports a lost peer (one that timed out first and left) rather than a timeout.
        in_step = {r for r in errors if in_training_step(logs[r])}
        elsewhere = [(r, e) for r, e in errors.items() if r not in in_step]
        waited.sort(key=lambda pair: pair[0] in in_step)
        in_step_waited = any(r in in_step for r, _ in waited)
        rank, error = (elsewhere if in_step_waited and elsewhere else waited)[0]
        return rank, f"hung in a collective until its timeout (trainer.stall_timeout_s): {error}"
    died = died_of_a_signal(logs, silent)
    if died is not None:
        return died
    if silent and (errors or waiting):
        lost = next(iter(errors.values())) if errors else waiting[0][1]
        return silent[0], (
            "ended without an error of its own (killed by a signal, or out of memory?); "
            f"the other ranks then lost it: {clipped(lost, 120)}"
        )
    if waiting:  # every stalled rank was waiting for the others: the first of them
        return waiting[0]
    if errors:
        return next(iter(errors.items()))
    for rank, text in logs.items():
        setup = SETUP_FAILED.search(text)
        if setup:  # the job script's own line (hpcdl.launch.slurm), no rank's
            said = SHELL_ERROR.search(text[: setup.start()])
            why = f": {clipped(said.group(0).strip(), 160)}" if said else ""
            return None, f"{setup.group(1)}{why}"
        exec_failed = EXEC_FAILED.search(text)
        if exec_failed:
            return rank, not_started(*exec_failed.groups())
        shell = SHELL_ERROR.search(text)
        if shell:
            return rank, clipped(shell.group(0).strip(), 200)
    return None


def not_started(node: Optional[str], program: str, why: str) -> str:
    """A task srun could not start: its program, where, why; for an interpreter, the key
    that chose it."""
    said = f"could not start {program}" + (f" on {node}" if node else "") + f" ({why.strip()})"
    if not Path(program).name.startswith("python"):
        return said
    return (
        f"{said}; set cluster.python to an interpreter the compute nodes have: a name on "
        "their PATH after cluster.setup (python3), or an absolute path"
    )


def program_exit(text: str, exited: re.Match[str]) -> str:
    """'the program exited with status 1: <its last line>' (sys.exit("message") prints
    the message, and no error line)."""
    before = [
        line.strip()
        for line in text[: exited.start()].splitlines()
        if line.strip() and not line.startswith(("hpcdl:", "submitit "))
    ]
    status = int(exited.group(1))
    killed = killed_by(status)
    if killed is not None:  # its last line is whatever it wrote before, not why
        return f"the program was killed by {killed}"
    said = f": {clipped(before[-1], 160)}" if before else ""
    return f"the program exited with status {status}{said}"


def killed_by(status: int) -> Optional[str]:
    """'SIGKILL (status 137: kill -9, or the kernel's out-of-memory killer)' for a status
    of 128 + a signal's number, as the wrapper reports a program a signal ended; None
    for any other status."""
    import signal

    try:
        name = signal.Signals(status - 128).name if status > 128 else None
    except ValueError:
        return None
    if name is None:
        return None
    why = {
        "SIGKILL": ": kill -9, or the kernel's out-of-memory killer",
        "SIGSEGV": ": a crash in C code",
        "SIGABRT": ": aborted, often a C++ exception or an assertion in a library",
        "SIGBUS": ": a bad memory access, often a full /dev/shm",
    }.get(name, "")
    return f"{name} (status {status}{why})"


def error_line(err: BaseException) -> str:
    """An exception as an end record keeps it (`ValueError: bad sample 17`): its first line,
    at most about 300 characters, as `hpcdl status` shows it."""
    lines = str(err).strip().splitlines()
    if lines and lines[0].startswith("Caught ") and "Original Traceback" in str(err):
        # Raised in a DataLoader worker: torch re-raises it here as "Caught KeyError in
        # DataLoader worker process 1.", the worker's traceback after it; its last line is
        # the error itself (`KeyError: 'labels'`).
        return clipped(lines[-1].strip(), 300)
    return clipped(f"{type(err).__name__}: {lines[0] if lines else ''}".strip(), 300)


def clipped(text: str, limit: int) -> str:
    """At most about `limit` characters, cut at a space (never mid-word) with ' ...' after."""
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(None, 1)[0] if " " in text[:limit] else text[:limit]
    return cut.rstrip(",;:") + " ..."


def died_of_a_signal(logs: dict[int, str], silent: list[int]) -> Optional[tuple[int, str]]:
    """A task srun reports killed by a signal (in the batch log, rank 0's), one without a
    Python error of its own first, with the last fatal line of its own log: "died of
    Aborted on n2: terminate called without an active exception"."""
    deaths = [m for text in logs.values() for m in SRUN_TASK_DIED.finditer(text)]
    deaths.sort(key=lambda m: int(m.group(2)) not in silent)  # stable: srun's order kept
    if not deaths:
        return None
    node, task, how = deaths[0].group(1), int(deaths[0].group(2)), deaths[0].group(3).strip()
    fatal = FATAL_LINE.findall(logs.get(task, ""))
    return task, f"died of {how} on {node}" + (f": {fatal[-1].strip()}" if fatal else "")


def in_training_step(text: str) -> bool:
    """The log's last traceback passes through the trainer's step (its collectives)."""
    last = text.rfind("Traceback (most recent call last)")
    return last >= 0 and "in train_step" in text[last:]


def describe(cause: Optional[tuple[Optional[int], str]]) -> Optional[str]:
    """`rank 1: RuntimeError: ...` for status lines and error messages."""
    if cause is None:
        return None
    rank, detail = cause
    return f"rank {rank}: {detail}" if rank is not None else detail


def _stacks(text: str, stalled: re.Match[str]) -> str:
    """' (its stacks are in its log)' where faulthandler's dump follows the stall line (a
    program `hpcdl run` could not start through its bootstrap, a shell script, has none)."""
    return " (its stacks are in its log)" if "most recent call first" in text[stalled.end() :] else ""
