"""Rendezvous: a group that cannot form fails in time, naming the address and missing ranks."""

from __future__ import annotations

import time

import pytest
import torch

from hpcdl.dist import RendezvousError, process_group
from hpcdl.env import RankEnv
from hpcdl.launch.local import free_port


def test_missing_rank_is_named_within_the_timeout() -> None:
    env = RankEnv(rank=0, world_size=3, master_port=free_port(), launcher="slurm")
    started = time.monotonic()
    with (
        pytest.raises(RendezvousError) as info,
        process_group(env, torch.device("cpu"), timeout_s=2),
    ):
        pass
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert "ranks [1, 2] of 3 did not arrive" in message
    assert f"127.0.0.1:{env.master_port}" in message
    assert elapsed < 15


def test_unreachable_master_is_named() -> None:
    # Rank 1 with nobody listening at MASTER_ADDR:PORT.
    env = RankEnv(rank=1, world_size=2, master_port=free_port(), launcher="slurm")
    with (
        pytest.raises(RendezvousError, match=r"could not reach MASTER_ADDR:PORT=127\.0\.0\.1"),
        process_group(env, torch.device("cpu"), timeout_s=2),
    ):
        pass
