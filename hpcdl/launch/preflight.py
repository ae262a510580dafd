"""Check a Slurm request against the real cluster (scontrol/sinfo) before queueing it.

A request that can never run (no such partition, no node with the GRES or feature, over the
partition's MaxTime or size) is refused here with one line naming the key, instead of
after a day in the queue. Stdlib only.
"""

from __future__ import annotations

import os
import re
import signal as signal_module
import subprocess
from typing import Optional

from hpcdl.config.schema import ClusterConfig, tasks_per_node
from hpcdl.errors import ConfigError


class SlurmUnreachable(ConfigError):
    """No Slurm to ask here: its commands are missing, or they cannot reach the controller."""


def _run(cmd: list[str]) -> str:
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.isfile(conf):
        # scontrol/sinfo would retry for 60 s ("s_p_parse_file: cannot stat file") first
        raise SlurmUnreachable(
            f"SLURM_CONF={conf}: no such file, so Slurm's commands have no configuration; "
            "point it at this cluster's slurm.conf, or unset it (for the dev cluster: "
            'eval "$(slurm/devcluster env)"); --no-preflight skips this check'
        )
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise SlurmUnreachable(
            f"cluster.launcher=slurm: `{cmd[0]}` not found; run on a Slurm login node "
            "(or skip the check with --no-preflight)"
        ) from None
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        why = lines[0] if lines else f"exit status {out.returncode}"
        if any(s in out.stderr for s in ("resolve_ctls", "Unable to contact", "fetch_config")):
            raise SlurmUnreachable(
                f"`{' '.join(cmd)}` failed: {why}; Slurm's controller cannot be reached from "
                'here: is SLURM_CONF set (for the dev cluster: eval "$(slurm/devcluster env)")? '
                "--no-preflight skips this check"
            )
        raise ConfigError(f"`{' '.join(cmd)}` failed: {why}")
    return out.stdout


def parse_partitions(text: str) -> dict[str, dict[str, str]]:
    """`scontrol show partition -o` lines -> {name: {key: value}}."""
    parts = {}
    for line in text.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "PartitionName" in fields:
            parts[fields["PartitionName"]] = fields
    return parts


def slurm_minutes(value: str) -> float | None:
    """Slurm time ('UNLIMITED', 'MM', 'HH:MM:SS', 'D-HH:MM:SS', 'D-HH') -> minutes."""
    if value in ("UNLIMITED", "INFINITE", "NONE", ""):
        return None
    days = 0
    if "-" in value:
        d, value = value.split("-", 1)
        days = int(d)
        parts = [int(x) for x in value.split(":")] + [0, 0]
        h, m, s = parts[:3]
    else:
        parts = [int(x) for x in value.split(":")]
        if len(parts) == 1:
            h, m, s = 0, parts[0], 0
        elif len(parts) == 2:
            h, m, s = 0, parts[0], parts[1]
        else:
            h, m, s = parts
    return days * 1440 + h * 60 + m + s / 60


def parse_gres(gres: str) -> dict[str, int]:
    """'gpu:a100:4(S:0-1),gpu:v100:2' -> {'a100': 4, 'v100': 2, '': 6} (counts by type)."""
    counts: dict[str, int] = {}
    for item in gres.split(","):
        item = re.sub(r"\(.*?\)", "", item)
        bits = item.split(":")
        if bits[0] != "gpu" or len(bits) < 2:
            continue
        kind, count = (bits[1], bits[2]) if len(bits) >= 3 else ("", bits[1])
        n = int(re.sub(r"\D.*", "", count) or 0)
        counts[kind] = counts.get(kind, 0) + n
        if kind:
            counts[""] = counts.get("", 0) + n
    return counts


def constraint_satisfied(constraint: str, features: set[str]) -> bool:
    """Slurm constraint with & (and) and | (or); brackets and counts are not checked."""
    expr = re.sub(r"[\[\]]|\*\d+", "", constraint)
    return any(all(f.strip() in features for f in alt.split("&")) for alt in expr.split("|"))


def check(cluster: ClusterConfig, slurm_tasks: Optional[int] = None) -> str:
    """Raise ConfigError if the request cannot run; return the partition name used.
    slurm_tasks: the Slurm tasks per node when not one per rank (schema.slurm_tasks_per_node:
    one torchrun per node)."""
    from hpcdl.launch import container

    container.check(cluster)
    return check_request(cluster, slurm_tasks)


# sbatch options hpcdl writes itself, and the profile keys that set them. The same option
# in cluster.sbatch_extra would replace hpcdl's line or add a second one: a --time past the
# partition's MaxTime queued unchecked (pending forever), a --signal other than
# cluster.signal that the ranks do not act on (the job runs into its time limit, not
# requeued), --no-requeue or --output that the job's requeue and `hpcdl logs` do not expect.
OWNED_SBATCH_OPTIONS = {
    "time": "cluster.timeout_min",
    "partition": "cluster.partition",
    "account": "cluster.account",
    "qos": "cluster.qos",
    "constraint": "cluster.constraint",
    "nodes": "cluster.nodes",
    "ntasks": "cluster.nodes and cluster.tasks_per_node",
    "ntasks-per-node": "cluster.tasks_per_node",
    "cpus-per-task": "cluster.cpus_per_task",
    "mem": "cluster.mem_gb",
    "gres": "cluster.gpus_per_node and cluster.gpu_type",
    "gpus-per-node": "cluster.gpus_per_node and cluster.gpu_type",
    "signal": "cluster.signal and cluster.signal_delay_s",
    "requeue": "cluster.requeue",
    "no-requeue": "cluster.requeue",
    "output": "hpcdl itself (the logs in RUN_DIR/logs that hpcdl logs reads)",
    "error": "hpcdl itself (the logs in RUN_DIR/logs that hpcdl logs reads)",
    "open-mode": "hpcdl itself (the logs in RUN_DIR/logs that hpcdl logs reads)",
    "array": "hpcdl train -m (sweeps; cluster.array_parallelism for %N)",
}


def sbatch_extra_refusal(cluster: ClusterConfig) -> str | None:
    """One line for the first cluster.sbatch_extra key that names an option hpcdl sets
    from the profile itself; None when there is none."""
    for key in cluster.sbatch_extra:
        option = str(key).replace("_", "-")
        owner = OWNED_SBATCH_OPTIONS.get(option)
        if owner is None:
            continue
        drop = f"~cluster.sbatch_extra.{key}"
        if owner.startswith("cluster."):
            return f"cluster.sbatch_extra.{key}: --{option} comes from {owner}; set that instead and drop this key ({drop})"
        return f"cluster.sbatch_extra.{key}: --{option} is set by {owner}; drop this key ({drop})"
    return None


# The warning signals a job can tell apart: SIGTERM is also scancel's and the time limit's
# kill (a cancel would look like the warning and requeue), SIGINT/SIGHUP stop a run
# anyway, SIGKILL/SIGSTOP cannot be caught.
WARNING_SIGNALS = ("USR1", "USR2")


def signal_refusal(cluster: ClusterConfig) -> str | None:
    """One line when cluster.signal is not a warning signal the ranks can act on."""
    name = str(cluster.signal).upper().removeprefix("SIG")
    if name in WARNING_SIGNALS:
        return None
    why = (
        "is not a signal"
        if not hasattr(signal_module, "SIG" + name)
        else "would not tell the warning from a cancel or a kill"
    )
    return (
        f"cluster.signal={cluster.signal!r}: {why}; the warning before the time limit must "
        f"be {' or '.join(WARNING_SIGNALS)} (USR2 by default)"
    )


def sbatch_options_refusal(cluster: ClusterConfig) -> str | None:
    """What the sbatch options would get wrong whatever the cluster: the warning signal,
    and cluster.sbatch_extra options that hpcdl writes itself; None when nothing."""
    return signal_refusal(cluster) or sbatch_extra_refusal(cluster)


# sbatch(1) on --signal: "the signal may be sent up to 60 seconds earlier than specified".
EARLY_SIGNAL_S = 60
# Less than this to train in an allocation, counting the early signal, is warned about.
SHORT_ALLOCATION_S = 60


# The least warning a save of a small model needs (a smaller delay is no advice to give).
MIN_SIGNAL_DELAY_S = 30


def short_time_limit_note(cluster: ClusterConfig) -> Optional[str]:
    """A time limit so short that the time-limit signal may come before training starts: each
    allocation then saves and requeues at once, and the requeues run out (one line, or None)."""
    left = cluster.timeout_min * 60 - cluster.signal_delay_s - EARLY_SIGNAL_S
    if left >= SHORT_ALLOCATION_S:
        return None
    needed = -(-(cluster.signal_delay_s + EARLY_SIGNAL_S + SHORT_ALLOCATION_S) // 60)
    delay = cluster.timeout_min * 60 - EARLY_SIGNAL_S - SHORT_ALLOCATION_S  # the most that fits
    smaller = f", or cluster.signal_delay_s={delay} or less" if delay >= MIN_SIGNAL_DELAY_S else ""
    return (
        f"cluster.timeout_min={cluster.timeout_min} with cluster.signal_delay_s="
        f"{cluster.signal_delay_s}: Slurm may send the time-limit signal up to "
        f"{EARLY_SIGNAL_S} s early, so an allocation may save and stop before it trains a step "
        f"(each time counts against cluster.max_requeues={cluster.max_requeues}); set "
        f"cluster.timeout_min={needed} or more{smaller}"
    )


# A cluster.setup line with one of these makes the job's Python environment itself.
ENVIRONMENT_SETUP_WORDS = ("activate", "conda", "mamba", "venv", "PATH", "python", "pyenv")


def export_none_note(cluster: ClusterConfig, command: Optional[list[str]]) -> Optional[str]:
    """A program found by name in a job that gets no environment from this shell (sbatch's
    --export=NONE, a site's default): the node's PATH finds another `python` than this
    shell's venv, and the job fails on an import. One line, or None."""
    export = cluster.sbatch_extra.get("export", os.environ.get("SBATCH_EXPORT", ""))
    if not str(export).upper().startswith("NONE") or not command:
        return None
    if any(word in line for line in cluster.setup for word in ENVIRONMENT_SETUP_WORDS):
        return None  # the setup makes an environment of its own
    import shutil

    program = command[0]
    if os.path.isabs(program):
        return None
    here = shutil.which(program)
    return (
        f"--export=NONE: the job finds `{program}` on the node's PATH, not this shell's "
        f"({here or 'not found'} here); activate your environment in cluster.setup "
        "(\"cluster.setup=['source /path/to/venv/bin/activate']\") or give the program's "
        "full path"
    )


def check_sbatch_extra(cluster: ClusterConfig) -> None:
    why = sbatch_options_refusal(cluster)
    if why:
        raise ConfigError(why)


def check_request(cluster: ClusterConfig, slurm_tasks: Optional[int] = None) -> str:
    """The request against the partition's limits and nodes (scontrol, sinfo): what `check`
    does but the container's runtime and image. First, before any Slurm command (so also
    where none answers): a warning signal the ranks can act on, and no cluster.sbatch_extra
    option that the profile's keys set."""
    check_sbatch_extra(cluster)
    partitions = parse_partitions(_run(["scontrol", "show", "partition", "-o"]))
    if cluster.partition and "," in cluster.partition:
        return _check_partition_list(cluster, partitions, slurm_tasks)
    name = cluster.partition or next(
        (n for n, f in partitions.items() if f.get("Default") == "YES"), None
    )
    if name not in partitions:
        raise ConfigError(
            f"cluster.partition={name!r}: no such partition; this cluster has "
            f"{', '.join(sorted(partitions)) or 'none'} (scontrol show partition)"
        )
    info = partitions[name]
    max_min = slurm_minutes(info.get("MaxTime", "UNLIMITED"))
    if max_min is not None and cluster.timeout_min > max_min:
        raise ConfigError(
            f"cluster.timeout_min={cluster.timeout_min}: partition {name!r} allows at most "
            f"{max_min:g} minutes (MaxTime={info['MaxTime']})"
        )
    nodes = _partition_nodes(name)
    if cluster.nodes > len(nodes):
        raise ConfigError(
            f"cluster.nodes={cluster.nodes}: partition {name!r} has {len(nodes)} nodes (sinfo)"
        )
    max_nodes = info.get("MaxNodes", "UNLIMITED")
    if max_nodes.isdigit() and cluster.nodes > int(max_nodes):
        raise ConfigError(
            f"cluster.nodes={cluster.nodes}: partition {name!r} has MaxNodes={max_nodes}"
        )
    fitting = nodes
    if cluster.constraint:
        fitting = [n for n in fitting if constraint_satisfied(cluster.constraint, n[1])]
        if not fitting:
            have = sorted(set().union(*(n[1] for n in nodes)))
            raise ConfigError(
                f"cluster.constraint={cluster.constraint!r}: no node in partition {name!r} has "
                f"it (features: {', '.join(have) or 'none'})"
            )
    if cluster.gpus_per_node:
        kind = cluster.gpu_type or ""
        fitting = [n for n in fitting if n[2].get(kind, 0) >= cluster.gpus_per_node]
        if not fitting:
            most = max((n[2].get(kind, 0) for n in nodes), default=0)
            kinds = sorted({k for n in nodes for k, count in n[2].items() if k and count})
            if kind and most == 0 and kinds:  # a GPU type the partition does not have
                raise ConfigError(
                    f"cluster.gpu_type={kind!r}: partition {name!r} has no {kind} GPUs; its "
                    f"types are {', '.join(kinds)} (sinfo): set cluster.gpu_type to one of them"
                )
            gres = f"gpu:{kind + ':' if kind else ''}{cluster.gpus_per_node}"
            raise ConfigError(
                f"cluster.gpus_per_node={cluster.gpus_per_node} (--gres={gres}): partition {name!r} "
                f"nodes have at most {most} {kind or 'GPU'}{'s' if most != 1 else ''} (sinfo)"
            )
    fitting = _with_cpus_and_memory(cluster, name, fitting, slurm_tasks)
    if cluster.nodes > len(fitting):
        raise ConfigError(
            f"cluster.nodes={cluster.nodes}: only {len(fitting)} nodes of partition {name!r} "
            "have the requested GPUs/features"
        )
    return name


def _check_partition_list(
    cluster: ClusterConfig, partitions: dict[str, dict[str, str]], slurm_tasks: Optional[int]
) -> str:
    """cluster.partition='gpu,cpu' (sbatch -p takes a list, the job starts in whichever can run
    it first): each must exist, and one of them must be able to run the request."""
    from dataclasses import replace

    names = [n.strip() for n in str(cluster.partition).split(",") if n.strip()]
    unknown = [n for n in names if n not in partitions]
    if unknown:
        raise ConfigError(
            f"cluster.partition={cluster.partition!r}: no partition {unknown[0]!r}; this "
            f"cluster has {', '.join(sorted(partitions)) or 'none'} (scontrol show partition)"
        )
    refusals = []
    for name in names:
        try:
            check_request(replace(cluster, partition=name), slurm_tasks)
            return str(cluster.partition)
        except ConfigError as err:
            refusals.append(err)
    raise ConfigError(f"{refusals[0]} (and none of cluster.partition={cluster.partition!r} can)")


def _with_cpus_and_memory(
    cluster: ClusterConfig, partition: str, nodes: list[Node], slurm_tasks: Optional[int] = None
) -> list[Node]:
    """The nodes with the CPUs (Slurm tasks per node x cluster.cpus_per_task) and the memory
    (cluster.mem_gb) asked for: sbatch queues a job no node can hold, pending forever on
    (PartitionConfig) or refused in sbatch's own words. Unknown sizes (0) are let through.
    With one torchrun per node (slurm_tasks=1) its workers share that task's CPUs."""
    tasks = slurm_tasks or tasks_per_node(cluster)
    cpus = tasks * cluster.cpus_per_task
    fitting = [n for n in nodes if not n[3] or n[3] >= cpus]
    if not fitting:
        most = max(n[3] for n in nodes)
        if cluster.cpus_per_task > 1:
            key, fix = f"cluster.cpus_per_task={cluster.cpus_per_task}", "cluster.cpus_per_task"
        else:  # one CPU a task already: only fewer tasks fit
            key, fix = f"cluster.tasks_per_node={tasks}", "the tasks per node"
        raise ConfigError(
            f"{key}: {tasks} task{'s' if tasks != 1 else ''} per node "
            f"need{'s' if tasks == 1 else ''} {cpus} CPUs, and partition {partition!r} nodes "
            f"have at most {most} (sinfo); lower {fix}"
        )
    if cluster.mem_gb:
        have = [n for n in fitting if not n[4] or n[4] >= cluster.mem_gb * 1024]
        if not have:
            most_gb = max(n[4] for n in fitting) / 1024
            raise ConfigError(
                f"cluster.mem_gb={cluster.mem_gb}: partition {partition!r} nodes have at most "
                f"{most_gb:.1f} GB (sinfo's memory per node); lower cluster.mem_gb"
            )
        fitting = have
    return fitting


# A node as sinfo tells it: name, features, GRES, CPUs, memory (MB); 0: unknown.
Node = tuple[str, set[str], dict[str, int], int, int]


def _partition_nodes(partition: str) -> list[Node]:
    out = _run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N|%f|%G|%c|%m"])
    nodes = {}
    for line in out.splitlines():
        name, features, gres, cpus, memory = [*line.split("|"), "", "", "", ""][:5]
        feats = {f for f in features.split(",") if f and f != "(null)"}
        nodes[name] = (name, feats, parse_gres(gres), _number(cpus), _number(memory))
    return list(nodes.values())


def _number(text: str) -> int:
    """sinfo's CPUs or memory ("8", "8000", "8000+" for a range's least); 0 when unknown."""
    digits = text.strip().rstrip("+")
    return int(digits) if digits.isdigit() else 0
