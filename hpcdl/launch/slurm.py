"""Slurm submission from the login node, through submitit. Never imports torch.

compose -> validate -> run dir -> code snapshot -> (preflight) -> sbatch via submitit ->
slurm.json in the run dir, and return at once.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from hpcdl.config.schema import (
    ClusterConfig,
    Config,
    Device,
    Requeue,
    ScriptLauncher,
    slurm_tasks_per_node,
    tasks_per_node,
)
from hpcdl.env import CHAIN_LINK
from hpcdl.errors import ConfigError, HpcdlError
from hpcdl.launch.snapshot import freeze_script_files, snapshot_code
from hpcdl.rundir import JobDir, RunDir


def sbatch_parameters(
    cluster: ClusterConfig, job_name: str, ntasks_per_node: Optional[int] = None
) -> dict[str, Any]:
    """submitit SlurmExecutor parameters for a cluster profile (one task per GPU unless
    ntasks_per_node says otherwise: one torchrun per node)."""
    params: dict[str, Any] = {
        "job_name": job_name,
        "nodes": cluster.nodes,
        "ntasks_per_node": ntasks_per_node or tasks_per_node(cluster),
        "cpus_per_task": cluster.cpus_per_task,
        "time": cluster.timeout_min,
        "signal_delay_s": cluster.signal_delay_s,
        "stderr_to_stdout": True,
        # Not submitit's `--wckey=submitit`: a site that enforces workload keys would refuse
        # it or charge it to a key that is not the user's (cluster.sbatch_extra.wckey sets one).
        "wckey": None,
    }
    optional = {
        "partition": cluster.partition,
        "account": cluster.account,
        "qos": cluster.qos,
        "constraint": cluster.constraint,
        # 0: all of each node's memory, as sbatch's --mem=0 (a GPU node's usual request)
        "mem": None if cluster.mem_gb is None else f"{cluster.mem_gb}GB" if cluster.mem_gb else "0",
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    if cluster.gpus_per_node:
        kind = f"{cluster.gpu_type}:" if cluster.gpu_type else ""
        params["gres"] = f"gpu:{kind}{cluster.gpus_per_node}"
    # Our own warning signal instead of submitit's fixed USR2; and requeue allowed, since
    # the job requeues itself on a time-limit warning (Slurm never requeues a TIMEOUT). A
    # chain never asks for it: its sites may refuse requeue altogether.
    extra: dict[str, Any] = {"signal": f"{signal_name(cluster)}@{cluster.signal_delay_s}"}
    if cluster.requeue == Requeue.scontrol:
        extra["requeue"] = True
    for key, value in cluster.sbatch_extra.items():
        if str(key).replace("_", "-") == "job-name":  # the user's name, not hpcdl-RUN
            params["job_name"] = str(value)  # (submitit writes --job-name itself: one line)
        elif value is False:  # a flag turned off (exclusive: false): no option, not =False
            continue
        else:
            extra[key] = value
    params["additional_parameters"] = extra
    return params


def signal_name(cluster: ClusterConfig) -> str:
    return cluster.signal.upper().removeprefix("SIG")


# Said in the job's log, where `hpcdl status` finds a job's first error line. The line as
# written, from a variable set before it: $BASH_COMMAND names the command that failed
# inside a shell function (Lmod's `module` says `return 1`).
SETUP_LINE_VAR = "HPCDL_SETUP_LINE"
SETUP_FAILED = (
    f'echo "error: cluster.setup: \\`${SETUP_LINE_VAR}\\` failed (exit $?); the job stops" >&2'
)


def setup_lines(cluster: ClusterConfig, code_dir: Path) -> list[str]:
    """Shell lines before srun: the profile's setup, its env, and the frozen code first on
    PYTHONPATH so later edits to the checkout never reach a queued or requeued job."""
    lines = []
    if cluster.setup:  # a line that fails ends the job (a `module load` that failed would
        lines += [  # train on the wrong stack, and the job would say COMPLETED)
            "set -e",
            f"trap {shlex.quote(SETUP_FAILED)} ERR",
            *(
                part
                for line in cluster.setup
                for part in (f"{SETUP_LINE_VAR}={shlex.quote(line)}", line)
            ),
            "trap - ERR",
            "set +e",
            f"unset {SETUP_LINE_VAR}",
        ]
    lines += [f"export {k}={shlex.quote(str(v))}" for k, v in cluster.env.items()]
    code = shlex.quote(str(code_dir))
    lines.append(f"export PYTHONPATH={code}${{PYTHONPATH:+:$PYTHONPATH}}")
    # `python -m` would put the job's working directory (the submit dir, often a checkout)
    # ahead of PYTHONPATH, shadowing the frozen copy (Python >= 3.11 honours this).
    lines.append("export PYTHONSAFEPATH=1")
    return lines


def host_python(cluster: ClusterConfig) -> str:
    """The interpreter the ranks run outside a container: cluster.python (a name the node's
    PATH has once cluster.setup ran, or an absolute path), else the one hpcdl runs in, as
    submitit's own submission uses (sys.executable): a venv's hpcdl called without
    activating the venv still gets that venv in the job."""
    return cluster.python or sys.executable


def python_note(cluster: ClusterConfig) -> Optional[str]:
    """A dry run's line for a cluster.python this machine does not have: not refused (it may
    exist on the compute nodes only), but said."""
    python = cluster.python
    if python is None or not python.startswith("/") or os.path.exists(python):
        return None
    return f"# note: cluster.python={python} does not exist here; the compute nodes must have it"


def make_executor(cfg: Config, base_dir: JobDir, job_name: Optional[str] = None) -> Any:
    """A submitit executor writing logs to the job dir's logs, running the code in its code
    dir (a run dir, or a sweep dir whose trials share one snapshot)."""
    import submitit

    from hpcdl.launch import container
    from hpcdl.launch.rank_main import rank_command

    class Executor(submitit.SlurmExecutor):
        @property
        def _submitit_command_str(self) -> str:
            return rank_command(self.python, str(self.folder))

    executor = Executor(
        folder=str(base_dir.log_dir),
        max_num_timeout=cfg.cluster.max_requeues,
        python=container.interpreter(cfg.cluster, base_dir, host_python(cfg.cluster), cfg.workdir),
    )
    executor.update_parameters(**job_parameters(cfg, base_dir, job_name))
    return executor


def job_parameters(cfg: Config, base_dir: JobDir, job_name: Optional[str] = None) -> dict[str, Any]:
    """Everything of the sbatch script but its interpreter: resources, setup lines before
    srun, srun's own options (a pyxis container), teardown lines after it."""
    from hpcdl.launch import container

    params = sbatch_parameters(
        cfg.cluster, job_name or f"hpcdl-{base_dir.path.name}", slurm_tasks_per_node(cfg)
    )
    params["setup"] = setup_lines(cfg.cluster, base_dir.code_dir)
    # The ranks get the script's environment (its setup, env, PYTHONPATH, submitit's
    # variables) also where sbatch's --export=NONE (cluster.sbatch_extra.export, a site's
    # default) made srun pass none: as sites advise, sbatch --export=NONE, srun --export=ALL.
    params["srun_args"] = ["--export=ALL"]
    if container.active(cfg.cluster):
        params["srun_args"] += container.srun_args(cfg.cluster, base_dir, cfg.workdir)
        params["teardown"] = container.teardown_lines(cfg.cluster, base_dir)
    return params


def sbatch_text(
    cfg: Config,
    run_dir: JobDir,
    array_size: Optional[int] = None,
    dependency: Optional[str] = None,
) -> str:
    """The exact sbatch script submitit writes for this run, or for a sweep's job array of
    array_size tasks (its folder: the sweep dir), waiting for `dependency` if given."""
    from submitit.slurm.slurm import _make_sbatch_string

    from hpcdl.launch import container
    from hpcdl.launch.rank_main import rank_command

    params = job_parameters(cfg, run_dir)
    if array_size is not None:
        params["map_count"] = array_size
        params["array_parallelism"] = array_throttle(cfg.cluster, array_size)
    if dependency is not None:
        params["additional_parameters"] = with_dependency(
            params["additional_parameters"], dependency
        )
    python = container.interpreter(cfg.cluster, run_dir, host_python(cfg.cluster), cfg.workdir)
    command = rank_command(python, str(run_dir.log_dir))
    return _make_sbatch_string(command=command, folder=str(run_dir.log_dir), **params)


def array_throttle(cluster: ClusterConfig, num_tasks: int) -> int:
    """The N of an array's `--array=0-K%N`: cluster.array_parallelism, or all its tasks at
    once where that is 0 (submitit's own default would hold them to 256)."""
    return cluster.array_parallelism or num_tasks


def with_dependency(extra: dict[str, Any], dependency: str) -> dict[str, Any]:
    """sbatch's extra options with `dependency` (afterany:52) added to any the user gave in
    cluster.sbatch_extra (both must hold: Slurm's `,`)."""
    own = extra.get("dependency")
    return {**extra, "dependency": f"{own},{dependency}" if own else dependency}


def rank_environment(cfg: Config) -> list[dict[str, str]]:
    """What each rank will see, as far as it is known before the job starts."""
    c = cfg.cluster
    per_node = tasks_per_node(c)
    if cfg.script is not None and cfg.script.launcher == ScriptLauncher.torchrun:
        return [
            {
                "NODE(SLURM_NODEID)": str(node),
                "TORCHRUN": f"--nnodes={c.nodes} --nproc-per-node={per_node} --node-rank={node}",
                "RDZV": "c10d at <first host of SLURM_JOB_NODELIST>:15000 + SLURM_JOB_ID % 15000",
                **{k: str(v) for k, v in c.env.items()},
            }
            for node in range(c.nodes)
        ]
    gpus = 0 if cfg.trainer.device == Device.cpu else c.gpus_per_node
    rows = []
    for rank in range(c.nodes * per_node):
        node, local = divmod(rank, per_node)
        rows.append(
            {
                "RANK(SLURM_PROCID)": str(rank),
                "LOCAL_RANK(SLURM_LOCALID)": str(local),
                "WORLD_SIZE(SLURM_NTASKS)": str(c.nodes * per_node),
                "NODE(SLURM_NODEID)": str(node),
                "MASTER_ADDR": "<first host of SLURM_JOB_NODELIST>",
                "MASTER_PORT": "15000 + SLURM_JOB_ID % 15000",
                "BACKEND": "nccl" if gpus else "gloo",
                "DEVICE": f"cuda:{local % gpus} of CUDA_VISIBLE_DEVICES" if gpus else "cpu",
                **{k: str(v) for k, v in c.env.items()},
            }
        )
        if cfg.script is not None:  # `hpcdl run`: the program picks its backend and device
            del rows[-1]["BACKEND"], rows[-1]["DEVICE"]
    return rows


def custom_targets(*configs: Config) -> list[str]:
    """The user code the configs name (model.target, data.target, data.collate_fn,
    task.target, task.predict, task.derived, trainer.step_hooks): those modules are frozen with the
    code."""
    return [target for c in configs for _, target in named_targets(c)]


def named_targets(cfg: Config) -> list[tuple[str, str]]:
    """(key, 'package.module:name') for each piece of user code the config names."""
    named = [
        ("model.target", getattr(cfg.model, "target", None)),
        ("task.target", getattr(cfg.task, "target", None)),
        ("task.predict", getattr(cfg.task, "predict", None)),
        ("task.derived", getattr(cfg.task, "derived", None)),
    ]
    if cfg.script is not None:
        named.append(("entry", cfg.script.entry))
        command = cfg.script.command
        if "-m" in command[:-1]:  # `python -m pkg.mod`: freeze its package too
            named.append(("-m", command[command.index("-m") + 1] + ":main"))
    named += [
        ("data.target", getattr(cfg.data, "target", None)),
        ("data.collate_fn", getattr(cfg.data, "collate_fn", None)),
    ]
    named += [(f"trainer.step_hooks[{i}]", t) for i, t in enumerate(cfg.trainer.step_hooks)]
    return [(key, t) for key, t in named if isinstance(t, str)]


class SubmitError(HpcdlError):
    """sbatch refused a job."""


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "unknown error"


def sbatch_refusal(stderr: str, cluster: ClusterConfig) -> str:
    """sbatch's reason for refusing a job, in one line: its last line but its `Try "sbatch
    --help"` advice; an option it does not know that came from cluster.sbatch_extra is
    named by that key."""
    lines = [
        ln.strip()
        for ln in stderr.splitlines()
        if ln.strip() and not ln.strip().startswith('Try "sbatch --help"')
    ]
    reason = lines[-1] if lines else "unknown error"
    unknown = re.search(r"unrecognized option '--([\w-]+)", reason)
    if unknown:
        option = unknown.group(1)
        for key in cluster.sbatch_extra:
            if option in (key, key.replace("_", "-")):
                return (
                    f"cluster.sbatch_extra.{key}: sbatch has no option --{option} ({reason}); "
                    f"fix its name, or drop it with ~cluster.sbatch_extra.{key}"
                )
    return f"sbatch refused the job: {reason}{_refused_key(reason, cluster)}"


# sbatch's and the controller's words for a value, and the key of the profile it came from.
_REFUSED_KEYS = (
    ("invalid account", "cluster.account"),
    ("invalid qos", "cluster.qos"),
    ("invalid partition", "cluster.partition"),
    ("invalid feature", "cluster.constraint"),
    ("invalid generic resource", "cluster.gpus_per_node / cluster.gpu_type"),
    ("time limit", "cluster.timeout_min"),
)


def _refused_key(reason: str, cluster: ClusterConfig) -> str:
    """' (cluster.account=lab1)': the key a refusal is about, where sbatch's words name one;
    else the cluster.sbatch_extra options it names (`Invalid --begin specification`, a node
    name for --nodelist), or all of them when it names none; '' without any."""
    lowered = reason.lower()
    for words, key in _REFUSED_KEYS:
        if words in lowered:
            values = []
            for name in key.split(" / "):
                value = getattr(cluster, name.removeprefix("cluster."), None)
                values.append(f"{name}={'null' if value is None else value}")
            return f" ({', '.join(values)})"
    extra = {str(k): v for k, v in cluster.sbatch_extra.items()}
    nodes = ("nodelist", "w", "exclude", "x") if "node name" in lowered else ()
    named = [
        k
        for k in extra
        if k in nodes or re.search(rf"\b{re.escape(k.replace('_', '-'))}\b", lowered)
    ]
    if named:
        return f" (from cluster.sbatch_extra: {' '.join(f'--{k}={extra[k]}' for k in named)})"
    if not extra:
        return ""
    return f" (cluster.sbatch_extra adds {' '.join(f'--{k}={v}' for k, v in extra.items())}: check those)"


def sbatch_test(script: str, cluster: ClusterConfig) -> str:
    """`sbatch --test-only` on a job's script: the controller's estimate (`to start at ...
    on nodes n1 in partition gpu`), or a ConfigError with what sbatch and the controller
    refuse beyond the preflight's checks (an option's value from cluster.sbatch_extra, a
    node list, an account or QOS where the site enforces them). Submits nothing."""
    try:
        out = subprocess.run(
            ["sbatch", "--test-only"], input=script, capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"not run ({err})"
    if out.returncode != 0:
        why = sbatch_refusal(out.stderr, cluster)
        raise ConfigError(why.replace("sbatch refused", "sbatch --test-only refused", 1))
    estimate = re.search(r"Job \d+ (to start at .*)", out.stderr)
    return (
        f"the controller would take it, {estimate.group(1)}" if estimate else last_line(out.stderr)
    )


@dataclass
class Submission:
    job_id: str
    run_dir: Path
    log_pattern: Path

    def describe(self) -> str:
        return (
            f"submitted job {self.job_id}\n"
            f"  run dir: {self.run_dir}\n"
            f"  logs:    {self.log_pattern}  (one per rank; hpcdl logs {self.run_dir} [--rank N] [-f])\n"
            f"  status:  hpcdl status {self.run_dir}"
        )


# Kept when submitting from inside a job: they say which cluster to talk to, not which job
# we are in.
KEPT_SLURM_VARIABLES = ("SLURM_CONF", "SLURM_CLUSTERS")


@contextmanager
def outside_job_env() -> Iterator[None]:
    """Drop the SLURM_*/SUBMITIT_* variables of an enclosing job while submitting, so a job
    submitted from inside a job gets its own geometry (SLURM_NTASKS etc. would leak)."""
    saved = {
        k: v
        for k, v in os.environ.items()
        if (k.startswith(("SLURM_", "SUBMITIT_")) and k not in KEPT_SLURM_VARIABLES)
        or k == CHAIN_LINK
    }
    for key in saved:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(saved)


def freeze_code(base_dir: JobDir, *configs: Config) -> None:
    """The code the jobs run, frozen now: a no-op when the dir has code already (a resumed
    run keeps what it was submitted with)."""
    snapshot_code(base_dir.code_dir, custom_targets(*configs))


def warn_edited_code(base_dir: JobDir, job: str, fix: str) -> None:
    """A resume or rerun whose own modules were edited since they were frozen: its job runs
    the frozen copy (one warning line, naming them, and where an edit does reach)."""
    from hpcdl.launch.snapshot import changed_since_frozen

    changed = changed_since_frozen(base_dir.code_dir)
    if changed:
        print(
            f"warning: {', '.join(changed)} changed since {base_dir.code_dir} was frozen; "
            f"{job} runs that frozen copy, not your edits ({fix})",
            file=sys.stderr,
            flush=True,
        )


def with_frozen_script(cfg: Config, base_dir: JobDir) -> Config:
    """`hpcdl run -- python train.py`: the script's folder frozen into the code dir, and the
    command pointing at that copy (so later edits never reach a queued or requeued job)."""
    if cfg.script is None or not cfg.script.command:
        return cfg
    command = freeze_script_files(base_dir.code_dir, cfg.script.command, cfg.workdir)
    return replace(cfg, script=replace(cfg.script, command=command))


def _remove_submission_files(run_dir: JobDir) -> None:
    """What submitit left of a job sbatch refused: the batch script and the pickled call,
    both still under the temporary names (a uuid) they get before sbatch answers."""
    for path in run_dir.log_dir.glob("*"):
        if re.fullmatch(r"\.submission_file_[0-9a-f]{32}\.sh|[0-9a-f]{32}\.pkl", path.name):
            path.unlink(missing_ok=True)


def submit(cfg: Config, run_dir: RunDir) -> Submission:
    from submitit.core.utils import FailedJobError

    from hpcdl.launch.preflight import sbatch_options_refusal
    from hpcdl.launch.slurm_job import main as job_main

    why = sbatch_options_refusal(cfg.cluster)  # also with --no-preflight: never submitted
    if why:
        raise SubmitError(why)
    # A sweep trial (resumed by hand) runs its sweep's frozen code, as its array task did.
    base = run_dir.job_base()
    freeze_code(base, cfg)
    frozen = with_frozen_script(cfg, base)
    if frozen != cfg:
        cfg = run_dir.save_config(frozen)
    executor = make_executor(cfg, base)
    try:
        # submitit prints sbatch's stderr before raising it: it goes in our one line instead
        with outside_job_env(), contextlib.redirect_stderr(io.StringIO()):
            job = executor.submit(job_main, str(run_dir.path))
    except FailedJobError as err:
        _remove_submission_files(base)
        raise SubmitError(sbatch_refusal(str(err), cfg.cluster)) from None
    run_dir.record_submission(job.job_id, cfg.cluster.name, base.log_dir)
    return Submission(
        job_id=job.job_id, run_dir=run_dir.path, log_pattern=run_dir.rank_log(job.job_id, "<rank>")
    )
