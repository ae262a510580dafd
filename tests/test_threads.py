"""Each rank's CPU threads: ranks sharing a node's CPUs split them (hpcdl.threads)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hpcdl.threads import threads_per_rank


@pytest.mark.parametrize(
    ("environ", "launcher", "per_node", "cpus", "expected"),
    [
        ({}, "local", 2, 2, 1),  # 2 ranks on 2 CPUs: one thread each, not two
        ({}, "local", 4, 16, 4),
        ({}, "local", 3, 2, 1),  # more ranks than CPUs: still one thread each
        ({}, "torchrun", 8, 64, 8),
        ({}, "local", 1, 16, None),  # one rank: torch's default (all 16)
        ({}, "debug", 1, 16, None),
        ({"OMP_NUM_THREADS": "3"}, "local", 2, 16, None),  # the user's choice: torch reads it
        # Slurm binds each task to its --cpus-per-task CPUs: the default's mask already
        ({}, "slurm", 4, 8, None),
        ({"SLURM_CPUS_PER_TASK": "8"}, "slurm", 4, 8, 8),
        ({"SLURM_CPUS_PER_TASK": "8"}, "slurm", 4, 32, 8),  # a mask wider than the task's share
        ({"SLURM_CPUS_PER_TASK": "8", "OMP_NUM_THREADS": "2"}, "slurm", 4, 32, None),
    ],
)
def test_threads_per_rank(
    environ: dict[str, str], launcher: str, per_node: int, cpus: int, expected: int | None
) -> None:
    assert threads_per_rank(environ, launcher, per_node, cpus) == expected


def test_a_script_rank_gets_its_share_unless_omp_num_threads_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hpcdl run`: the program's OMP_NUM_THREADS (torch and NumPy read it at start-up)."""
    from hpcdl.cli.compose import compose_config
    from hpcdl.config.schema import ScriptConfig
    from hpcdl.env import RankEnv
    from hpcdl.rundir import RunDir
    from hpcdl.script_job import program_env
    from hpcdl.threads import usable_cpus

    cfg = compose_config(["cluster=local", "cluster.tasks_per_node=2"])
    cfg = replace(cfg, script=ScriptConfig(command=["python", "t.py"]))
    env = RankEnv(rank=1, local_rank=1, world_size=2, launcher="local", job_id="7")
    run = RunDir(tmp_path)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    values = program_env(cfg, env, run, run.stop_file("7", 0))
    assert values["OMP_NUM_THREADS"] == str(max(1, usable_cpus() // 2))
    monkeypatch.setenv("OMP_NUM_THREADS", "5")  # inherited by the program as it is
    assert "OMP_NUM_THREADS" not in program_env(cfg, env, run, run.stop_file("7", 0))
