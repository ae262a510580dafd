"""Whether an `hpcdl run` program with several ranks joins a process group.

A plain single-process script run with cluster.tasks_per_node=4 starts four copies that
never talk: each trains the whole model on all the data and writes the same files, and
every one ends COMPLETED. Rank 0's wrapper cannot see inside the program, but a program
that joins a group listens on a TCP port there: torch.distributed's store on MASTER_PORT
(env://, Lightning, accelerate), gloo's and NCCL's own sockets whatever the init method.
So it looks, about once a second, for a listening socket owned by a process of the
program's session (the Linux /proc tables), and says once, in rank 0's log, when none has
appeared after GROUP_HINT_S of running or by the end of a program that ran NOTE_MIN_S.

Stdlib only, like hpcdl.script_job. Where /proc cannot be read, it says nothing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Optional

# Seconds a program runs before a missing process group is pointed out: longer than a
# script's imports and data loading before its init_process_group.
GROUP_HINT_S = 120.0
CHECK_EVERY_S = 1.0
# A program that ended sooner is not pointed out: a group it joined for under a second (a
# test's) may have come and gone between two looks, and a short run costs little.
NOTE_MIN_S = 10.0
LISTEN = "0A"  # the TCP state of a listening socket in /proc/net/tcp


def listening_inodes(proc: Path = Path("/proc")) -> Optional[set[str]]:
    """The socket inodes of this machine's listening TCP sockets (IPv4 and IPv6), or None
    where /proc/net cannot be read."""
    inodes: set[str] = set()
    read = False
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        read = True
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == LISTEN:
                inodes.add(fields[9])
    return inodes if read else None


def session_sockets(sid: int, proc: Path = Path("/proc")) -> set[str]:
    """The socket inodes the processes of session `sid` hold open (the program started with
    start_new_session: its session id is its pid; its children's too)."""
    found: set[str] = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            # pid (comm) state ppid pgrp session ...: comm may hold spaces and parentheses
            if int(stat.rpartition(")")[2].split()[3]) != sid:
                continue
            for fd in (entry / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    found.add(target[len("socket:[") : -1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
    return found


class GroupWatch:
    """Rank 0's watch of its program's sockets: `poll()` in the wrapper's loop, `note()`
    once it has ended."""

    def __init__(self, pid: int, world_size: int, proc: Path = Path("/proc")) -> None:
        self.pid, self.world_size, self.proc = pid, world_size, proc
        self.started = time.monotonic()
        self.joined = world_size < 2  # one rank: nothing to join
        self.said = False
        self._checked = 0.0

    def poll(self) -> None:
        now = time.monotonic()
        if self.joined or self.said or now - self._checked < CHECK_EVERY_S:
            return
        self._checked = now
        listening = listening_inodes(self.proc)
        if listening is None:  # no /proc here: nothing can be told
            self.joined = True
            return
        if listening & session_sockets(self.pid, self.proc):
            self.joined = True
        elif now - self.started >= GROUP_HINT_S:
            print(f"hpcdl: note: {self.message(f'in {GROUP_HINT_S:.0f} s')}", flush=True)
            self.said = True

    def note(self) -> Optional[str]:
        """At the program's end: the line to print when it never joined a group."""
        if self.joined or self.said or time.monotonic() - self.started < NOTE_MIN_S:
            return None
        return f"hpcdl: note: {self.message('while it ran')}"

    def message(self, when: str) -> str:
        n = self.world_size
        return (
            f"rank 0's program has opened no network port {when}: it seems not to join a "
            f"process group (torch.distributed.init_process_group), so each of the {n} ranks "
            "runs the whole program on its own, on the same data, writing the same files; "
            "for one copy run it with cluster.tasks_per_node=1 cluster.nodes=1, for DDP see "
            "docs/scripts.md#what-your-program-sees"
        )
