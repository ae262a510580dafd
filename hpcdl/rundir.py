"""The run directory's one owner: its layout, and every record in it.

A run directory is decided once, at submit time, and stored in the resolved config that
the job reads; requeues and reruns reuse it. ``RunDir`` is the only code that knows the
names of the files in it; everyone else asks it (as submitit keeps a job's paths in
``JobPaths``). A sweep directory, which holds one run directory per trial, has its owner
here too (``SweepDir``).

Stdlib + config only (no torch): used on the login node.
"""

from __future__ import annotations

import csv
import datetime as dt
import errno
import io
import json
import os
import re
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Optional

from hpcdl.atomic import (
    append_line_durably,
    fsync_directory,
    remove_stale_temps,
    temp_path,
    write_atomic,
    write_json_atomic,
)
from hpcdl.config.convert import load_config, read_plain_yaml, save_config
from hpcdl.config.schema import Config
from hpcdl.errors import RunDirError, WriteError, os_error_reason

# (name, what it holds): the layout of a run directory, in the order docs/checkpoints.md
# lists it. A test checks the docs' table against this.
RUN_DIR_LAYOUT: tuple[tuple[str, str], ...] = (
    ("config.yaml", "the resolved config the job reads; rewritten by `hpcdl resume` overrides"),
    (
        "commands.log",
        "every `hpcdl train`/`run`/`resume` command line that touched the run (`sweep: trial N of SWEEP_DIR`: a local sweep started the trial)",
    ),
    (
        "metrics.csv",
        "one row per epoch: train/val loss and the task's metrics, lr, seconds, samples/s",
    ),
    (
        "checkpoints/",
        "step_<N>.pt (the newest keep_last, and milestones: keep_every_epochs) and best.pt",
    ),
    (
        "checkpoints.set-aside-<N>/",
        "`hpcdl resume --from-scratch`: the checkpoints it found there, and eval/; `--from`: those after the chosen one, with the records of their epochs and eval/ of those checkpoints (nothing deleted)",
    ),
    (
        "checkpoint.json",
        "what the newest step_<N>.pt was saved with (progress, data config, early stopping), for `hpcdl resume` on the login node",
    ),
    (
        "summary.json",
        "written once the run completes: test metrics, weights hash, peak memory, versions",
    ),
    ("learning_curves.png", "loss and each metric of the task per epoch, train and val"),
    ("confusion_matrix.png", "classification: test-set confusion matrix of the final model"),
    (
        "predicted_vs_true.png",
        "regression: test-set predictions of the final model against the truth",
    ),
    (
        "eval/<checkpoint>/",
        "`hpcdl evaluate` output: metrics.json and the test plot (eval/<checkpoint>[-<split>][-<hash>]/ for another split or other data)",
    ),
    (
        "trackers.json",
        "logger=tensorboard/wandb/mlflow: each tracker's run identity, made once, so every attempt continues it",
    ),
    ("tensorboard/", "logger=tensorboard: the event files of every attempt"),
    ("wandb/", "logger=wandb: one offline-run-<time>-<id> folder per attempt (`wandb sync`)"),
    ("mlruns/", "logger=mlflow without a tracking_uri: the MLflow file store"),
    (
        "attempts.jsonl",
        "a start and an end record per attempt (each run of a Slurm job, each cluster=local or debug run), and stall, program_end (`hpcdl run`), from_scratch and from_checkpoint (`resume --from`: the checkpoint continued from, and for a `--new-run-dir` branch the run it came from) records",
    ),
    ("slurm.json", "Slurm: the submitted job id, log folder and submission history"),
    ("code/", "Slurm: the frozen copy of hpcdl and the user's modules the job runs"),
    (
        "code.<N>/",
        "`hpcdl resume --fresh-code`: the copy the run's jobs ran before it was frozen anew",
    ),
    ("logs/", "launched runs: one log file per rank (submitit)"),
    ("trial.log", "a trial of a local sweep: its console output"),
    ("stop/", "`hpcdl run`: one file per attempt, made when a stop is requested (HPCDL_STOP_FILE)"),
    (
        "beats/",
        "`hpcdl run` with stall_timeout_s: one file per attempt and rank, touched by the "
        "program's hpcdl.api calls (HPCDL_BEAT_FILE)",
    ),
    (
        "ports/",
        "`hpcdl run` on several ranks: the port each attempt's program listens on, chosen by rank 0",
    ),
    (".run.lock", "locked by the process training the run: a second one is refused"),
    (
        "telemetry/",
        "rank<N>.jsonl: step time, GPU utilisation, memory and power at the log interval",
    ),
)


# attempts.jsonl's events besides an attempt's start and end (and a stall's): an `hpcdl
# run` program's exit (RunDir.record_program_end), `hpcdl resume --from-scratch`, and
# `hpcdl resume --from` (hpcdl.resume_from: which checkpoint, of which run, the run goes
# on from: its lineage, once the later checkpoints are set aside or another run copied).
PROGRAM_END = "program_end"
STARTED_OVER = "from_scratch"
FROM_CHECKPOINT = "from_checkpoint"

# Set by a local sweep's pool (hpcdl.sweep.launch) in the `hpcdl resume` of each trial it
# starts, to `trial N of SWEEP_DIR`: commands.log records that attempt as the sweep's, not
# as a resume typed by hand, and its start record says `"sweep": true`
# (hpcdl.launch.foreground), so that `hpcdl sweep status` tells the sweep's own attempts
# (it counts them as it starts them) from a `hpcdl resume SWEEP_DIR/N` run by hand.
SWEEP_VAR = "HPCDL_SWEEP_ATTEMPT"

# The checkpoint store's step files (hpcdl.checkpoint.step_file_name), found by name alone.
STEP_FILE = re.compile(r"^step_(\d+)\.pt$")

# A run with this many epochs in metrics.csv has saved a checkpoint (one per epoch end,
# the newest always kept): none left means they were lost, and a resume must not silently
# retrain from epoch 1. (One epoch can be a kill between its row and its first save.)
EPOCHS_NEEDING_A_CHECKPOINT = 2


def requeue_request_name(job_id: str) -> str:
    """In a job dir's logs: made by a job that could not run `scontrol requeue` itself (in
    a container); the batch script runs it after srun (hpcdl.launch.container)."""
    return f"{job_id}.requeue"


@dataclass(frozen=True)
class JobDir:
    """A folder jobs are launched from: a frozen code copy and per-rank logs.

    A run directory is one; so is a sweep directory, whose trials share its code and logs.
    """

    path: Path

    CODE: ClassVar[str] = "code"
    CODE_ASIDE: ClassVar[str] = "code.<N>"
    LOGS: ClassVar[str] = "logs"

    @property
    def code_dir(self) -> Path:
        return self.path / self.CODE

    @property
    def log_dir(self) -> Path:
        return self.path / self.LOGS

    def code_aside(self) -> Path:
        """Where `--fresh-code` moves the code copy it replaces: code.N, the first free N."""
        number = 1
        while (self.path / self.CODE_ASIDE.replace("<N>", str(number))).exists():
            number += 1
        return self.path / self.CODE_ASIDE.replace("<N>", str(number))


def _without_refused_jobs(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records without those of jobs that found the run dir held by another (reason
    `busy`: a second job of the run started by hand, sbatch on the run dir): each such end
    and the start of its job before it. They trained nothing, and their records, among the
    training job's, made that job's status count them (`attempts`, `last_end: busy`) and a
    start with no restart count reset its cluster.max_requeues."""
    refused: set[int] = set()
    for index, record in enumerate(records):
        if record.get("event") != "end" or record.get("reason") != "busy":
            continue
        refused.add(index)
        for before in range(index - 1, -1, -1):
            earlier = records[before]
            if earlier.get("event") == "start" and earlier.get("job_id") == record.get("job_id"):
                refused.add(before)
                break
    return [r for i, r in enumerate(records) if i not in refused] if refused else records


# What `hpcdl run` writes into every program's summary.json beside the program's own metrics
# (hpcdl.script_job): not a metric of the program.
RUN_BOOKKEEPING = ("outcome", "exit_code", "world_size", "wall_s", "wall_s_total")


@dataclass(frozen=True)
class RunDir(JobDir):
    CONFIG: ClassVar[str] = "config.yaml"
    COMMANDS: ClassVar[str] = "commands.log"
    METRICS: ClassVar[str] = "metrics.csv"
    CHECKPOINTS: ClassVar[str] = "checkpoints"
    SET_ASIDE: ClassVar[str] = "checkpoints.set-aside-<N>"
    CHECKPOINT_RECORD: ClassVar[str] = "checkpoint.json"
    SUMMARY: ClassVar[str] = "summary.json"
    CURVES: ClassVar[str] = "learning_curves.png"
    CONFUSION: ClassVar[str] = "confusion_matrix.png"
    SCATTER: ClassVar[str] = "predicted_vs_true.png"
    EVAL: ClassVar[str] = "eval"
    EVAL_METRICS: ClassVar[str] = "metrics.json"
    ATTEMPTS: ClassVar[str] = "attempts.jsonl"
    SUBMISSION: ClassVar[str] = "slurm.json"
    TRIAL_LOG: ClassVar[str] = "trial.log"
    STOP: ClassVar[str] = "stop"
    PORTS: ClassVar[str] = "ports"
    BEATS: ClassVar[str] = "beats"
    LOCK: ClassVar[str] = ".run.lock"
    TELEMETRY: ClassVar[str] = "telemetry"
    TRACKERS: ClassVar[str] = "trackers.json"
    TENSORBOARD: ClassVar[str] = "tensorboard"
    WANDB: ClassVar[str] = "wandb"  # W&B names it: the folder wandb.init(dir=RUN_DIR) writes
    MLRUNS: ClassVar[str] = "mlruns"

    # ------------------------------------------------------------------ paths
    @property
    def config_file(self) -> Path:
        return self.path / self.CONFIG

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / self.CHECKPOINTS

    @property
    def checkpoint_record_file(self) -> Path:
        return self.path / self.CHECKPOINT_RECORD

    @property
    def summary_file(self) -> Path:
        return self.path / self.SUMMARY

    @property
    def curves_png(self) -> Path:
        return self.path / self.CURVES

    @property
    def confusion_png(self) -> Path:
        return self.path / self.CONFUSION

    @property
    def scatter_png(self) -> Path:
        return self.path / self.SCATTER

    @property
    def trial_log(self) -> Path:
        return self.path / self.TRIAL_LOG

    def telemetry_file(self, rank: int) -> Path:
        return self.path / self.TELEMETRY / f"rank{rank}.jsonl"

    def last_telemetry(self) -> dict[int, dict[str, Any]]:
        """Each rank's last telemetry sample (hpcdl.telemetry), by rank."""
        found: dict[int, dict[str, Any]] = {}
        for path in sorted((self.path / self.TELEMETRY).glob("rank*.jsonl")):
            lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
            for line in reversed(lines):  # the last whole line (a kill may cut the last)
                try:
                    found[int(path.stem.removeprefix("rank"))] = json.loads(line)
                    break
                except (json.JSONDecodeError, ValueError):
                    continue
        return found

    @property
    def lock_file(self) -> Path:
        return self.path / self.LOCK

    @property
    def tensorboard_dir(self) -> Path:
        return self.path / self.TENSORBOARD

    @property
    def wandb_dir(self) -> Path:
        return self.path / self.WANDB

    @property
    def mlflow_store(self) -> Path:
        return self.path / self.MLRUNS

    def clear_history(self) -> None:
        """`hpcdl resume --from-scratch`: forget the epochs of a run whose checkpoints are
        gone, so the retrained run's metrics and summary are its own (and its trackers'
        runs: the next attempt starts new ones)."""
        for path in (self.path / self.METRICS, self.summary_file, self.curves_png):
            path.unlink(missing_ok=True)
        for path in (self.confusion_png, self.scatter_png, self.path / self.TRACKERS):
            path.unlink(missing_ok=True)
        self.checkpoint_record_file.unlink(missing_ok=True)
        self.append_attempt({"event": STARTED_OVER})  # program_wall_s counts from here

    def foreign_entries(self, records: tuple[Path, ...] = ()) -> list[str]:
        """The names at the top of the run dir that hpcdl does not write (RUN_DIR_LAYOUT),
        `records` aside: an `hpcdl run` program's own checkpoint folder or weights, which
        `--from-scratch` leaves where they are. Folders end in '/'."""
        known = [
            re.escape(name.split("/", 1)[0]).replace(re.escape("<N>"), r"\d+")
            for name, _ in RUN_DIR_LAYOUT
        ]
        own = re.compile("|".join(known))
        kept = {path.name for path in records}
        try:
            entries = sorted(self.path.iterdir())
        except OSError:
            return []
        return [
            entry.name + ("/" if entry.is_dir() else "")
            for entry in entries
            if not own.fullmatch(entry.name) and entry.name not in kept
        ]

    def set_aside_checkpoints(self, records: tuple[Path, ...] = ()) -> Optional[Path]:
        """`hpcdl resume --from-scratch` of a run whose checkpoints are still there (some
        damaged, or all good): the folder moves to checkpoints.set-aside-N, deleting nothing,
        so that the retrained run starts at epoch 1 instead of loading them; eval/, the
        `hpcdl evaluate` results of them, moves into it, and so do ``records`` (files of the
        run dir that describe them: an `hpcdl run` program's metrics_file). None when there
        was nothing to move."""
        checkpoints = self.checkpoint_dir.is_dir() and any(self.checkpoint_dir.iterdir())
        evaluated = (self.path / self.EVAL).is_dir()
        records = tuple(path for path in records if path.is_file())
        if not checkpoints and not evaluated and not records:
            return None
        target = self._next_set_aside()
        if checkpoints:
            self.checkpoint_dir.rename(target)
        else:  # gone, but `hpcdl evaluate` results of them are there
            target.mkdir()
        if evaluated:  # they name checkpoints/best.pt, which the retrained run replaces
            (self.path / self.EVAL).rename(target / self.EVAL)
        for path in records:
            path.rename(target / path.name)
        fsync_directory(self.path)
        return target

    def set_aside_after(
        self,
        checkpoints: list[Path],
        cut_metrics_after_epoch: Optional[int],
        records: tuple[Path, ...] = (),
    ) -> Path:
        """`hpcdl resume --from`: the checkpoints saved after the chosen one (``checkpoints``,
        in checkpoints/) move to a new checkpoints.set-aside-N, with the records of the epochs
        after it: checkpoint.json, summary.json, the plots and ``records`` (an `hpcdl run`
        program's metrics_file) moved, metrics.csv copied and then cut back to
        ``cut_metrics_after_epoch`` (None: left as it is), and the `hpcdl evaluate` results
        of those checkpoints moved to eval/ there. Nothing deleted."""
        evaluated = self._evaluations_of(checkpoints)  # before the checkpoints move
        target = self._next_set_aside()
        target.mkdir()
        if evaluated:
            (target / self.EVAL).mkdir()
            for folder in evaluated:
                folder.rename(target / self.EVAL / folder.name)
            fsync_directory(target / self.EVAL)
            fsync_directory(self.path / self.EVAL)
        metrics = self.path / self.METRICS
        if cut_metrics_after_epoch is not None and metrics.is_file():
            shutil.copy2(metrics, target / self.METRICS)
        ours = (self.checkpoint_record_file, self.summary_file, self.curves_png)
        for path in (*checkpoints, *ours, *records, self.confusion_png, self.scatter_png):
            if path.is_file():
                path.rename(target / path.name)
        fsync_directory(target)
        fsync_directory(self.checkpoint_dir)
        fsync_directory(self.path)
        if cut_metrics_after_epoch is not None:
            self.metrics.truncate_after_epoch(cut_metrics_after_epoch)
        return target

    def _evaluations_of(self, checkpoints: list[Path]) -> list[Path]:
        """The eval/<name>/ folders whose metrics.json names one of ``checkpoints``."""
        names = {str(path.resolve()) for path in checkpoints}
        evals = self.path / self.EVAL
        folders = sorted(p for p in evals.iterdir() if p.is_dir()) if evals.is_dir() else []
        found: list[Path] = []
        for folder in folders:
            try:
                report = _read_json(folder / self.EVAL_METRICS)
            except (OSError, ValueError):
                continue  # not an evaluation's (being written, or the user's): left
            checkpoint = report.get("checkpoint") if report else None
            if isinstance(checkpoint, str) and str(Path(checkpoint).resolve()) in names:
                found.append(folder)
        return found

    def _next_set_aside(self) -> Path:
        """checkpoints.set-aside-N with the first N not taken."""
        number = 1
        while (self.path / self.SET_ASIDE.replace("<N>", str(number))).exists():
            number += 1
        return self.path / self.SET_ASIDE.replace("<N>", str(number))

    def stop_file(self, job_id: Optional[str], restart_count: int) -> Path:
        """Where `hpcdl run` makes a file when this attempt is asked to stop (not created)."""
        return self.path / self.STOP / f"{job_id or 'local'}-{restart_count}"

    def beat_file(self, job_id: Optional[str], restart_count: int, rank: int) -> Path:
        """What `hpcdl run`'s program touches on each hpcdl.api call while stall_timeout_s
        watches it (not created here; hpcdl.script_stall)."""
        return self.path / self.BEATS / f"{job_id or 'local'}-{restart_count}-rank{rank}"

    @property
    def ports_dir(self) -> Path:
        """Where `hpcdl run`'s rank 0 writes the port its job's program listens on (one
        file per job attempt; hpcdl.script_port)."""
        return self.path / self.PORTS

    def eval_dir(self, checkpoint_name: str) -> Path:
        """Where `hpcdl evaluate` of one checkpoint writes (created). A folder that cannot
        be made (a read-only or full file system) is a one-line WriteError."""
        out = self.path / self.EVAL / checkpoint_name
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise WriteError(out, os_error_reason(err)) from err
        return out

    def eval_metrics_file(self, checkpoint_name: str) -> Path:
        return self.eval_dir(checkpoint_name) / self.EVAL_METRICS

    def eval_confusion_png(self, checkpoint_name: str) -> Path:
        return self.eval_dir(checkpoint_name) / self.CONFUSION

    def eval_scatter_png(self, checkpoint_name: str) -> Path:
        return self.eval_dir(checkpoint_name) / self.SCATTER

    def is_run_dir(self) -> bool:
        return self.config_file.is_file()

    # ------------------------------------------------------------------ config
    def load_config(self) -> Config:
        return load_config(self.config_file)

    def read_plain_config(self) -> Optional[dict[str, Any]]:
        """config.yaml as plain data, without the typed conversion of load_config (about
        10 ms a file: too slow for a 2000-trial sweep's status); None where it is not
        plain YAML data."""
        return read_plain_yaml(self.config_file)

    def save_config(self, cfg: Config) -> Config:
        """Store ``cfg`` with run_dir pointing here; returns the stored config."""
        cfg = replace(cfg, run_dir=str(self.path))
        save_config(cfg, self.config_file)
        return cfg

    def record_command(self, verb: str) -> None:
        """commands.log: `<time> train|run|resume: <this command line>`, or `<time> sweep:
        trial N of SWEEP_DIR` for the resume a local sweep's pool starts a trial with."""
        stamp = dt.datetime.now().isoformat(timespec="seconds")
        append_line_durably(self.path / self.COMMANDS, f"{stamp} {_command_line(verb)}")

    def record_rerun(
        self, sweep_dir: Path, overrides: Sequence[str], selection: Sequence[str] = ("--failed",)
    ) -> None:
        """commands.log: `<time> rerun: hpcdl sweep rerun SWEEP_DIR --failed KEY=VALUE ...`
        (`selection`: --trials 3,4 instead of --failed), the settings a rerun of its sweep
        wrote into this trial's config.yaml."""
        stamp = dt.datetime.now().isoformat(timespec="seconds")
        words = ["hpcdl", "sweep", "rerun", str(sweep_dir), *selection, *overrides]
        append_line_durably(self.path / self.COMMANDS, f"{stamp} rerun: {shlex.join(words)}")

    def withdraw_command(self, verb: str) -> None:
        """Take back the line that record_command(verb) appended in this process, when it is
        still the last: a resume refused once launched leaves config.yaml as it was, and
        commands.log without its line. Called under the run's lock, so no other command has
        appended since; the file is cut back to where the line began."""
        path = self.path / self.COMMANDS
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            return
        start = text.rstrip(b"\n").rfind(b"\n") + 1
        line = text[start:].decode(errors="replace")
        if not line.endswith(f" {_command_line(verb)}\n"):
            return
        try:
            with open(path, "r+b") as f:
                f.truncate(start)
                os.fsync(f.fileno())
        except OSError as err:
            raise WriteError(path, os_error_reason(err)) from err

    # ------------------------------------------------------------------ records
    @property
    def metrics(self) -> MetricsLog:
        return MetricsLog(self.path / self.METRICS)

    def read_summary(self) -> Optional[dict[str, Any]]:
        """summary.json (written once the run completed), or None."""
        return _read_json(self.summary_file)

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        write_json_atomic(self.summary_file, dict(summary))

    def newest_checkpoint(self) -> Optional[Path]:
        """The step file with the highest step, from the names alone (as the checkpoint
        store finds it; whether it loads is only known by reading it, with torch)."""
        found = self.step_files()
        return found[-1][1] if found else None

    def step_files(self) -> list[tuple[int, Path]]:
        """(step, path) of every step_<N>.pt in the checkpoints folder, oldest first."""
        if not self.checkpoint_dir.is_dir():
            return []
        folder = self.checkpoint_dir.iterdir()
        return sorted((int(m.group(1)), p) for p in folder if (m := STEP_FILE.match(p.name)))

    def write_checkpoint_record(self, checkpoint: Path, record: Mapping[str, Any]) -> None:
        """checkpoint.json: what ``checkpoint`` holds besides tensors (its progress, data
        config, early-stopping settings), so that the login node reads it without torch.
        Written by the saving rank once the save is issued: with async saves it may name a
        file still being written, which read_checkpoint_record does not trust until it is
        the newest on disk."""
        write_json_atomic(self.checkpoint_record_file, {"checkpoint": checkpoint.name, **record})

    def read_checkpoint_record(self) -> Optional[dict[str, Any]]:
        """checkpoint.json when it describes the newest step file; None when there is no
        such file, no record, or the record names another file (an older hpcdl saved the
        newest, or a save in flight or failed): the caller then does not know."""
        newest = self.newest_checkpoint()
        try:
            record = _read_json(self.checkpoint_record_file)
        except (OSError, ValueError, RunDirError):  # cut short or damaged: not known
            return None
        if newest is None or record is None or record.get("checkpoint") != newest.name:
            return None
        return record

    def requeues(self) -> int:
        """Runs started again after a stop (preemption, time limit, scontrol requeue, or the
        next job of a chain): start records with a restart count > 0. A new job that
        `hpcdl resume` submitted is not one."""
        return sum(
            1
            for e in self.read_attempts()
            if e.get("event") == "start" and (e.get("restart_count") or 0) > 0
        )

    def attempts_of_submission(self) -> list[dict[str, Any]]:
        """The attempt records since the newest submission: from the last start record with
        no restart count (a job sbatch started: `hpcdl train`, `hpcdl resume`, a sweep's
        task), so that cluster.max_requeues is counted per submission: `hpcdl resume` of a
        run that used up its requeues gets as many again. A chain's next job counts as a
        restart of the same submission."""
        events = self.read_attempts()
        fresh = [
            i
            for i, e in enumerate(events)
            if e.get("event") == "start" and not (e.get("restart_count") or 0)
        ]
        return events[fresh[-1] :] if fresh else events

    def wrote_since(self, since: float) -> bool:
        """Whether training wrote anything since `since` (time.time()): a checkpoint, a
        metrics row or the summary (a job that refused its run at once wrote none)."""
        written = [self.summary_file, self.path / self.METRICS]
        if self.checkpoint_dir.is_dir():
            written += list(self.checkpoint_dir.glob("*.pt"))
        for path in written:
            try:
                if path.stat().st_mtime >= since:
                    return True
            except OSError:
                continue
        return False

    def has_started(self) -> bool:
        """Some attempt has run: an attempt record, a checkpoint or a metrics row."""
        checkpoints = self.checkpoint_dir
        return (
            bool(self.read_attempts())
            or (checkpoints.is_dir() and any(checkpoints.iterdir()))
            or (self.path / self.METRICS).exists()
        )

    def is_complete(self) -> bool:
        return self.summary_file.exists()

    def last_attempt_completed(self) -> bool:
        """Whether the newest attempt ended completed (`hpcdl run`: its program exited 0,
        no stop asked for); False before any, or while it has no end record."""
        events = self.read_attempts()
        starts = [i for i, e in enumerate(events) if e.get("event") == "start"]
        if not starts:
            return False
        ends = [e for e in events[starts[-1] + 1 :] if e.get("event") == "end"]
        return bool(ends) and ends[0].get("reason") == "completed"

    def read_trackers(self) -> dict[str, Any]:
        """trackers.json: {tracker name: its run identity, ...}; {} before the first."""
        return _read_json(self.path / self.TRACKERS) or {}

    def write_trackers(self, record: Mapping[str, Any]) -> None:
        write_json_atomic(self.path / self.TRACKERS, dict(record))

    def newest_attempt_records(self) -> list[dict[str, Any]]:
        """The records after the newest start record (all of them before any start)."""
        events = self.read_attempts()
        starts = [i for i, e in enumerate(events) if e.get("event") == "start"]
        return events[starts[-1] + 1 :] if starts else events

    def append_attempt(self, record: Mapping[str, Any]) -> None:
        append_line_durably(self.path / self.ATTEMPTS, json.dumps(dict(record)))

    def read_attempts(self) -> list[dict[str, Any]]:
        """One start (and, unless the run was killed, one end) record per run of the job."""
        path = self.path / self.ATTEMPTS
        if not path.exists():
            return []
        records = []
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # blank, or cut short by a kill mid-write
                continue
        return _without_refused_jobs(records)

    def record_program_end(self, wall_s: float, exit_code: int) -> None:
        """`hpcdl run`, rank 0: its program's wall time in this attempt, from the wrapper's
        start to the program's exit (any exit: completed, stopped, failed)."""
        self.append_attempt({"event": PROGRAM_END, "wall_s": wall_s, "exit_code": exit_code})

    def program_wall_s(self) -> float:
        """`hpcdl run`: the wall time of the run's programs, summed over every attempt that
        recorded its program's end (record_program_end) since the run was created or last
        started over (`hpcdl resume --from-scratch`). An attempt killed before its program
        exited (SIGKILL, a node failure) recorded none and is not counted."""
        total = 0.0
        for event in self.read_attempts():
            if event.get("event") == STARTED_OVER:
                total = 0.0
            elif event.get("event") == PROGRAM_END:
                total += float(event.get("wall_s") or 0.0)
        return total

    def read_submission(self) -> Optional[dict[str, Any]]:
        """slurm.json: {"job_id", "log_dir", "history": [{"job_id", "cluster"}, ...]}."""
        return _read_json(self.path / self.SUBMISSION)

    def record_submission(self, job_id: str, cluster_name: str, log_dir: Path) -> None:
        previous = self.read_submission() or {}
        history = [*previous.get("history", []), {"job_id": job_id, "cluster": cluster_name}]
        write_json_atomic(
            self.path / self.SUBMISSION,
            {"job_id": job_id, "log_dir": str(log_dir), "history": history},
        )

    def is_sweep_trial(self) -> bool:
        """A trial of a sweep: its folder is in a sweep dir (one with a ledger)."""
        return SweepDir(self.path.parent).ledger_file.is_file()

    def job_base(self) -> JobDir:
        """Where this run's jobs take their code and write their logs: the run dir, or for
        a sweep trial (which has no code of its own) the sweep dir around it."""
        sweep = SweepDir(self.path.parent)
        if not self.code_dir.is_dir() and sweep.ledger_file.is_file():
            return sweep
        return self

    def requeue_request(self, job_id: str) -> Path:
        """Where this run's job asks its batch script for a requeue (see
        requeue_request_name), in the log folder the submission recorded."""
        record = self.read_submission() or {}
        log_dir = Path(record["log_dir"]) if "log_dir" in record else self.log_dir
        return log_dir / requeue_request_name(job_id)

    def rank_log(self, job_id: str, rank: int | str) -> Path:
        """A rank's log file as submitit names it, in the folder the submission recorded
        (a sweep trial's logs are in the sweep dir)."""
        record = self.read_submission() or {}
        log_dir = Path(record["log_dir"]) if "log_dir" in record else self.log_dir
        return log_dir / f"{job_id}_{rank}_log.out"


@dataclass(frozen=True)
class SweepDir(JobDir):
    """A `train -m` sweep: the ledger, one run dir per trial, the summary files."""

    LEDGER: ClassVar[str] = "sweep.json"
    LOCK: ClassVar[str] = ".sweep.lock"

    @property
    def ledger_file(self) -> Path:
        return self.path / self.LEDGER

    @property
    def lock_file(self) -> Path:
        return self.path / self.LOCK

    def trial(self, index: int) -> RunDir:
        return RunDir(self.path / str(index))

    def summary_file(self, suffix: str) -> Path:
        """summary.md, summary.csv."""
        return self.path / f"summary.{suffix}"

    def summary_plot(self, metric: str) -> Path:
        return self.path / f"summary_{metric}.png"


def program_records(cfg: Config, run_dir: RunDir) -> tuple[Path, ...]:
    """The files in the run dir that an `hpcdl run` program wrote about its epochs: its
    metrics_file (a relative one is the run dir's; one outside the run dir is the user's
    and stays where it is). Set aside with the checkpoints they describe."""
    name = cfg.script.metrics_file if cfg.script is not None else None
    if not name:
        return ()
    path = run_dir.path / name
    inside = path.resolve().is_relative_to(run_dir.path.resolve())
    return (path,) if inside and path.is_file() else ()


def _command_line(verb: str) -> str:
    """commands.log's line for this process's command, without its time."""
    sweep = os.environ.get(SWEEP_VAR)
    if verb == "resume" and sweep:
        return f"sweep: {sweep}"
    return f"{verb}: {shlex.join(sys.argv)}"


def _read_json(path: Path) -> Optional[dict[str, Any]]:
    """A run dir's JSON record; None without one. hpcdl writes them atomically, so a file
    that does not parse was changed by something else: named in one line, not a traceback."""
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        where = f"line {err.lineno}" if isinstance(err, json.JSONDecodeError) else "its bytes"
        raise RunDirError(
            f"{path}: not valid JSON ({where}); it was changed outside hpcdl: put back a "
            "copy or move it aside"
        ) from None
    return value if isinstance(value, dict) else None


# ----------------------------------------------------------------------------- lifecycle
def default_run_dir(now: dt.datetime | None = None, root: str = "outputs") -> Path:
    now = now or dt.datetime.now()
    return Path(root) / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S")


def with_workdir(cfg: Config) -> Config:
    """``cfg`` with its workdir as a run made from it records it: the folder this command
    runs in, unless it has one."""
    workdir = Path(cfg.workdir).expanduser() if cfg.workdir is not None else Path.cwd()
    return replace(cfg, workdir=str(workdir.resolve()))


def create_run_dir(cfg: Config) -> tuple[Config, RunDir]:
    """Make a fresh run dir and write the resolved config; refuse to reuse an existing one.

    The run dir is built under a temporary sibling name (``.<name>.tmp-<pid>``) and renamed
    into place once its config is written. A run dir with its final name therefore always
    has the config.yaml `hpcdl resume` reads, and a failure (disk full, read-only file
    system, no permission) leaves nothing behind that would block a retry.

    The folder the command runs in is recorded with it (``workdir``), once: every attempt
    runs there, and later commands read the run's relative paths from there.
    """
    cfg = with_workdir(cfg)
    if cfg.run_dir is None:
        base = path = default_run_dir().resolve()
        for suffix in range(1, 1000):  # runs started in the same second get -1, -2, ...
            if not path.exists():
                try:
                    default = replace(cfg, run_dir=str(path))
                    return _create_run_dir(default, f"run dir {path}", DEFAULT_RUN_DIR_FIX)
                except _TakenMeanwhile:
                    pass
            path = base.with_name(f"{base.name}-{suffix}")
        raise RunDirError(f"run dir {base}: too many runs started this second; set run_dir=...")
    path = check_new_run_dir(cfg.run_dir)
    key = f"run_dir={cfg.run_dir!r}"
    try:
        return _create_run_dir(replace(cfg, run_dir=str(path)), key)
    except _TakenMeanwhile:
        raise RunDirError(
            f"{key}: another command created {path} meanwhile; choose a new run_dir"
        ) from None


def check_new_run_dir(run_dir: str) -> Path:
    """The resolved path of a run_dir given for a new run; a one-line RunDirError for a
    file there, or a folder that holds anything (a run: resume it; else other files)."""
    path = Path(run_dir).expanduser().resolve()
    key = f"run_dir={run_dir!r}"
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{key}: {path} is a file, not a folder; choose a new run_dir")
    if path.is_dir() and any(path.iterdir()):
        if (path / RunDir.CONFIG).is_file():
            raise RunDirError(
                f"{key} already exists; continue it with `hpcdl resume {run_dir}` "
                "or choose a new run_dir"
            )
        raise RunDirError(
            f"{key}: {path} is a folder with other files in it, not an hpcdl run; choose a "
            "new run_dir (a folder that does not exist yet, or an empty one)"
        )
    return path


class _TakenMeanwhile(Exception):
    """The run dir's name was taken by another command after it was checked."""


# Appended where the default run dir (outputs/ under the current folder) cannot be made.
DEFAULT_RUN_DIR_FIX = "; set run_dir=... (runs go under outputs/ in the current folder by default)"


def _create_run_dir(cfg: Config, key: str, fix: str = "") -> tuple[Config, RunDir]:
    assert cfg.run_dir is not None
    path = Path(cfg.run_dir)
    if path.exists() and not (path.is_dir() and not any(path.iterdir())):
        raise _TakenMeanwhile()
    blocker = _file_among_parents(path)
    if blocker is not None:
        raise RunDirError(f"{key}: {blocker} is a file, not a folder; choose another run_dir")
    try:
        if path.is_dir():  # an empty folder made for the run: fill it, config.yaml last
            _fill_empty_run_dir(cfg, path)
        else:
            _build_and_rename(cfg, path)
    except (OSError, WriteError) as err:
        reason = err.reason if isinstance(err, WriteError) else os_error_reason(err)
        raise RunDirError(f"{key}: cannot create {path}: {reason}{fix}") from err
    return cfg, RunDir(path)


def _file_among_parents(path: Path) -> Optional[Path]:
    """The nearest existing parent of ``path`` when it is a file (run_dir=notes.txt/x)."""
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def _write_records(cfg: Config, folder: Path) -> None:
    """commands.log (`train:`, or `run:` for `hpcdl run`), then config.yaml (``cfg.run_dir``
    is the final path, not ``folder``): the config is what makes a folder a run dir, so it
    comes last."""
    staged = RunDir(folder)
    staged.record_command("train" if cfg.script is None else "run")
    save_config(cfg, staged.config_file)


def _build_and_rename(cfg: Config, path: Path) -> None:
    created = [p for p in reversed(path.parents) if not p.exists()]
    staging = temp_path(path)
    try:
        for folder in created:
            folder.mkdir(exist_ok=True)
        if staging.exists():  # left by a killed command that had our pid
            shutil.rmtree(staging)
        remove_stale_temps(path)  # left by killed commands with other pids
        staging.mkdir()
        _write_records(cfg, staging)
        # rename() refuses a non-empty target: a run dir made meanwhile is never replaced.
        try:
            os.rename(staging, path)
        except OSError as err:
            if err.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise _TakenMeanwhile() from None
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for folder in reversed(created):  # only the parents made here, only if still empty
            with suppress(OSError):
                folder.rmdir()
        raise
    fsync_directory(path.parent)


def _fill_empty_run_dir(cfg: Config, path: Path) -> None:
    try:
        _write_records(cfg, path)
    except BaseException:
        for name in (RunDir.COMMANDS, RunDir.CONFIG):  # back to the empty folder it was
            with suppress(OSError):
                (path / name).unlink(missing_ok=True)
        raise


def open_run_dir(ref: str | Path) -> tuple[Config, RunDir]:
    run_dir = RunDir(Path(ref).expanduser().resolve())
    if not run_dir.path.exists():
        raise RunDirError(f"{ref}: no such folder (from {Path.cwd()}); pass the run_dir of a run")
    owner = RunDir(run_dir.path.parent.parent)
    if (
        run_dir.path.is_file()
        and run_dir.path.parent == owner.checkpoint_dir
        and owner.is_run_dir()
    ):
        name = "best" if run_dir.path.name == "best.pt" else run_dir.path.name
        raise RunDirError(
            f"{ref}: a checkpoint of the run {owner.path}; pass the run dir, and the "
            f"checkpoint as `hpcdl resume {owner.path} --from {name}` or `--checkpoint {name}` "
            "(evaluate, predict)"
        )
    if not run_dir.is_run_dir():
        if SweepDir(run_dir.path).ledger_file.is_file():
            raise RunDirError(
                f"{ref}: a sweep dir, whose trials are run dirs: pass one of them, "
                f"{Path(ref) / 'N'} for trial N (`hpcdl sweep summary {ref}` ranks them)"
            )
        raise RunDirError(
            f"{ref}: not an hpcdl run dir (no {RunDir.CONFIG}); pass the run_dir of a run"
        )
    return run_dir.load_config(), run_dir


# ----------------------------------------------------------------------------- metrics log
class MetricsLog:
    """metrics.csv, one row per epoch; the header comes from the first row's keys."""

    def __init__(self, path: Path | str):
        self.path = Path(path)

    def append(self, row: Mapping[str, Any]) -> None:
        """Append one row and flush it (None is written as an empty cell)."""
        header = self._header()
        new_file = header is None
        fields = list(row) if header is None else header
        extra = [key for key in row if key not in fields]
        if extra:
            raise ValueError(f"{self.path}: row has keys {extra} that the header {fields} lacks")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
            if new_file:
                writer.writeheader()
            writer.writerow(dict(row))
            f.flush()

    def read(self) -> list[dict[str, Any]]:
        """Rows with numbers parsed (int, then float) and empty cells as None."""
        if not self.path.is_file():
            return []
        with open(self.path, newline="") as f:
            reader = csv.DictReader(f)
            return [{key: _parse_cell(value) for key, value in raw.items()} for raw in reader]

    def last_row(self) -> Optional[dict[str, Any]]:
        rows = self.read()
        return rows[-1] if rows else None

    def truncate_after_epoch(self, epoch: int) -> None:
        """Keep the rows with row["epoch"] <= epoch; rewrite the file atomically.

        Used on resume, so that the log matches the checkpoint. A row cut short by a kill
        (fewer cells than the header) is dropped too. Kept rows are copied verbatim.
        """
        if not self.path.is_file():
            return
        with open(self.path, newline="") as f:
            rows = list(csv.reader(f))
        if not rows:
            return
        header = rows[0]
        if "epoch" not in header:
            raise ValueError(f"{self.path}: no 'epoch' column in the header {header}")
        column = header.index("epoch")
        kept = [
            row
            for row in rows[1:]
            if len(row) == len(header)
            and isinstance(_parse_cell(row[column]), int)
            and _parse_cell(row[column]) <= epoch
        ]
        buffer = io.StringIO(newline="")
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(kept)
        write_atomic(self.path, buffer.getvalue())

    def _header(self) -> Optional[list[str]]:
        if not self.path.is_file():
            return None
        with open(self.path, newline="") as f:
            first = next(csv.reader(f), None)
        return first or None


def _parse_cell(value: Optional[str]) -> Any:
    if value is None or value == "":
        return None
    for parse in (int, float):
        try:
            return parse(value)
        except ValueError:
            pass
    return value
