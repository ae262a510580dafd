"""slurm/devcluster itself, against the real cluster: shape, partitions, GRES, constraints,
two nodes that reach each other by name, preemption with requeue, idempotent `up`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.slurm.conftest import DevCluster, run_devcluster, sacct_state, wait_until

pytestmark = pytest.mark.slurm

FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL")
# sinfo %t %c %m %G %f of every node: state, CPUs, RealMemory (MB), GRES, features.
NODE_SHAPE = ("idle", "8", "8000", "gpu:a100:4", "gpupod")


def sbatch(*args: str) -> str:
    out = subprocess.run(
        ["sbatch", "--parsable", *args], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def final_state(job_id: str, timeout_s: float = 60) -> str:
    wait_until(
        lambda: sacct_state(job_id).startswith(FINAL), timeout_s, f"job {job_id} to end", 0.3
    )
    return sacct_state(job_id)


def key_values(line: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)


def test_two_idle_nodes_with_the_documented_shape(devcluster: DevCluster) -> None:
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N|%P|%t|%c|%m|%G|%f"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = [line.split("|") for line in out.stdout.splitlines()]
    assert {r[0] for r in rows} == {"n1", "n2"}
    assert {r[1] for r in rows} == {"cpu*", "gpu", "urgent"}
    for row in rows:
        assert tuple(row[2:]) == NODE_SHAPE, row

    parts = subprocess.run(
        ["scontrol", "show", "partition", "-o"], capture_output=True, text=True, check=True
    )
    by_name = {kv["PartitionName"]: kv for kv in map(key_values, parts.stdout.splitlines())}
    for name in ("cpu", "gpu"):
        assert by_name[name]["PriorityTier"] == "1"
        assert by_name[name]["PreemptMode"] == "REQUEUE"
        assert by_name[name]["MaxTime"] == "01:00:00"
    assert by_name["urgent"]["PriorityTier"] == "10"
    assert by_name["urgent"]["PreemptMode"] == "OFF"


@pytest.mark.parametrize("partition", ["cpu", "gpu", "urgent"])
def test_a_trivial_job_completes_in_each_partition(
    devcluster: DevCluster, tmp_path: Path, partition: str
) -> None:
    out = tmp_path / "job.out"
    job_id = sbatch("-p", partition, "-o", str(out), "--wrap", "echo ran in $SLURM_JOB_PARTITION")
    assert final_state(job_id) == "COMPLETED", out.read_text()
    assert out.read_text().strip() == f"ran in {partition}"


def test_gres_sets_cuda_visible_devices_and_python_runs_on_the_node(
    devcluster: DevCluster, tmp_path: Path
) -> None:
    out = tmp_path / "job.out"
    code = "import os, socket; print(socket.gethostname(), os.environ['CUDA_VISIBLE_DEVICES'])"
    job_id = sbatch(
        "--gres=gpu:a100:2",
        "-p",
        "gpu",
        "-C",
        "gpupod",
        "-o",
        str(out),
        "--wrap",
        f'python3 -c "{code}"',
    )
    assert final_state(job_id) == "COMPLETED", out.read_text()
    host, visible = out.read_text().split()
    assert host in {"n1", "n2"}
    assert visible == "0,1"


@pytest.mark.parametrize(
    ("request_args", "message"),
    [
        (["--gres=gpu:a100:5"], "Requested node configuration is not available"),
        (["-C", "nvlink"], "Invalid feature specification"),
    ],
)
def test_impossible_requests_are_refused_at_submit(
    devcluster: DevCluster, request_args: list[str], message: str
) -> None:
    out = subprocess.run(
        ["sbatch", "-p", "gpu", *request_args, "-o", "/dev/null", "--wrap", "true"],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert message in out.stderr


# Rank 0 serves on its node, rank 1 connects to it by name (the nodes' private hosts file)
# and they swap hostnames. Rank 0 listens on :: (dual stack, as torch's c10d TCPStore does),
# so it sees rank 1 as ::ffff:ADDR, and names it from that address as c10d does (without the
# hosts file's ::ffff: lines, the lookup falls through to DNS, which is not reachable: "The
# hostname of the client socket cannot be retrieved. err=-3" in every multi-node job's log).
# Each rank also reports whether its node has a default route.
PING_PONG = """
import json, os, socket, subprocess, time
rank = int(os.environ["SLURM_PROCID"])
me = socket.gethostname()
first = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_STEP_NODELIST"]],
                       capture_output=True, text=True, check=True).stdout.split()[0]
port = 29000 + int(os.environ["SLURM_JOB_ID"]) % 1000
if rank == 0:
    server = socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True)
    server.settimeout(30)
    conn, address = server.accept()
    peer = conn.recv(100).decode()
    try:
        named = socket.getnameinfo(address, socket.NI_NAMEREQD)[0]
    except OSError as e:
        named = f"{address[0]}: {e}"
    conn.sendall(me.encode())
else:
    named = ""
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = socket.create_connection((first, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    conn.sendall(me.encode())
    peer = conn.recv(100).decode()
with open("/proc/net/route") as routes:
    default_route = any(line.split()[1] == "00000000" for line in list(routes)[1:])
print(json.dumps({"rank": rank, "host": me, "peer": peer, "named": named,
                  "default_route": default_route}))
"""


def test_two_node_step_has_two_hosts_that_talk_over_tcp(
    devcluster: DevCluster, tmp_path: Path
) -> None:
    script = tmp_path / "ping_pong.py"
    script.write_text(PING_PONG)
    out = subprocess.run(
        ["srun", "-p", "cpu", "-N", "2", "--ntasks-per-node=1", "python3", str(script)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.returncode == 0, out.stderr
    ranks = sorted((json.loads(line) for line in out.stdout.splitlines()), key=lambda r: r["rank"])
    assert [r["host"] for r in ranks] == ["n1", "n2"]
    assert [r["peer"] for r in ranks] == ["n2", "n1"]
    assert ranks[0]["named"] == "n2"  # by its ::ffff: address, from the hosts file
    assert not any(r["default_route"] for r in ranks)  # nothing leaves the machine


# Restarted (SLURM_RESTART_COUNT=1): done at once. First run: log the preemption signal and
# wait to be killed at the end of the partition's GraceTime.
VICTIM = """#!/bin/bash
log={log}
echo "start restart=${{SLURM_RESTART_COUNT:-0}} host=$(hostname)" >> "$log"
[ "${{SLURM_RESTART_COUNT:-0}}" -ge 1 ] && exit 0
trap 'echo "signal USR2" >> "$log"' USR2
sleep 300 &
while ! wait $!; do :; done
"""


def test_urgent_job_preempts_a_cpu_job_which_is_requeued_and_rerun(
    devcluster: DevCluster, tmp_path: Path
) -> None:
    log = tmp_path / "victim.log"
    script = tmp_path / "victim.sh"
    script.write_text(VICTIM.format(log=log))
    victim = sbatch(
        "-p", "cpu", "-n", "1", "-t", "10", "--signal=B:USR2@10", "-o", "/dev/null", str(script)
    )
    urgent = ""
    try:
        wait_until(lambda: log.exists(), 30, "the victim to start", 0.2)
        # Every CPU of both nodes: the victim must give way.
        urgent = sbatch(
            "-p", "urgent", "-N", "2", "--exclusive", "-o", "/dev/null", "--wrap", "sleep 3"
        )
        assert final_state(urgent, 60) == "COMPLETED"
        # GraceTime (15 s) has passed before urgent could start; the requeued victim starts
        # again once the scheduler sees it (~10 s).
        assert final_state(victim, 60) == "COMPLETED", log.read_text()
    finally:
        subprocess.run(["scancel", victim, *([urgent] if urgent else [])], check=False)
    lines = log.read_text().splitlines()
    assert lines[0].startswith("start restart=0 ")
    assert lines[1] == "signal USR2"  # preempt_send_user_signal: at once, not near the limit
    assert lines[2].startswith("start restart=1 ") and len(lines) == 3
    history = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-D", "-j", victim, "-o", "State"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert history == ["PREEMPTED", "COMPLETED"]


def test_up_again_changes_nothing_and_the_host_keeps_its_own_hosts_file(
    devcluster: DevCluster,
) -> None:
    pids_dir = devcluster.state_dir / "pids"
    before = {p.name: p.read_text() for p in pids_dir.iterdir()}
    assert set(before) == {"mariadbd", "slurmdbd", "slurmctld", "slurmd-n1", "slurmd-n2"}
    up = run_devcluster("up")
    assert up.returncode == 0, up.stderr
    assert "already up" in up.stderr
    assert {p.name: p.read_text() for p in pids_dir.iterdir()} == before
    status = run_devcluster("status")
    assert status.returncode == 0 and "devcluster: up" in status.stdout
    assert run_devcluster("env").stdout == f"export SLURM_CONF={devcluster.slurm_conf}\n"
    hosts = Path("/etc/hosts").read_text()
    assert "10.213." not in hosts and " n1" not in hosts
