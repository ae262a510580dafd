"""The sweep ledger: sweep.json in the sweep dir, the single source for status, summary and
rerun. It outlives the submitting process; writes are atomic and serialized by a lock file.
Stdlib only (login node).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from hpcdl.atomic import write_json_atomic
from hpcdl.errors import HpcdlError
from hpcdl.launch.slurm_state import ACTIVE_STATES, ENDED_UNFINISHED
from hpcdl.rundir import SweepDir

# Trial states. Slurm's own states pass through (PENDING, RUNNING, TIMEOUT, ...); these are
# the ones the ledger itself decides.
CANCELLED = "CANCELLED"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
NOT_STARTED = "NOT_STARTED"
# Slurm's for a job killed at its time limit; also the ledger's for an array task that
# stopped itself there past cluster.max_requeues (Slurm's FAILED: hpcdl.sweep.states).
TIMEOUT = "TIMEOUT"
# What `sweep rerun --failed` reruns: the trials that ended without completing, and those
# whose state nothing tells (a local sweep's trials wait as NOT_STARTED for a free core).
RERUNNABLE = (*ENDED_UNFINISHED, "UNKNOWN", NOT_STARTED)
# Every state a trial can show (`sweep status --state` takes these names).
TRIAL_STATES = (COMPLETED, *RERUNNABLE, *ACTIVE_STATES)


@dataclass
class TrialRecord:
    index: int
    overrides: list[str]
    run_dir: str
    job_id: Optional[str] = None  # ARRAYID_TASKID on Slurm, a pid locally
    state: str = NOT_STARTED
    attempts: int = 0  # submissions of this trial (reruns add one)
    requeues: int = 0  # times Slurm restarted it under the same job id (from its run dir)
    metric: Optional[float] = None
    # Which metric `metric` is: the one the last status or summary showed (--metric).
    metric_name: Optional[str] = None
    exit_code: Optional[int] = None
    # The swept overrides as the sweep planned them; `overrides` is what the trial's
    # config.yaml has now (a value edited there before `sweep rerun --failed`).
    planned: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.planned = self.planned or list(self.overrides)  # a ledger from before it


@dataclass
class Ledger:
    sweep_dir: str
    cluster: str
    launcher: str
    swept_keys: list[str]
    common_overrides: list[str]
    created: str = field(default_factory=lambda: dt.datetime.now().isoformat(timespec="seconds"))
    submissions: list[dict[str, Any]] = field(default_factory=list)
    trials: list[TrialRecord] = field(default_factory=list)
    # `--fresh-code`: each time the sweep's code was frozen anew, where the old copy went
    # and which trials had run on it (sweep status and summary name them).
    refrozen: list[dict[str, Any]] = field(default_factory=list)

    def trial(self, index: int) -> TrialRecord:
        return self.trials[index]


def record_refreeze(ledger: Ledger, aside: Path) -> None:
    """The sweep's code frozen anew, its old copy now `aside`: the trials that have trained
    on it (a checkpoint or a summary to show for it; one that failed before its first
    checkpoint has nothing the new code goes on from)."""
    from hpcdl.rundir import RunDir

    def trained(run_dir: RunDir) -> bool:
        return run_dir.newest_checkpoint() is not None or run_dir.summary_file.is_file()

    started = [t.index for t in ledger.trials if trained(RunDir(Path(t.run_dir)))]
    ledger.refrozen.append(
        {
            "time": dt.datetime.now().isoformat(timespec="seconds"),
            "aside": str(aside),
            "trials": started,
        }
    )


def save(ledger: Ledger) -> None:
    write_json_atomic(SweepDir(Path(ledger.sweep_dir)).ledger_file, asdict(ledger), indent=1)


def check_sweep_dir(sweep_dir: Path) -> None:
    """Raise a one-line error unless ``sweep_dir`` is a folder holding a ledger; reads only."""
    fix = "pass the sweep dir printed by `hpcdl train -m` or `hpcdl run -m`"
    if not sweep_dir.exists():
        raise HpcdlError(f"{sweep_dir}: no such folder; {fix}")
    if not sweep_dir.is_dir():
        raise HpcdlError(f"{sweep_dir}: a file, not a sweep dir; {fix}")
    if not SweepDir(sweep_dir).ledger_file.is_file():
        if SweepDir(sweep_dir.parent).ledger_file.is_file():  # one of its trials
            fix = (
                f"it is trial {sweep_dir.name} of the sweep {sweep_dir.parent}: pass that, or "
                f"`hpcdl status {sweep_dir}` for this trial alone"
            )
        raise HpcdlError(f"{sweep_dir}: no {SweepDir.LEDGER}, so not a sweep dir; {fix}")


def load(sweep_dir: Path) -> Ledger:
    check_sweep_dir(sweep_dir)
    path = SweepDir(sweep_dir).ledger_file
    try:
        raw = json.loads(path.read_text())
        known = {f.name for f in fields(TrialRecord)}
        trials = [
            TrialRecord(**{k: v for k, v in t.items() if k in known}) for t in raw.pop("trials")
        ]
        return Ledger(**raw, trials=trials)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise HpcdlError(f"{path}: not a sweep ledger hpcdl can read ({err})") from None


@contextmanager
def locked(sweep_dir: Path) -> Iterator[Ledger]:
    """Load, let the caller change, and save the ledger under an exclusive lock.

    Only an existing sweep dir (with its ledger) gets a lock file: a mistyped path is
    refused before anything is created."""
    check_sweep_dir(sweep_dir)
    with open(SweepDir(sweep_dir).lock_file, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ledger = load(sweep_dir)
        yield ledger
        save(ledger)
