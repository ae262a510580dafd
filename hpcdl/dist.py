"""Process group setup and teardown as one context manager, plus the few collectives we use.

The rendezvous is our own TCPStore handshake in front of init_process_group, so a group
that cannot form fails within the timeout with a message naming MASTER_ADDR:PORT and the
ranks that did not arrive, instead of hanging.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

from hpcdl.env import RankEnv, master_port_candidates
from hpcdl.errors import HpcdlError


class RendezvousError(HpcdlError):
    """The ranks of a job could not all meet at MASTER_ADDR:MASTER_PORT."""


def pick_device(requested: str, local_rank: int) -> torch.device:
    """cuda:<local_rank> when CUDA is there (respecting CUDA_VISIBLE_DEVICES), else cpu."""
    want_cuda = requested == "cuda" or (requested == "auto" and torch.cuda.is_available())
    if not want_cuda:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise HpcdlError("trainer.device=cuda: no CUDA device is visible; use trainer.device=auto")
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


@contextmanager
def process_group(
    env: RankEnv, device: torch.device, timeout_s: int, collective_timeout_s: Optional[float] = None
) -> Iterator[None]:
    """Form the process group (NCCL on CUDA, gloo on CPU) for any launched job; the in-process
    debug rank runs without one. timeout_s bounds the rendezvous; collective_timeout_s
    (default: the same) every collective after it, so a hung one ends the job
    (set_collective_timeout changes it)."""
    if env.world_size == 1 and env.launcher == "debug":
        yield
        return
    store = _rendezvous(env, timeout_s)
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {}
    if backend == "nccl":
        kwargs["device_id"] = device
        # A collective past its timeout tears the process down (instead of hanging on):
        # the job ends, as a stalled rank's does.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    dist.init_process_group(
        backend,
        store=dist.PrefixStore("pg", store),
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(seconds=collective_timeout_s or timeout_s),
        **kwargs,
    )
    failed = False
    try:
        yield
    except Exception:
        failed = True
        raise
    finally:
        # NCCL's teardown is collective: a rank that fails alone (out of memory, an error in
        # rank 0's save) would wait in it, without limit and before its error is printed,
        # for peers still in the step's collectives. Such a rank leaves without it
        # (hpcdl.launch.rank_main prints the error and exits at once); gloo's is local.
        if not (failed and backend == "nccl"):
            dist.destroy_process_group()


def set_collective_timeout(seconds: float) -> None:
    """Bound the collectives started from now on (the job starts with the first step's
    allowance, hpcdl.watchdog.first_step_allowance); nothing without a process group."""
    if dist.is_available() and dist.is_initialized():
        from torch.distributed.distributed_c10d import _set_pg_timeout

        _set_pg_timeout(timedelta(seconds=seconds))


# A candidate port that a probe cannot connect to within this, or whose listener does not
# answer as a TCPStore within PROBE_STORE_S, is tried again on the next round.
PROBE_CONNECT_S = 1.0
PROBE_STORE_S = 5.0


def _rendezvous(env: RankEnv, timeout_s: int) -> dist.Store:
    """Rank 0 listens (on the first free candidate port); every rank then marks its arrival
    and waits for all of them. Keys are under the job's id and attempt: a rank that reached
    another job's store (a port taken by a job on the same node) finds no key of its own job
    there and looks on, instead of joining that job. Returns the job's part of the store."""
    ports = master_port_candidates(env)
    mine = f"hpcdl/{env.job_id or '-'}/{env.restart_count}"
    if env.rank == 0:
        store, port = _listen(env, ports, timeout_s, mine)
    else:
        store, port = _find_master(env, ports, timeout_s, mine)
    where = f"MASTER_ADDR:PORT={env.master_addr}:{port}"
    ours = dist.PrefixStore(mine, store)
    ours.set(f"arrived/{env.rank}", "1")
    keys = [f"arrived/{r}" for r in range(env.world_size)]
    deadline = time.monotonic() + timeout_s
    while not ours.check(keys):
        if time.monotonic() > deadline:
            missing = [r for r, k in enumerate(keys) if not ours.check([k])]
            raise RendezvousError(
                f"rank {env.rank}: ranks {missing} of {env.world_size} did not arrive at {where} "
                f"within {timeout_s}s (cluster.rendezvous_timeout_s)"
            )
        time.sleep(0.05)
    return ours


def _listen(
    env: RankEnv, ports: list[int], timeout_s: int, mine: str
) -> tuple[dist.TCPStore, int]:
    for port in ports:
        try:
            store = _tcp_store(env, port, is_master=True, timeout_s=timeout_s)
        except Exception as err:  # torch raises several types (DistNetworkError, RuntimeError)
            if _in_use(err) and port != ports[-1]:
                continue
            if _in_use(err):
                taken = f"ports {ports} are all" if len(ports) > 1 else f"port {port} is"
                reason = f"{taken} in use on this node; set a free one with "
                reason += "cluster.env.MASTER_PORT=<port>"
            else:
                reason = f"{_first_line(err)}; check MASTER_ADDR (the job's first node)"
            raise RendezvousError(
                f"rank 0: could not listen at MASTER_ADDR:PORT={env.master_addr}:{port}: {reason}"
            ) from None
        store.set(f"{mine}/port", str(port))
        return store, port
    raise AssertionError("no candidate ports")  # master_port_candidates gives at least one


def _find_master(
    env: RankEnv, ports: list[int], timeout_s: int, mine: str
) -> tuple[dist.TCPStore, int]:
    """The store rank 0 of this job listens on: the first candidate port with this job's
    key, looked for until the deadline (rank 0 may start later than this rank)."""
    deadline = time.monotonic() + timeout_s
    last_error = "nothing listening"
    not_stores: set[int] = set()  # skipped from then on: a program, not rank 0 starting late
    while True:
        for port in ports:
            if port in not_stores:
                continue
            try:
                store = _connect(env, port)
            except _NotAStore as err:
                not_stores.add(port)
                last_error = str(err)
                continue
            except Exception as err:
                last_error = _first_line(err)
                continue
            if store.check([f"{mine}/port"]):
                store.set_timeout(timedelta(seconds=timeout_s))
                return store, port
            last_error = f"port {port} is another job's or another program's"
        if time.monotonic() > deadline:
            where = f"MASTER_ADDR:PORT={env.master_addr}:{ports[0]}"
            if len(ports) > 1:
                where += f" (or the next candidates {ports[1:]})"
            raise RendezvousError(
                f"rank {env.rank}: could not reach {where} within {timeout_s}s "
                f"(cluster.rendezvous_timeout_s): {last_error}"
            )
        time.sleep(0.1)


class _NotAStore(Exception):
    """Something listens at the port but does not answer as a TCPStore."""


def _connect(env: RankEnv, port: int) -> dist.TCPStore:
    """A client of the TCPStore at ``port``; an error at once where nothing listens (a
    TCPStore client would retry until its timeout), _NotAStore where the listener does not
    answer within PROBE_STORE_S (torch's client waits for its answer without a timeout: the
    attempt is left behind in a daemon thread)."""
    socket.create_connection((env.master_addr, port), timeout=PROBE_CONNECT_S).close()
    made: list[Any] = []

    def attempt() -> None:
        try:
            made.append(_tcp_store(env, port, is_master=False, timeout_s=PROBE_STORE_S))
        except Exception as err:
            made.append(err)

    thread = threading.Thread(target=attempt, name=f"hpcdl-rendezvous-{port}", daemon=True)
    thread.start()
    thread.join(PROBE_STORE_S)
    if not made:
        raise _NotAStore(f"port {port}: what listens there does not answer as a TCPStore")
    if isinstance(made[0], Exception):
        raise made[0]
    return made[0]


def _tcp_store(env: RankEnv, port: int, *, is_master: bool, timeout_s: float) -> dist.TCPStore:
    return dist.TCPStore(
        env.master_addr,
        port,
        env.world_size,
        is_master=is_master,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def _first_line(err: Exception) -> str:
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def _in_use(err: Exception) -> bool:
    text = str(err).lower()
    return "eaddrinuse" in text or "address already in use" in text


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over ranks, in place; returns the tensor (identity with one rank)."""
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_gather_objects(obj: Any) -> list[Any]:
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
