"""Launching a sweep's trials: one Slurm job array per resource shape, or a local pool.

Every trial has its own run dir under the sweep dir, created before anything starts, so a
trial is (re)run by pointing the ordinary payload at its run dir: requeues, `sweep rerun`
and plain `hpcdl resume` all continue from the trial's own newest checkpoint.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from hpcdl.config.convert import to_plain
from hpcdl.config.schema import Config, Launcher
from hpcdl.errors import HpcdlError, RunDirError, os_error_reason
from hpcdl.exit_codes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from hpcdl.launch.foreground import SWEEP_VAR
from hpcdl.rundir import RunDir, SweepDir, create_run_dir, default_run_dir, open_run_dir
from hpcdl.sweep import ledger as ledger_mod
from hpcdl.sweep.ledger import Ledger, TrialRecord
from hpcdl.sweep.plan import SweepPlan

# Used when `scontrol show config` cannot tell (Slurm's own default MaxArraySize).
DEFAULT_MAX_ARRAY_SIZE = 1001


def default_sweep_dir() -> Path:
    return default_run_dir(root="multirun")


def check_new_sweep_dir(sweep_dir: Path) -> None:
    """A hydra.sweep.dir given for a new sweep that holds anything: one-line RunDirError."""
    if sweep_dir.exists() and not sweep_dir.is_dir():
        raise RunDirError(
            f"hydra.sweep.dir={str(sweep_dir)!r} is a file, not a folder; choose a new "
            "hydra.sweep.dir"
        )
    if sweep_dir.exists() and any(sweep_dir.iterdir()):
        raise RunDirError(
            f"hydra.sweep.dir={str(sweep_dir)!r} already exists; rerun its trials with "
            f"`hpcdl sweep rerun {sweep_dir} --failed` or choose a new hydra.sweep.dir"
        )


def create_sweep(plan: SweepPlan) -> Ledger:
    sweep_dir = Path(plan.sweep_dir or default_sweep_dir()).expanduser().resolve()
    if plan.sweep_dir is not None:
        check_new_sweep_dir(sweep_dir)
    made = [p for p in (sweep_dir, *sweep_dir.parents) if not p.exists()]
    if plan.sweep_dir is None:
        parents = [p for p in sweep_dir.parents if not p.exists()]
        sweep_dir = claim_sweep_dir(sweep_dir)
        made = [sweep_dir, *parents]
    try:
        return _fill_sweep(plan, sweep_dir)
    except (OSError, HpcdlError) as err:
        # Half a sweep (trials without a ledger) would block both a retry and a rerun.
        for entry in (sweep_dir.iterdir() if sweep_dir.is_dir() else ()):
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink()
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()
        if isinstance(err, OSError):
            raise RunDirError(
                f"hydra.sweep.dir={str(sweep_dir)!r}: cannot create the sweep: "
                f"{os_error_reason(err)}; nothing was kept"
            ) from None
        raise


def claim_sweep_dir(base: Path) -> Path:
    """The default sweep dir made here, or for sweeps started in the same second (a notebook
    cell run twice) -1, -2, ..., as run dirs get: the second was refused as an existing
    hydra.sweep.dir, which nobody had set. Made, not looked for: two sweeps started at
    once (threads, processes) each get their own, and neither's cleanup removes the
    other's trials."""
    path = base
    for suffix in range(1, 1000):
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            path = base.with_name(f"{base.name}-{suffix}")
        except OSError as err:
            raise RunDirError(
                f"hydra.sweep.dir={str(path)!r}: cannot create the sweep: "
                f"{os_error_reason(err)}; nothing was kept"
            ) from None
    raise RunDirError(f"sweep dir {base}: too many sweeps started this second; set hydra.sweep.dir")


def _fill_sweep(plan: SweepPlan, sweep_dir: Path) -> Ledger:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    first = plan.trials[0].config
    ledger = Ledger(
        sweep_dir=str(sweep_dir),
        cluster=first.cluster.name,
        launcher=first.cluster.launcher.value,
        swept_keys=plan.swept_keys,
        common_overrides=plan.common,
    )
    created = []  # as written to each trial's config.yaml: with its workdir
    for trial in plan.trials:
        cfg = replace(trial.config, run_dir=str(SweepDir(sweep_dir).trial(trial.index).path))
        cfg, run_dir = create_run_dir(cfg)
        created.append(cfg)
        ledger.trials.append(TrialRecord(trial.index, trial.overrides, str(run_dir.path)))
    if first.cluster.launcher == Launcher.slurm:
        from hpcdl.launch.slurm import freeze_code, with_frozen_script

        freeze_code(SweepDir(sweep_dir), *(t.config for t in plan.trials))
        for record, cfg in zip(ledger.trials, created, strict=True):
            frozen = with_frozen_script(cfg, SweepDir(sweep_dir))
            if frozen != cfg:
                RunDir(Path(record.run_dir)).save_config(frozen)
    ledger_mod.save(ledger)
    return ledger


def max_array_size() -> int:
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.isfile(conf):  # scontrol would retry it for 60 s
        return DEFAULT_MAX_ARRAY_SIZE
    try:
        out = subprocess.run(
            ["scontrol", "show", "config"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return DEFAULT_MAX_ARRAY_SIZE
    match = re.search(r"^MaxArraySize\s*=\s*(\d+)", out.stdout, flags=re.M)
    return int(match.group(1)) if match else DEFAULT_MAX_ARRAY_SIZE


Trials = list[tuple[int, Config]]  # (trial index, its config)


def array_parts(trials: Trials, max_size: int) -> list[list[Trials]]:
    """The job arrays a sweep's trials go in, as submit_arrays submits them (and a dry run
    shows them): one group per distinct cluster config (an array's tasks share its sbatch
    header), each split into parts no larger than MaxArraySize allows, in order."""
    groups: dict[str, Trials] = {}
    for i, cfg in trials:
        groups.setdefault(json.dumps(to_plain(cfg)["cluster"], sort_keys=True), []).append((i, cfg))
    chunk = max_size - 1  # task ids run 0..N-1 and must stay below MaxArraySize
    return [[m[k : k + chunk] for k in range(0, len(m), chunk)] for m in groups.values()]


def waits_for_previous(cfg: Config, part: int) -> bool:
    """Whether a group's part after the first waits for the one before it to end
    (--dependency=afterany): with cluster.array_parallelism=N, so that at most N of the
    group's trials run at once, not N per part; without a limit the parts run side by
    side. afterany: it starts however the previous part's tasks ended (or were cancelled)."""
    return part > 0 and cfg.cluster.array_parallelism > 0


def submit_arrays(
    ledger: Ledger, indices: list[int], configs: Optional[Mapping[int, Config]] = None
) -> list[str]:
    """One job array per distinct cluster config (the sbatch header is shared by an array's
    tasks), split so no array exceeds the cluster's MaxArraySize, a split's later arrays
    each waiting for the one before it under cluster.array_parallelism (waits_for_previous).
    Returns the array job ids.

    `configs`: the trials' configs by index where the caller has them (a sweep just planned
    and created); otherwise each is read from its run dir (`sweep rerun`: the stored config,
    which may have been fixed by hand since). Only their cluster and script launcher shape
    the arrays; each task reads its own run dir's config."""
    from submitit.core.utils import FailedJobError

    from hpcdl.launch.slurm import (
        array_throttle,
        make_executor,
        outside_job_env,
        sbatch_refusal,
        with_dependency,
    )
    from hpcdl.launch.slurm_job import main as job_main

    sweep_dir = SweepDir(Path(ledger.sweep_dir))
    trials = [
        (i, configs[i] if configs is not None else open_run_dir(ledger.trial(i).run_dir)[0])
        for i in indices
    ]
    array_ids: list[str] = []
    for parts in array_parts(trials, max_array_size()):
        for number, part in enumerate(parts):
            cfg = part[0][1]
            executor = make_executor(cfg, sweep_dir)
            executor.update_parameters(array_parallelism=array_throttle(cfg.cluster, len(part)))
            if waits_for_previous(cfg, number):
                extra = executor.parameters.get("additional_parameters", {})
                executor.update_parameters(
                    additional_parameters=with_dependency(extra, f"afterany:{array_ids[-1]}")
                )
            try:
                # submitit prints sbatch's stderr before raising it: it goes in our one line
                with outside_job_env(), contextlib.redirect_stderr(io.StringIO()):
                    jobs = executor.map_array(job_main, [ledger.trial(i).run_dir for i, _ in part])
            except FailedJobError as err:
                refusal = sbatch_refusal(str(err), cfg.cluster)
                raise refused_arrays(ledger, indices, array_ids, refusal) from None
            for (i, trial_cfg), job in zip(part, jobs, strict=True):
                record = ledger.trial(i)
                record.job_id, record.state = job.job_id, "PENDING"
                record.attempts += 1
                RunDir(Path(record.run_dir)).record_submission(
                    job.job_id, trial_cfg.cluster.name, sweep_dir.log_dir
                )
            array_ids.append(jobs[0].job_id.split("_")[0])
            ledger.submissions.append(
                {"array_job_id": array_ids[-1], "trials": [i for i, _ in part], "time": time.time()}
            )
    return array_ids


def refused_arrays(
    ledger: Ledger, indices: list[int], array_ids: list[str], refusal: str
) -> HpcdlError:
    """sbatch refused an array. A sweep that never had a job is removed, as `hpcdl train`
    removes a refused run's dir (a retry makes a new one; a sweep dir left behind blocked
    it, and its NOT_STARTED trials are no `rerun --failed`'s). Arrays submitted before the
    refusal are saved in the ledger, and the trials left out are named."""
    from hpcdl.launch.slurm import SubmitError

    sweep_dir = Path(ledger.sweep_dir)
    for path in SweepDir(sweep_dir).log_dir.glob("*"):  # submitit's files for the array
        if re.fullmatch(r"\.submission_file_[0-9a-f]{32}\.sh|[0-9a-f]{32}\.pkl", path.name):
            path.unlink(missing_ok=True)
    if not array_ids and not ledger.submissions:
        shutil.rmtree(sweep_dir, ignore_errors=True)
        return SubmitError(f"{refusal}; nothing submitted (sweep dir {sweep_dir} removed)")
    if not array_ids:
        return SubmitError(f"{refusal}; nothing submitted")
    ledger_mod.save(ledger)  # the caller's lock is held; its save is skipped on an error
    now = {i for s in ledger.submissions if s["array_job_id"] in array_ids for i in s["trials"]}
    left = [i for i in indices if i not in now]
    return SubmitError(
        f"{refusal}; trials {left} not submitted (arrays {', '.join(array_ids)} were): fix "
        f"their config.yaml and start each with `hpcdl resume {sweep_dir}/<trial>`"
    )


@dataclass
class _Running:
    """A trial the local pool started: its process, and what tells its attempt apart."""

    proc: subprocess.Popen[Any]
    run_dir: RunDir
    num_starts: int  # start records in attempts.jsonl before this one
    num_stops: int = 0  # stops passed on to it


def run_local_pool(ledger: Ledger, indices: list[int]) -> int:
    """Local sweeps: trials in parallel processes, bounded by this machine's cores."""
    from hpcdl.threads import THREADS_VAR, usable_cpus

    sweep_dir = Path(ledger.sweep_dir)
    widest = max(open_run_dir(ledger.trial(i).run_dir)[0].world_size for i in indices)
    cpus = usable_cpus()
    num_workers = max(1, cpus // widest)
    # The trials running at once share the CPUs: each rank gets its part as torch's
    # threads, unless OMP_NUM_THREADS is set (hpcdl.threads).
    env = dict(os.environ)
    if not env.get(THREADS_VAR):
        at_once = min(num_workers, len(indices))
        env[THREADS_VAR] = str(max(1, cpus // (at_once * widest)))
    trials = f"{len(indices)} trial{'s' if len(indices) != 1 else ''}"
    print(f"running {trials} locally, {num_workers} at a time", flush=True)
    failed: list[int] = []
    waiting = list(indices)
    running: dict[int, _Running] = {}
    stops: list[int] = []  # signals received: each goes on to every running trial

    def stop(signum: int, _frame: Any) -> None:
        stops.append(signum)

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while waiting or running:
            while waiting and len(running) < num_workers and not stops:
                i = waiting.pop(0)
                running[i] = _start_trial(ledger, i, sweep_dir, env)
            for i, trial in list(running.items()):
                _pass_stops(trial, len(stops))
                if trial.proc.poll() is not None:
                    del running[i]
                    if not _finish_trial(sweep_dir, i, trial.proc.returncode):
                        failed.append(i)
            if stops and not running:
                break
            time.sleep(0.2)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if stops:  # the trials stopped at a step with a checkpoint, the others never started
        print(f"interrupted. Continue with: hpcdl sweep rerun {sweep_dir} --failed", flush=True)
        return EXIT_INTERRUPTED
    if failed:  # a script (or CI) running the sweep must see it
        print(f"{len(failed)} of {trials} failed: hpcdl sweep status {sweep_dir}", flush=True)
        return EXIT_FAILED
    return EXIT_OK


def _pass_stops(trial: _Running, num_stops: int) -> None:
    """One SIGTERM per stop received, once the trial listens: it has recorded its start,
    after its launcher's handlers are in (hpcdl.cli.sweep_trial). One sent as it loads would
    kill it (FAILED, exit -15) instead of stopping it at a step with a checkpoint."""
    if trial.num_stops >= num_stops or trial.proc.poll() is not None:
        return
    starts = [a for a in trial.run_dir.read_attempts() if a.get("event") == "start"]
    if len(starts) <= trial.num_starts:
        return
    for _ in range(num_stops - trial.num_stops):
        trial.proc.send_signal(signal.SIGTERM)
    trial.num_stops = num_stops


def _start_trial(ledger: Ledger, index: int, sweep_dir: Path, env: dict[str, str]) -> _Running:
    from hpcdl.launch.local import ranks_pythonpath

    record = ledger.trial(index)
    run_dir = RunDir(Path(record.run_dir))
    # A package the caller put on sys.path (the Python API), not on PYTHONPATH: the trial's
    # process finds it too, as a run's local ranks do.
    env = {**env, **ranks_pythonpath(open_run_dir(record.run_dir)[0])}
    num_starts = sum(a.get("event") == "start" for a in run_dir.read_attempts())
    log = open(run_dir.trial_log, "a")  # noqa: SIM115 (the child holds it; closed below)
    log_from = log.tell()  # this attempt's part of the log: its failure's cause
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpcdl.cli.sweep_trial", record.run_dir],
        stdout=log,
        stderr=subprocess.STDOUT,
        # Its start record and commands.log line: the sweep's attempt, not one by hand.
        env={**env, SWEEP_VAR: f"trial {index} of {sweep_dir}"},
        start_new_session=True,  # our handler forwards Ctrl-C as one SIGTERM
    )
    log.close()
    with ledger_mod.locked(sweep_dir) as led:
        trial = led.trial(index)
        trial.job_id, trial.state, trial.attempts = str(proc.pid), "RUNNING", trial.attempts + 1
        led.submissions.append(
            {"pid": trial.job_id, "trials": [index], "time": time.time(), "log_from": log_from}
        )
    print(
        f"trial {index} ({' '.join(record.overrides)}): started, log {run_dir.trial_log}",
        flush=True,
    )
    return _Running(proc, run_dir, num_starts)


def _finish_trial(sweep_dir: Path, index: int, code: int) -> bool:
    """Record a trial's end; whether it completed or was interrupted (not failed)."""
    from hpcdl.sweep.report import DEFAULT_METRIC, local_failure_cause, trial_metric

    with ledger_mod.locked(sweep_dir) as led:
        trial = led.trial(index)
        trial.exit_code = code
        trial.state = {EXIT_OK: "COMPLETED", EXIT_INTERRUPTED: "INTERRUPTED"}.get(code, "FAILED")
        trial.metric = trial_metric(RunDir(Path(trial.run_dir)), DEFAULT_METRIC)
        trial.metric_name = DEFAULT_METRIC
        print(f"trial {index}: {trial.state} (exit {code})", flush=True)
        trial_log = RunDir(Path(trial.run_dir)).trial_log
        warning = _first_warning(trial_log)
        if warning:
            print(f"trial {index}: {warning}", flush=True)
        cause = local_failure_cause(led, index) if trial.state == "FAILED" else None
        if cause:
            print(f"trial {index} failed: {cause}", flush=True)
        return trial.state != "FAILED"


def _first_warning(trial_log: Path) -> str:
    """The first `hpcdl: warning:` line of a trial's log (e.g. its metrics file missing)."""
    try:
        with open(trial_log, errors="replace") as f:
            return next((line.strip() for line in f if line.startswith("hpcdl: warning:")), "")
    except OSError:
        return ""
