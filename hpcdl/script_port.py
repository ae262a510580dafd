"""The MASTER_PORT an `hpcdl run` program gets, agreed by the job's wrappers.

hpcdl's own trainer moves to the next candidate port when the job's derived port (from its
Slurm job id) is taken on the first node (hpcdl.dist). A program of `hpcdl run` binds
MASTER_PORT itself (torch.distributed's env://, torchrun's rendezvous), so its wrappers
agree on a port before starting it: rank 0's wrapper, on the node where the program will
listen, takes the first candidate it can bind and writes it into the run dir (which every
node sees); the other wrappers read it there. A MASTER_PORT the user set is used as is.

Stdlib only, like hpcdl.script_job.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

from hpcdl.atomic import write_atomic
from hpcdl.env import RankEnv, master_port_candidates
from hpcdl.errors import HpcdlError

# What rank 0 writes when every candidate is taken: the others fail at once, not at the timeout.
NONE_FREE = "none"
POLL_S = 0.1


class PortError(HpcdlError):
    """The job's wrappers found no port for the program's rendezvous."""


def agreed_port(
    env: RankEnv, folder: Path, timeout_s: float, environ: Optional[Mapping[str, str]] = None
) -> int:
    """The port this job's program listens on (rank 0) or connects to (the others).
    ``folder``: a directory of the run dir, shared by the job's nodes. cluster=debug's one
    rank (no launcher gave it a port): the MASTER_PORT set here, else a free one, so that
    runs side by side (a local sweep's trials, two terminals) do not all take 29500."""
    if env.launcher == "debug" and env.world_size == 1:
        given = (os.environ if environ is None else environ).get("MASTER_PORT")
        return int(given) if given else any_free_port()
    ports = master_port_candidates(env)
    if len(ports) == 1:
        return ports[0]
    path = folder / f"port-{env.job_id}-{env.restart_count}"
    if env.rank == 0:  # also alone: torchrun's rendezvous listens even on one node
        port = first_free(ports)
        if env.world_size > 1:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, NONE_FREE if port is None else str(port))
    else:
        port = _read(path, timeout_s, env)
    if port is None:
        raise PortError(
            f"rank {env.rank}: ports {ports} are all in use on the first node "
            f"({env.master_addr}); set a free one with cluster.env.MASTER_PORT=<port>"
        )
    return port


def first_free(ports: list[int]) -> Optional[int]:
    """The first port that a listener could bind here (as a TCPStore binds: all
    interfaces, SO_REUSEADDR), or None."""
    for port in ports:
        if _bindable(port):
            return port
    return None


def any_free_port() -> int:
    """A port nothing listens on now, as the kernel hands one out."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def _bindable(port: int) -> bool:
    """Whether a listener could bind ``port`` on IPv6 and IPv4 alike (each where the node
    has it): a listener on either, on any address, makes it taken."""
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this node
            continue
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
                probe.listen(1)
            except OSError as err:
                if err.errno in (errno.EADDRINUSE, errno.EACCES):
                    return False
                if err.errno != errno.EADDRNOTAVAIL:  # IPv6 switched off: IPv4 decides
                    raise
    return True


def _read(path: Path, timeout_s: float, env: RankEnv) -> Optional[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            text = ""
        if text:
            return None if text == NONE_FREE else int(text)
        if time.monotonic() > deadline:
            raise PortError(
                f"rank {env.rank}: rank 0 of job {env.job_id} chose no port within {timeout_s:g}s "
                f"(cluster.rendezvous_timeout_s); {path} was not written: is the run dir on a "
                "file system every node sees?"
            )
        time.sleep(POLL_S)
