"""`hpcdl sweep status | summary`: states refreshed with one squeue + one sacct call
(hpcdl.sweep.states), and a ranked table (mean +- std across k-fold folds) with a plot of
the metric per swept key."""

from __future__ import annotations

import csv
import difflib
import io
import math
import re
import shlex
import shutil
import statistics
from collections import defaultdict
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Optional

from hpcdl.atomic import write_atomic
from hpcdl.config.convert import to_plain
from hpcdl.errors import HpcdlError, plural
from hpcdl.launch.diagnose import (
    ERROR_LINE,
    FATAL_LINE,
    PROGRAM_EXIT,
    STALL_LINE,
    describe,
    program_exit,
    root_cause,
)
from hpcdl.launch.monitor import (
    FAILED_STATES,
    NO_SLURM,
    SQUEUE_FAILED,
    is_active,
    newest_launch,
    own_stop,
    own_stop_record,
    requeue_pending,
)
from hpcdl.number_ranges import number_ranges
from hpcdl.rundir import RUN_BOOKKEEPING, RunDir, SweepDir
from hpcdl.sweep import ledger as ledger_mod
from hpcdl.sweep.best_epoch import BEST, LAST, best_epoch, value_at_best
from hpcdl.sweep.direction import Direction
from hpcdl.sweep.ledger import COMPLETED, TIMEOUT, TRIAL_STATES, Ledger
from hpcdl.sweep.overrides import agrees, as_run
from hpcdl.sweep.states import (
    current_job,
    local_state,
    settled_state,
    slurm_states,
    submissions,
    task_state,
)

DEFAULT_METRIC = "val_accuracy"
FOLD_KEY = "data.fold"


def trial_metric(run_dir: RunDir, metric: str = DEFAULT_METRIC, at: str = LAST) -> Optional[float]:
    """A trial's metric: the summary's value when it has one, else the last epoch's row;
    `at` BEST (`summary --at best`): its best epoch's row (hpcdl.sweep.best_epoch)."""
    if at == BEST:
        return value_at_best(run_dir, metric)
    for record in (run_dir.read_summary(), run_dir.metrics.last_row()):
        value = (record or {}).get(metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def reported_metrics(ledger: Ledger) -> list[str]:
    """Every number some trial reports: keys of its summary.json, columns of metrics.csv."""
    names: set[str] = set()
    for t in ledger.trials:
        run_dir = RunDir(Path(t.run_dir))
        for record in (run_dir.read_summary(), run_dir.metrics.last_row()):
            names.update(k for k, v in (record or {}).items() if _is_number(v))
    return sorted(names)


# Counters a program's metrics carry (Lightning's CSV: epoch, step): no metric to rank by.
COUNTERS = ("epoch", "step", "global_step", "iteration", "iter")


def default_metric(ledger: Ledger) -> str:
    """The metric a sweep is ranked by unless --metric says: val_accuracy for
    classification, else the trials' early-stopping monitor; for `hpcdl run` sweeps, the
    first number the programs report (their metrics file)."""
    if not ledger.trials:
        return DEFAULT_METRIC
    cfg = RunDir(Path(ledger.trials[0].run_dir)).load_config()
    if cfg.script is not None:
        for t in ledger.trials:
            summary = RunDir(Path(t.run_dir)).read_summary() or {}
            for key, value in summary.items():
                if _is_number(value) and key not in (*RUN_BOOKKEEPING, *COUNTERS):
                    return key
        return "wall_s"
    if cfg.task.name == "classification":
        return DEFAULT_METRIC
    return cfg.trainer.early_stopping.monitor


def refresh(sweep_dir: Path, metric: Optional[str] = None, at: str = LAST) -> tuple[Ledger, str]:
    """refresh_states() without the scheduler's silence."""
    ledger, metric, _ = refresh_states(sweep_dir, metric, at)
    return ledger, metric


def refresh_states(
    sweep_dir: Path, metric: Optional[str] = None, at: str = LAST
) -> tuple[Ledger, str, Optional[str]]:
    """Update every trial's state, attempts, requeue count and metric in the ledger; the
    third value: why Slurm's states are missing (a slurm_state source: neither squeue nor
    sacct answered, so the trials keep their last states), else None.

    Also the metric the trials are shown with: `metric`, else default_metric(). The
    scheduler decides while a task is queued or running; once it has left the queue,
    accounting (sacct) decides, or the run dir where the cluster has no accounting
    (task_state). The run dir has the last word once a trial has left the queue: a
    newest attempt that recorded a completed end is COMPLETED whatever the scheduler says
    (settled_state). `at` BEST: each trial's metric at its best epoch (`summary --at
    best`), refused where it can have none (refuse_at_best)."""
    silent = None
    with ledger_mod.locked(sweep_dir) as ledger:
        on_slurm = ledger.launcher == "slurm"
        if on_slurm:
            for t in ledger.trials:  # a chained trial (cluster.requeue=chain) has moved on
                t.job_id = current_job(RunDir(Path(t.run_dir))) or t.job_id
            arrays = sorted({t.job_id.split("_")[0] for t in ledger.trials if t.job_id})
            view = slurm_states(arrays)
            if arrays and view.queued is None and view.accounted is None:
                silent = NO_SLURM if shutil.which("squeue") is None else SQUEUE_FAILED
            for t in ledger.trials:
                state = task_state(view, t.job_id, RunDir(Path(t.run_dir))) if t.job_id else None
                t.state = state or t.state
        else:  # the local pool records its trials' ends; a resume by hand records its own
            for t in ledger.trials:
                t.state = local_state(RunDir(Path(t.run_dir))) or t.state
        for t in ledger.trials:
            t.attempts = max(t.attempts, submissions(ledger, t.index))
            run_dir = RunDir(Path(t.run_dir))
            t.state = settled_state(t.state, run_dir, t.job_id if on_slurm else None)
            t.requeues = run_dir.requeues()
            if t.job_id and is_active(t.state) and requeue_pending(run_dir, t.job_id):
                t.requeues += 1  # requeued, not started again yet (hpcdl status)
            t.overrides = overrides_as_run(t.planned, run_dir)
        chosen, metric = metric, metric or default_metric(ledger)
        for t in ledger.trials:
            t.metric, t.metric_name = trial_metric(RunDir(Path(t.run_dir)), metric, at), metric
        if all(t.metric is None for t in ledger.trials):  # refused before the ledger is saved
            if at == BEST and metric in reported_metrics(ledger):
                refuse_at_best(ledger, metric)
            if chosen:
                refuse_unknown_metric(ledger, chosen)
    return ledger, metric, silent


def refuse_at_best(ledger: Ledger, metric: str) -> None:
    """`--at best` where no trial can have a value: an `hpcdl run` program's trials (they
    keep no best epoch), or a metric no trial's metrics.csv has a column for (measured
    once, at the end: test_accuracy, best_metric)."""
    if RunDir(Path(ledger.trials[0].run_dir)).load_config().script is not None:
        raise HpcdlError(
            "--at best: an `hpcdl run` program's trials keep no best epoch (no best.pt); "
            "rank by their last value: --at last"
        )
    columns = sorted(
        {k for t in ledger.trials for k in (RunDir(Path(t.run_dir)).metrics.last_row() or {})}
    )
    if columns and metric not in columns:
        per_epoch = ", ".join(c for c in columns if c not in COUNTERS)
        raise HpcdlError(
            f"--at best: {metric} is in no trial's metrics.csv (measured once, at the end, "
            f"not per epoch); give --at best a per-epoch metric with --metric ({per_epoch}), "
            "or rank by this one with --at last"
        )


def refuse_unknown_metric(ledger: Ledger, metric: str) -> None:
    """--metric that no trial reports, once some trial reports numbers: a typo, refused
    before anything is written (the ledger's metrics, summary.md/.csv, a plot)."""
    known = reported_metrics(ledger)
    if known:
        where = ""
        if RunDir(Path(ledger.trials[0].run_dir)).load_config().script is not None:
            where = (
                " (a program reports its own in its metrics_file, written into the run dir: "
                "$HPCDL_RUN_DIR; each trial's log says what was missing)"
            )
        close = difflib.get_close_matches(metric, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}? " if close else ""
        raise HpcdlError(
            f"--metric {metric}: no trial reports it{where}; {hint}choose one the trials "
            f"report (summary.json, metrics.csv): {', '.join(known)}"
        )


def overrides_as_run(planned: list[str], run_dir: RunDir) -> list[str]:
    """The swept overrides as the trial's config.yaml has them (as planned where it cannot
    be read: `hpcdl resume` says why). A config.yaml that has them as planned, as most
    do, is read as plain YAML: its typed conversion took 98% of a large sweep's status."""
    plain = run_dir.read_plain_config()
    if plain is not None and agrees(planned, plain):
        return planned
    try:
        config = to_plain(run_dir.load_config())
    except HpcdlError:
        return planned
    return as_run(planned, config)


def edit_notes(ledger: Ledger) -> str:
    """A line per trial whose config.yaml no longer has a value the sweep planned, and one
    per trial resumed by hand with other settings (commands.log), which its row does not
    show: trainer.max_epochs=50 for one trial makes it no longer comparable."""
    return "".join(f"{line}\n" for lines in trial_notes(ledger).values() for line in lines)


def trial_notes(ledger: Ledger) -> dict[int, list[str]]:
    """edit_notes' lines by trial index (Sweep.summary() puts them in each row)."""
    notes: dict[int, list[str]] = {}
    for t in ledger.trials:
        lines = notes.setdefault(t.index, [])
        pairs = zip(t.overrides, t.planned, strict=True)
        edited = [(now, then) for now, then in pairs if now != then]
        if edited:
            now = " ".join(n for n, _ in edited)
            then = " ".join(p for _, p in edited)
            lines.append(f"trial {t.index}: its config.yaml has {now} (the sweep planned {then})")
        swept = {o.partition("=")[0] for o in t.planned}
        for words in hand_resumes(RunDir(Path(t.run_dir))):
            other = [
                w
                for w in words
                if w.partition("=")[0].lstrip("+~") not in swept and w != "--fresh-code"
            ]
            if other:
                lines.append(f"trial {t.index}: resumed by hand with {' '.join(other)}")
        for words in reruns_with(RunDir(Path(t.run_dir))):
            lines.append(f"trial {t.index}: rerun with {' '.join(words)}")
    for record in ledger.refrozen:  # --fresh-code: the trials that ran on the old copy
        for index in record.get("trials", []):
            notes.setdefault(index, []).append(
                f"trial {index}: trained (all or part) by the code now in "
                f"{record.get('aside')}, before --fresh-code froze it anew ({record.get('time')})"
            )
    return notes


def hand_resumes(run_dir: RunDir) -> list[list[str]]:
    """The overrides and options of each `hpcdl resume` of the run typed by hand (its
    commands.log's `resume:` lines; a sweep's own attempts are `sweep:` lines), without a
    program's command after `--`."""
    found = []
    for words in _logged(run_dir, "resume"):
        if "resume" in words:
            rest = words[words.index("resume") + 2 :]  # after the run dir
            found.append(rest[: rest.index("--")] if "--" in rest else rest)
    return found


def reruns_with(run_dir: RunDir) -> list[list[str]]:
    """The settings each `hpcdl sweep rerun --failed KEY=VALUE ...` (or `--trials 3,4
    KEY=VALUE ...`) wrote into the trial's config.yaml (its commands.log's `rerun:` lines),
    `--from-scratch` among them."""
    found = []
    for words in _logged(run_dir, "rerun"):
        if "--failed" in words:
            found.append(words[words.index("--failed") + 1 :])
        elif "--trials" in words:
            found.append(words[words.index("--trials") + 2 :])
    return [words for words in found if words]


def _logged(run_dir: RunDir, verb: str) -> list[list[str]]:
    """The words of each of commands.log's `<time> <verb>: <command>` lines."""
    try:
        lines = (run_dir.path / run_dir.COMMANDS).read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        _, sep, command = line.partition(f" {verb}: ")
        if not sep:
            continue
        try:
            found.append(shlex.split(command))
        except ValueError:  # a line changed by hand
            continue
    return found


def no_metric_hint(ledger: Ledger, metric: str) -> Optional[str]:
    """One line on why no trial has a value of `metric`, once some trial has completed."""
    done = [t for t in ledger.trials if t.state == COMPLETED]
    if not done or any(t.metric is not None for t in ledger.trials):
        return None
    run_dir = RunDir(Path(done[0].run_dir))
    summary = run_dir.summary_file
    if run_dir.load_config().script is not None:
        fix = (
            "the program reports it in its metrics_file, which it writes into the run dir "
            "($HPCDL_RUN_DIR); each trial's log says what was missing"
        )
    else:
        fix = "choose a key of summary.json with --metric"
    return f"hpcdl: warning: no trial reported {metric} (e.g. {summary}): {fix}"


def status_table(ledger: Ledger, metric: str, states: Collection[str] = ()) -> str:
    """The trials' table, the count of each state, then the notes on its trials; with
    `states` (chosen_states(): `--state failed`), only the trials in one of them."""
    # A local sweep's trials are processes of this machine: their ids are pids.
    ident = "job id" if ledger.launcher == "slurm" else "pid"
    rows = [["trial", "overrides", ident, "state", "attempts", "requeues", metric]]
    shown = [t for t in ledger.trials if not states or t.state in states]
    for t in shown:
        value = f"{t.metric:.4f}" if t.metric is not None else "-"
        cells = [str(t.index), " ".join(t.overrides), t.job_id or "-", t.state]
        rows.append([*cells, str(t.attempts), str(t.requeues), value])
    counts: dict[str, int] = defaultdict(int)
    for t in ledger.trials:
        counts[t.state] += 1
    footer = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    footer = f"\n{plural(len(ledger.trials), 'trial')}: {footer}\n"
    if states:
        footer += f"shown: {len(shown)} in state {', '.join(sorted(states))}\n"
    indices = {t.index for t in shown}
    notes = "".join(
        line + "\n" for i, lines in trial_notes(ledger).items() if i in indices for line in lines
    )
    causes = "".join(
        f"trial {i} {'timed out' if ledger.trial(i).state == TIMEOUT else 'failed'}: {cause}\n"
        for i, cause in failure_causes(ledger)
        if i in indices
    )
    if any(t.state == TIMEOUT for t in shown):
        causes += (
            "timed-out trials go on from their newest checkpoint with a longer limit: hpcdl "
            f"sweep rerun {ledger.sweep_dir} --failed cluster.timeout_min=MINUTES\n"
        )
    return _markdown(rows) + footer + notes + causes


# What `sweep status --state` takes besides the states' own names.
STATE_ALIASES = {"TIMED_OUT": TIMEOUT}


def chosen_states(given: Sequence[str]) -> set[str]:
    """`--state failed --state timed-out,cancelled` as the states' names; an unknown one is
    refused in one line naming those there are."""
    chosen = set()
    for word in (w.strip() for text in given for w in text.split(",")):
        name = word.upper().replace("-", "_")
        name = STATE_ALIASES.get(name, name)
        if name not in TRIAL_STATES:
            known = ", ".join(s.lower() for s in TRIAL_STATES).replace(
                "timeout", "timeout (timed-out)"
            )
            raise HpcdlError(
                f"--state {word}: no trial state of that name; give one of {known} "
                "(case-insensitive; a comma list, or --state again)"
            )
        chosen.add(name)
    return chosen


def failure_causes(ledger: Ledger) -> list[tuple[int, str]]:
    """(trial, the rank that made it fail and why) for each failed trial whose logs tell,
    and (trial, the stop it recorded) for each that stopped at its time limit."""
    found = []
    for t in ledger.trials:
        if t.state not in (*FAILED_STATES, TIMEOUT) or not t.job_id:
            continue
        if t.state == TIMEOUT:
            end = own_stop_record(RunDir(Path(t.run_dir)), t.job_id)
            cause = str(end.get("action")) if end and end.get("action") else None
        elif ledger.launcher == "slurm":
            cause = slurm_failure_cause(RunDir(Path(t.run_dir)), t.job_id)
        else:
            cause = local_failure_cause(ledger, t.index)
        if cause:
            found.append((t.index, cause))
    return found


def slurm_failure_cause(run_dir: RunDir, job_id: str) -> Optional[str]:
    """Why an array task failed: the stop it recorded (a time limit past
    cluster.max_requeues: exit 3, FAILED to Slurm; no error), else its ranks' logs."""
    stop = own_stop(run_dir, job_id)
    if stop is not None:
        return f"stopped: {stop}"
    return describe(root_cause(run_dir.rank_log(job_id, 0).parent, job_id))


def local_failure_cause(ledger: Ledger, index: int) -> Optional[str]:
    """Why a local sweep's trial failed in its newest attempt: hpcdl's own `error:` line in
    its log (bad input found in the job; cluster=local naming the rank), else the rank that
    made its cluster=local job fail (root_cause), else the last exception in its log (a
    traceback of cluster=debug, an `hpcdl run` program's), else hpcdl's last word on it
    (`the program exited with status 1`). Only the pool's attempts log to trial.log: after
    a resume by hand, only that job's rank logs can tell."""
    run_dir = RunDir(Path(ledger.trial(index).run_dir))
    starts = [a for a in run_dir.read_attempts() if a.get("event") == "start"]
    text = ""
    if not starts or starts[-1].get("sweep"):
        text = _attempt_log(run_dir.trial_log, _log_from(ledger, index))
    said = [line[len("error: ") :] for line in text.splitlines() if line.startswith("error: ")]
    if said:
        return said[-1]
    launch = newest_launch(run_dir)
    if launch.launcher != "slurm" and launch.job_id is not None:
        cause = describe(root_cause(run_dir.log_dir, launch.job_id))
        if cause:
            return cause
    return last_exception(text)


def _log_from(ledger: Ledger, index: int) -> int:
    """Where the pool's newest attempt of a trial begins in its trial.log (0: a ledger from
    before the pool recorded it, or none yet)."""
    starts = [s for s in ledger.submissions if "pid" in s and index in s["trials"]]
    return int(starts[-1].get("log_from", 0)) if starts else 0


def _attempt_log(trial_log: Path, offset: int) -> str:
    try:
        with open(trial_log, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def last_exception(text: str) -> Optional[str]:
    """A log's last word on a failure without an `error:` line: a stall the watchdog
    reported, else the last exception (a traceback's last line), else a fatal line (a
    crash in C code), else hpcdl's last line that is no warning."""
    stalled = STALL_LINE.findall(text)
    if stalled:
        return f"stalled: {stalled[-1]} (its stacks are in its log)"
    for pattern in (ERROR_LINE, FATAL_LINE):
        found = pattern.findall(text)
        if found:
            return str(found[-1]).strip()
    own = re.sub(r"^(?:starting|resuming) run dir: .*\n", "", text, flags=re.M)  # the pool's
    exits = list(PROGRAM_EXIT.finditer(own))
    if exits:  # an `hpcdl run` program's status, with its last line (argparse's error)
        return program_exit(own, exits[-1])
    said = [
        line[len("hpcdl: ") :]
        for line in text.splitlines()
        if line.startswith("hpcdl: ") and not line.startswith("hpcdl: warning:")
    ]
    return said[-1] if said else None


def _markdown(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def averaged_keys(ledger: Ledger, over: Sequence[str] = ()) -> list[str]:
    """The swept keys a summary averages over: data.fold, and each `--over KEY` (`seed`
    matches a script's `--seed=1` too), checked against the trials' overrides."""
    swept = sorted({o.partition("=")[0] for t in ledger.trials for o in t.overrides if "=" in o})
    keys = [FOLD_KEY]
    for name in over:
        found = [k for k in swept if k.lstrip("-") == name.lstrip("-")]
        if not found:
            raise HpcdlError(
                f"--over {name}: not a swept key of this sweep; its swept keys are "
                f"{', '.join(swept) or 'none'}"
            )
        keys += [k for k in found if k not in keys]
    return keys


def summarize(
    ledger: Ledger, metric: str, direction: Direction, over: Sequence[str] = (), at: str = LAST
) -> list[dict[str, Any]]:
    """One entry per configuration, best first: the trials that differ only in data.fold
    (a k-fold sweep) or in a key of `over` (`--over trainer.seed`) grouped, with the mean
    and standard deviation of their values."""
    averaged = averaged_keys(ledger, over)
    reported: dict[int, float] = {}
    members: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for t in ledger.trials:
        key = tuple(o for o in t.overrides if o.partition("=")[0] not in averaged)
        members[key].append(t.index)
        value = trial_metric(RunDir(Path(t.run_dir)), metric, at)
        if value is not None:
            reported[t.index] = value
    used = {o.partition("=")[0] for t in ledger.trials for o in t.overrides}
    swept = [k for k in averaged if k in used] or [FOLD_KEY]
    entries = []
    for key, trial_ids in members.items():
        values = [reported[i] for i in counted_trials(ledger, trial_ids, reported)]
        entries.append(
            {
                "overrides": " ".join(key) or f"(no swept key besides {', '.join(swept)})",
                "trials": trial_ids,
                "n": len(values),
                "mean": statistics.fmean(values) if values else math.nan,
                # none for one value (or none): 0.0 would claim that the folds agree
                "std": statistics.stdev(values) if len(values) > 1 else math.nan,
                "state": group_state(ledger, trial_ids),
            }
        )
    sign = 1.0 if direction.lower_is_better else -1.0

    def rank_key(entry: dict[str, Any]) -> tuple[bool, float]:
        mean = float(entry["mean"])
        return (math.isnan(mean), 0.0 if math.isnan(mean) else sign * mean)

    return sorted(entries, key=rank_key)


def counted_trials(ledger: Ledger, trial_ids: list[int], reported: Collection[int]) -> list[int]:
    """The trials of a configuration whose values its mean is over: those that completed;
    where none has, those that have reported a value so far (running, failed), as a
    configuration of one trial is ranked. A fold that diverged and failed had its last
    value in the mean of the folds that completed."""
    values = [i for i in trial_ids if i in reported]
    return [i for i in values if _completed(ledger, i)] or values


def _completed(ledger: Ledger, index: int) -> bool:
    """COMPLETED, or a run that wrote its summary.json, whatever the scheduler says in the
    moment after (the job exiting, sacct lagging, the end record not yet written): its
    value is final. A failed trial writes none. (A trial resumed by hand for more epochs
    keeps its earlier summary.json: its latest value counts while it runs.)"""
    trial = ledger.trial(index)
    return trial.state == COMPLETED or RunDir(Path(trial.run_dir)).summary_file.is_file()


def group_state(ledger: Ledger, trial_ids: list[int]) -> str:
    """A configuration's state: its trials' one state (COMPLETED), else how many are in
    each ('3 COMPLETED, 2 FAILED')."""
    counts: dict[str, int] = defaultdict(int)
    for i in trial_ids:
        counts[ledger.trial(i).state] += 1
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def summary_table(entries: list[dict[str, Any]], metric: str, folds: bool) -> str:
    """The ranked table; `metric`: its value column's name (`val_accuracy (best epoch)`)."""
    head = ["rank", "overrides", f"{metric} mean", "std" if folds else "", "n", "trials", "state"]
    rows = [[h for h in head if h]]
    for rank, e in enumerate(entries, 1):
        # No value, or one fold's: no mean, or no spread to show (a std of 0 would claim
        # that the folds agree).
        cells = [str(rank), e["overrides"], f"{e['mean']:.4f}" if e["n"] else "-"]
        if folds:
            cells.append(f"{e['std']:.4f}" if e["n"] > 1 else "-")
        cells += [str(e["n"]), number_ranges(e["trials"]), e["state"]]  # SWEEP_DIR/<trial>
        rows.append(cells)
    return _markdown(rows)


def missing_notes(entries: list[dict[str, Any]], ledger: Ledger, metric: str) -> str:
    """A line per configuration some of whose folds are not in its mean (a failed or
    unfinished trial, with no value of `metric` or beside folds that completed): its mean
    is over the others only."""
    reported = {t.index for t in ledger.trials if t.metric is not None}
    lines = []
    for e in entries:
        counted = counted_trials(ledger, e["trials"], reported)
        left = [i for i in e["trials"] if i not in counted]
        if not (e["n"] and left):
            continue
        silent = [i for i in left if i not in reported]
        partial = [i for i in left if i in reported]
        why = []
        if silent:
            ids = ", ".join(map(str, silent))
            why.append(f"trial {ids} reports" if len(silent) == 1 else f"trials {ids} report")
            why[-1] += f" no {metric}"
        if partial:
            ids = ", ".join(map(str, partial))
            one = len(partial) == 1
            why.append(f"trial {ids} has" if one else f"trials {ids} have")
            why[-1] += " not completed"
        lines.append(
            f"{e['overrides']}: {' and '.join(why)} ({_states(ledger, left)}); its mean "
            f"is over the other {e['n']} of {len(e['trials'])} only\n"
        )
    return "".join(lines)


def unfinished_note(entries: list[dict[str, Any]], ledger: Ledger, metric: str) -> str:
    """A line naming the trials ranked by a value they reported before completing (running,
    failed, stopped): the last epoch's so far, not a final one."""
    reported = {t.index for t in ledger.trials if t.metric is not None}
    counted = [i for e in entries for i in counted_trials(ledger, e["trials"], reported)]
    partial = sorted(i for i in counted if ledger.trial(i).state != COMPLETED)
    if not partial:
        return ""
    ids = ", ".join(map(str, partial))
    one = len(partial) == 1
    which = f"trial {ids} has" if one else f"trials {ids} have"
    whose = f"its {metric} is the last value it" if one else f"their {metric} is the last they"
    return f"{which} not completed ({_states(ledger, partial)}): {whose} reported so far\n"


def _states(ledger: Ledger, indices: list[int]) -> str:
    return ", ".join(sorted({ledger.trial(i).state for i in indices}))


def write_summary(
    ledger: Ledger, metric: str, direction: Direction, over: Sequence[str] = (), at: str = LAST
) -> tuple[str, str, list[Path]]:
    """summary.md (the direction's line, the table, then the notes on its rows),
    summary.csv and the plot; returns summary.md's text, its notes and the files. `over`:
    keys averaged over besides data.fold; `at` BEST: each trial's value at its best epoch,
    which the first line, the table's and the CSV's column names say."""
    sweep_dir = SweepDir(Path(ledger.sweep_dir))
    entries = summarize(ledger, metric, direction, over, at)
    folds = bool(over) or any(k == FOLD_KEY for k in ledger.swept_keys)
    column, ranked = metric, metric
    if at == BEST:
        column, ranked = f"{metric} (best epoch)", at_best_label(ledger, metric)
    text = direction.header(ranked) + "\n\n" + summary_table(entries, column, folds)
    notes = missing_notes(entries, ledger, metric) + unfinished_note(entries, ledger, metric)
    text += "\n" + notes.rstrip("\n") if notes else ""
    markdown, table_csv = sweep_dir.summary_file("md"), sweep_dir.summary_file("csv")
    write_atomic(markdown, text + "\n")
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    name = f"{metric}_at_best" if at == BEST else metric
    head = ["rank", "overrides", f"{name}_mean", f"{name}_std", "n", "trials", "state"]
    writer.writerow(head)
    for rank, e in enumerate(entries, 1):
        mean, std = ("" if math.isnan(v) else v for v in (e["mean"], e["std"]))  # no value
        trials = " ".join(map(str, e["trials"]))
        writer.writerow([rank, e["overrides"], mean, std, e["n"], trials, e["state"]])
    write_atomic(table_csv, buffer.getvalue())
    plots = plot_metric_per_key(ledger, metric, direction, sweep_dir.summary_plot(metric), at)
    return text, notes, [markdown, table_csv, *plots]


def at_best_label(ledger: Ledger, metric: str) -> str:
    """'val_accuracy at each trial's best epoch (its best.pt's, by val_loss)': what `--at
    best` ranks by, naming the monitors that chose the epochs."""
    found = (best_epoch(RunDir(Path(t.run_dir))) for t in ledger.trials)
    monitors = sorted({b.monitor for b in found if b is not None and b.monitor})
    by = f", by {' or '.join(monitors)}" if monitors else ""
    return f"{metric} at each trial's best epoch (its best.pt's{by})"


# The plot labels at most this many values of a key: 2000 seeds' labels took matplotlib
# 9 s to draw (half of a 2000-trial summary), one on top of the other.
MAX_TICK_LABELS = 30


def plot_metric_per_key(
    ledger: Ledger, metric: str, direction: Direction, out_png: Path, at: str = LAST
) -> list[Path]:
    from matplotlib.figure import Figure

    from hpcdl.plots import save_png

    keys = ledger.swept_keys
    fig = Figure(figsize=(4.5 * len(keys), 3.5), layout="tight")
    for k, key in enumerate(keys):
        ax = fig.add_subplot(1, len(keys), k + 1)
        xs, ys = [], []
        for t in ledger.trials:
            value = trial_metric(RunDir(Path(t.run_dir)), metric, at)
            setting = next(
                (o.split("=", 1)[1] for o in t.overrides if o.split("=", 1)[0] == key), None
            )
            if value is not None and setting is not None:
                xs.append(setting)
                ys.append(value)
        labels = sorted(set(xs), key=_natural)
        position = {label: i for i, label in enumerate(labels)}
        ax.scatter([position[x] for x in xs], ys, alpha=0.7)
        shown = range(0, len(labels), math.ceil(len(labels) / MAX_TICK_LABELS) or 1)
        ax.set_xticks(list(shown), [labels[i] for i in shown], rotation=30)
        ax.set_xlabel(key)
        where = ", best epoch" if at == BEST else ""
        better = "lower" if direction.lower_is_better else "higher"
        ax.set_ylabel(f"{metric} ({better} is better{where})")
        ax.grid(alpha=0.3)
    save_png(fig, out_png, dpi=100)
    return [out_png]


def _natural(text: str) -> tuple[int, float, str]:
    try:
        return (0, float(text), "")
    except ValueError:
        return (1, 0.0, text)
