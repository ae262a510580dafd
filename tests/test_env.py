"""Rank logic from environment dicts: Slurm, submitit's local launcher, torchrun, none."""

from __future__ import annotations

import pytest

from hpcdl.env import (
    NUM_PORT_CANDIDATES,
    PORT_BASE,
    PORT_SPAN,
    RankEnv,
    expand_nodelist,
    master_port_candidates,
    port_for_job,
    rank_env_from,
)


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("n1", ["n1"]),
        ("n[1-2]", ["n1", "n2"]),
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("a[1-2],b5,c[09-10]", ["a1", "a2", "b5", "c09", "c10"]),
        ("udc-an28-[1,7]", ["udc-an28-1", "udc-an28-7"]),
    ],
)
def test_expand_nodelist(nodelist: str, hosts: list[str]) -> None:
    assert expand_nodelist(nodelist) == hosts


def test_no_launcher_is_a_single_rank() -> None:
    assert rank_env_from({}) == RankEnv()


def test_slurm_step_two_nodes() -> None:
    env = rank_env_from(
        {
            "SLURM_JOB_ID": "4242",
            "SLURM_PROCID": "3",
            "SLURM_LOCALID": "1",
            "SLURM_NTASKS": "4",
            "SLURM_NODEID": "1",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_JOB_NODELIST": "n[1-2]",
            "SLURM_RESTART_COUNT": "2",
        }
    )
    assert (env.rank, env.local_rank, env.world_size, env.node_rank, env.num_nodes) == (
        3,
        1,
        4,
        1,
        2,
    )
    assert env.master_addr == "n1"
    assert env.master_port == port_for_job("4242")
    assert env.launcher == "slurm" and env.restart_count == 2 and not env.is_main


def test_master_port_is_derived_from_the_job_id_in_range() -> None:
    ports = {port_for_job(str(j)) for j in range(1000, 1100)}
    assert len(ports) == 100
    assert all(PORT_BASE <= p < PORT_BASE + PORT_SPAN for p in ports)


def test_slurm_batch_shell_without_procid_is_not_a_rank() -> None:
    # The batch script itself (no srun step) must not pretend to be rank 0 of N.
    assert rank_env_from({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "4"}).launcher == "debug"


def test_explicit_master_addr_and_port_win() -> None:
    env = rank_env_from(
        {
            "SLURM_JOB_ID": "7",
            "SLURM_PROCID": "0",
            "SLURM_JOB_NODELIST": "n1",
            "MASTER_ADDR": "10.0.0.5",
            "MASTER_PORT": "1234",
        }
    )
    assert (env.master_addr, env.master_port) == ("10.0.0.5", 1234)


def test_submitit_local_ranks() -> None:
    env = rank_env_from(
        {
            "SUBMITIT_LOCAL_JOB_ID": "999",
            "SUBMITIT_LOCAL_GLOBALID": "1",
            "SUBMITIT_LOCAL_LOCALID": "1",
            "SUBMITIT_LOCAL_NTASKS": "2",
            "MASTER_PORT": "31000",
        }
    )
    assert (env.rank, env.local_rank, env.world_size, env.master_port) == (1, 1, 2, 31000)
    assert env.launcher == "local"


def test_torchrun_variables() -> None:
    env = rank_env_from(
        {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "5"}
    )
    assert (env.rank, env.world_size, env.master_addr, env.master_port, env.launcher) == (
        2,
        4,
        "h",
        5,
        "torchrun",
    )


def test_a_program_under_torchrun_knows_its_node_job_and_restarts() -> None:
    env = rank_env_from(
        {
            "RANK": "5",
            "WORLD_SIZE": "8",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "4",
            "GROUP_RANK": "1",
            "GROUP_WORLD_SIZE": "2",
            "MASTER_ADDR": "n1",
            "MASTER_PORT": "9",
            "TORCHELASTIC_RUN_ID": "123",
            "TORCHELASTIC_RESTART_COUNT": "0",
            "HPCDL_JOB_ID": "123",
            "HPCDL_RESTART_COUNT": "2",
        }
    )
    assert (env.node_rank, env.num_nodes, env.job_id, env.restart_count) == (1, 2, "123", 2)


def test_a_derived_port_has_candidates_and_a_set_one_has_only_itself() -> None:
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}
    derived = rank_env_from(slurm)
    assert derived.master_port_derived
    ports = master_port_candidates(derived)
    assert ports[0] == derived.master_port == port_for_job("4242")
    assert len(set(ports)) == len(ports) == NUM_PORT_CANDIDATES
    assert all(PORT_BASE <= p < PORT_BASE + PORT_SPAN for p in ports)
    # The next job ids' own ports are not among this job's first candidates.
    assert not {port_for_job(str(4242 + k)) for k in range(1, 100)} & set(ports)
    chosen = rank_env_from({**slurm, "MASTER_PORT": "23456"})
    assert not chosen.master_port_derived
    assert master_port_candidates(chosen) == [23456]
    local = rank_env_from({"SUBMITIT_LOCAL_JOB_ID": "77", "MASTER_PORT": "41000"})
    assert master_port_candidates(local) == [41000]


def test_an_array_task_is_named_to_slurm_by_array_and_task() -> None:
    from hpcdl.env import slurm_job_ref

    # The task holding the array's own id: that id alone would name every task.
    task = {"SLURM_JOB_ID": "22", "SLURM_ARRAY_JOB_ID": "22", "SLURM_ARRAY_TASK_ID": "1"}
    assert slurm_job_ref(task, "22") == "22_1"
    other = {"SLURM_JOB_ID": "23", "SLURM_ARRAY_JOB_ID": "22", "SLURM_ARRAY_TASK_ID": "0"}
    assert slurm_job_ref(other, "23") == "22_0"
    assert slurm_job_ref({"SLURM_JOB_ID": "7"}, "7") == "7"  # not an array
    assert slurm_job_ref(task, "30") == "30"  # another job (a continuation): as given
