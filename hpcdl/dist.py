"""Process group setup and teardown as one context manager, plus the few collectives we use.

The rendezvous is our own TCPStore handshake in front of init_process_group, so a group
that cannot form fails within the timeout with a message naming MASTER_ADDR:PORT and the
ranks that did not arrive, instead of hanging.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

from hpcdl.env import RankEnv
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
    (default: the same) every collective after it, so a hung one ends the job."""
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
    try:
        yield
    finally:
        dist.destroy_process_group()


def _rendezvous(env: RankEnv, timeout_s: int) -> dist.Store:
    where = f"MASTER_ADDR:PORT={env.master_addr}:{env.master_port}"
    try:
        store = dist.TCPStore(
            env.master_addr,
            env.master_port,
            env.world_size,
            is_master=env.rank == 0,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
    except Exception as err:  # torch raises several types (DistNetworkError, RuntimeError)
        raise RendezvousError(
            f"rank {env.rank}: could not reach {where} within {timeout_s}s "
            f"(cluster.rendezvous_timeout_s): {str(err).splitlines()[0]}"
        ) from None
    store.set(f"arrived/{env.rank}", "1")
    keys = [f"arrived/{r}" for r in range(env.world_size)]
    deadline = time.monotonic() + timeout_s
    while not store.check(keys):
        if time.monotonic() > deadline:
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            raise RendezvousError(
                f"rank {env.rank}: ranks {missing} of {env.world_size} did not arrive at {where} "
                f"within {timeout_s}s (cluster.rendezvous_timeout_s)"
            )
        time.sleep(0.05)
    return store


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
