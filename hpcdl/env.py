"""Who am I: rank, world size and rendezvous address from the launcher's environment.

All knowledge of SLURM_* and SUBMITIT_LOCAL_* variables lives here. Plain stdlib, and a
pure function of an environment mapping, so rank logic is tested with dicts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

# Master ports are derived from the job id inside this range: above the well-known and
# registered ports that clusters commonly use, below Linux's ephemeral range (32768+).
PORT_BASE = 15000
PORT_SPAN = 15000
# A derived port may be taken (by a job on the same node whose id is congruent, or any
# service): rank 0 then takes the next of NUM_PORT_CANDIDATES, PORT_STRIDE apart (so that
# they are not the next job ids' own ports), and the other ranks look for it there.
NUM_PORT_CANDIDATES = 8
PORT_STRIDE = 1777


@dataclass(frozen=True)
class RankEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    # True where master_port was derived from the job id (no MASTER_PORT was set).
    master_port_derived: bool = False
    launcher: str = "debug"  # debug | local | slurm | torchrun
    job_id: Optional[str] = None
    restart_count: int = 0
    hostname: Optional[str] = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def port_for_job(job_id: str, candidate: int = 0) -> int:
    digits = re.sub(r"\D", "", job_id) or "0"
    return PORT_BASE + (int(digits) + candidate * PORT_STRIDE) % PORT_SPAN


def master_port_candidates(env: RankEnv) -> list[int]:
    """The ports rank 0 may listen on, in order: the one set, or the job's derived ones."""
    if not env.master_port_derived or env.job_id is None:
        return [env.master_port]
    return [port_for_job(env.job_id, k) for k in range(NUM_PORT_CANDIDATES)]


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand Slurm's compressed host list: 'gpu[01-03,07],login1' -> gpu01 gpu02 gpu03 gpu07 login1."""
    hosts: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", nodelist):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not match:
            hosts.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            lo, _, hi = item.partition("-")
            if not hi:
                hosts.append(f"{prefix}{lo}{suffix}")
                continue
            width = len(lo)
            hosts.extend(f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1))
    return hosts


def rank_env_from(environ: Mapping[str, str]) -> RankEnv:
    """The rank's identity, from (in order) a Slurm step, submitit's local launcher, torchrun."""
    if "SLURM_JOB_ID" in environ and "SLURM_PROCID" in environ:
        return _from_slurm(environ)
    if "SUBMITIT_LOCAL_JOB_ID" in environ:
        return _from_submitit_local(environ)
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return _from_torchrun(environ)
    return RankEnv()


def _from_torchrun(environ: Mapping[str, str]) -> RankEnv:
    """torchrun's variables (or the same ones `hpcdl run` exports to a program), plus the
    HPCDL_* ones a program started by `hpcdl run` gets: its job and restart count."""

    def number(*names: str, default: int) -> int:
        for name in names:
            if environ.get(name):
                return int(environ[name])
        return default

    return RankEnv(
        rank=int(environ["RANK"]),
        local_rank=number("LOCAL_RANK", default=0),
        world_size=int(environ["WORLD_SIZE"]),
        node_rank=number("GROUP_RANK", "NODE_RANK", default=0),
        num_nodes=number("GROUP_WORLD_SIZE", default=1),
        master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
        master_port=number("MASTER_PORT", default=29500),
        launcher="torchrun",
        job_id=environ.get("HPCDL_JOB_ID") or environ.get("TORCHELASTIC_RUN_ID") or None,
        restart_count=number("HPCDL_RESTART_COUNT", default=0)
        + number("TORCHELASTIC_RESTART_COUNT", default=0),
        hostname=environ.get("HOSTNAME"),
    )


def slurm_job_ref(environ: Mapping[str, str], job_id: str) -> str:
    """The id Slurm's commands (scontrol requeue, squeue -j, scontrol show job) take for this
    job alone: `<array>_<task>` for the array task whose SLURM_JOB_ID is the array's own
    id, which names every task of the array (`scontrol requeue` requeued them all, completed
    ones included); else job_id."""
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    if array and task and job_id == environ.get("SLURM_JOB_ID"):
        return f"{array}_{task}"
    return job_id


def torchrun_variables(env: RankEnv, per_node: int) -> dict[str, str]:
    """The per-rank variables torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, ...), for code
    that reads them: users' models and datasets in hpcdl's ranks, programs under `hpcdl run`."""
    return {
        "RANK": str(env.rank),
        "LOCAL_RANK": str(env.local_rank),
        "WORLD_SIZE": str(env.world_size),
        "LOCAL_WORLD_SIZE": str(per_node),
        "NODE_RANK": str(env.node_rank),
        "GROUP_RANK": str(env.node_rank),
        "GROUP_WORLD_SIZE": str(env.num_nodes),  # nodes, as torchrun names it
    }


# `cluster.requeue=chain`: set in a continuation job's script to its place in the chain.
CHAIN_LINK = "HPCDL_CHAIN_LINK"


def _from_slurm(environ: Mapping[str, str]) -> RankEnv:
    job_id = environ["SLURM_JOB_ID"]
    nodes = expand_nodelist(environ.get("SLURM_JOB_NODELIST", environ.get("SLURM_NODELIST", "")))
    return RankEnv(
        rank=int(environ["SLURM_PROCID"]),
        local_rank=int(environ.get("SLURM_LOCALID", "0")),
        world_size=int(environ.get("SLURM_NTASKS", "1")),
        node_rank=int(environ.get("SLURM_NODEID", "0")),
        num_nodes=int(environ.get("SLURM_JOB_NUM_NODES", environ.get("SLURM_NNODES", "1"))),
        master_addr=environ.get("MASTER_ADDR") or (nodes[0] if nodes else "127.0.0.1"),
        master_port=int(environ.get("MASTER_PORT") or port_for_job(job_id)),
        master_port_derived=not environ.get("MASTER_PORT"),
        launcher="slurm",
        job_id=job_id,
        # Slurm's own restarts of this job id, plus the jobs before it in a chain.
        restart_count=int(environ.get("SLURM_RESTART_COUNT", "0"))
        + int(environ.get(CHAIN_LINK, "0") or 0),
        hostname=environ.get("SLURMD_NODENAME"),
    )


def _from_submitit_local(environ: Mapping[str, str]) -> RankEnv:
    job_id = environ["SUBMITIT_LOCAL_JOB_ID"]
    return RankEnv(
        rank=int(environ.get("SUBMITIT_LOCAL_GLOBALID", "0")),
        local_rank=int(environ.get("SUBMITIT_LOCAL_LOCALID", "0")),
        world_size=int(environ.get("SUBMITIT_LOCAL_NTASKS", "1")),
        master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
        # The local launcher picks a free port and exports MASTER_PORT; the pid-derived port
        # is only a fallback.
        master_port=int(environ.get("MASTER_PORT") or port_for_job(job_id)),
        launcher="local",
        job_id=job_id,
    )
