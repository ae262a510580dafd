"""CPU threads for each rank. Ranks that share a node's CPUs split them, as torchrun does;
without this, every rank of `cluster=local` (and of torchrun-launched scripts) would start
one compute thread per CPU of the node, and N ranks would oversubscribe it N times over
(measured: a 2-rank CPU job on 2 CPUs ran 2.6x slower than with one thread each).
OMP_NUM_THREADS, when set, is the user's choice and wins."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Optional

THREADS_VAR = "OMP_NUM_THREADS"


def usable_cpus() -> int:
    """The CPUs this process may run on (a Slurm task's share, a taskset's mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_rank(
    environ: Mapping[str, str], launcher: str, ranks_per_node: int, cpus: int
) -> Optional[int]:
    """Intra-op threads for one rank; None: leave torch's default (its default is the
    number of CPUs in the process's affinity mask).

    - OMP_NUM_THREADS set: None (torch follows it).
    - Slurm: each task has its own CPUs (--cpus-per-task, bound by Slurm), already the
      default's mask; only capped at SLURM_CPUS_PER_TASK where a mask is wider than that.
    - local ranks, torchrun workers: they share one mask, so each takes an equal share,
      at least one thread.
    """
    if environ.get(THREADS_VAR):
        return None
    if launcher == "slurm":
        per_task = environ.get("SLURM_CPUS_PER_TASK", "")
        return min(cpus, int(per_task)) if per_task.isdigit() and int(per_task) > 0 else None
    if ranks_per_node <= 1:
        return None
    return max(1, cpus // ranks_per_node)
