"""Rendezvous: a group that cannot form fails in time, naming the address and missing ranks."""

from __future__ import annotations

import multiprocessing as mp
import socket
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

from hpcdl.dist import RendezvousError, process_group
from hpcdl.env import RankEnv, master_port_candidates
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


def free_job_id() -> str:
    """A job id whose derived candidate ports are all free here."""
    for number in range(4242, 4242 + 50 * 997, 997):
        env = RankEnv(job_id=str(number), master_port_derived=True)
        ports = master_port_candidates(env)
        try:
            for port in ports:
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return str(number)
    raise RuntimeError("no job id with free candidate ports")


def form_group_and_sum(env: RankEnv, results: Any) -> None:
    try:
        with process_group(env, torch.device("cpu"), timeout_s=30):
            total = torch.tensor([float(env.rank + 1)])
            torch.distributed.all_reduce(total)
            results.put((env.rank, float(total.item())))
    except BaseException as err:
        results.put((env.rank, repr(err)))


def test_a_derived_port_taken_by_another_job_moves_rank_0_to_the_next_candidate() -> None:
    job_id = free_job_id()
    derived = RankEnv(job_id=job_id, master_port_derived=True)
    first, second = master_port_candidates(derived)[:2]
    # Another job of this node listens on the first candidate (its own rendezvous under way,
    # one of its ranks arrived), a program that is no TCPStore on the second: rank 0 takes
    # the third, and rank 1 finds it there.
    other_job = dist.TCPStore("127.0.0.1", first, 2, is_master=True, wait_for_workers=False)
    other_job.set("hpcdl/777/0/arrived/0", "1")
    program = socket.create_server(("127.0.0.1", second))
    context = mp.get_context("spawn")
    results = context.Queue()
    ranks = [
        context.Process(
            target=form_group_and_sum,
            args=(
                RankEnv(
                    rank=rank,
                    world_size=2,
                    master_port=first,
                    master_port_derived=True,
                    launcher="slurm",
                    job_id=job_id,
                ),
                results,
            ),
        )
        for rank in (1, 0)  # rank 1 first: it meets the other job's store before rank 0 is up
    ]
    try:
        for process in ranks:
            process.start()
            time.sleep(0.5)
        got = dict(results.get(timeout=60) for _ in ranks)
    finally:
        for process in ranks:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
        program.close()
    assert got == {0: 3.0, 1: 3.0}
    # Nothing of this job reached the other job's store, and its ranks' keys are untouched.
    assert not other_job.check([f"hpcdl/{job_id}/0/port"])
    assert not other_job.check([f"hpcdl/{job_id}/0/arrived/1"])
    assert not other_job.check(["hpcdl/777/0/arrived/1"])
    assert other_job.num_keys() == 1  # its own arrival key only


def test_every_candidate_port_taken_is_one_line_naming_the_fix() -> None:
    job_id = free_job_id()
    env = RankEnv(rank=0, world_size=2, launcher="slurm", job_id=job_id, master_port_derived=True)
    taken = [socket.create_server(("127.0.0.1", port)) for port in master_port_candidates(env)]
    try:
        with (
            pytest.raises(RendezvousError) as info,
            process_group(env, torch.device("cpu"), timeout_s=2),
        ):
            pass
    finally:
        for server in taken:
            server.close()
    message = str(info.value)
    assert "are all in use on this node" in message
    assert "cluster.env.MASTER_PORT=<port>" in message
    assert "\n" not in message
