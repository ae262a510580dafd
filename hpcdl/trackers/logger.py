"""TrackerLogger: rank 0's Logger when trackers are chosen; it hands every event to each.

Each tracker's run identity (a W&B id, an MLflow run id, the TensorBoard log dir) is made
on the run's first attempt and stored in the run dir's trackers.json, so every requeue,
`hpcdl resume` and sweep rerun continues the same tracker run. trackers.json also holds
the last step the trackers were given (written when an attempt closes) and a hash of the
config last sent, so a resumed attempt neither logs a step twice nor resends the config.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from hpcdl.config.convert import to_plain, to_yaml
from hpcdl.config.schema import Config
from hpcdl.errors import HpcdlError, WriteError
from hpcdl.rundir import RunDir, SweepDir
from hpcdl.trackers.base import ConfigRecord, Tracker, TrackerStart

LAST_STEP = "last_step"
CONFIG_HASH = "config_sha256"


class TrackerError(HpcdlError):
    """A chosen tracker could not start."""


class TrackerLogger:
    def __init__(
        self, trackers: Sequence[Tracker], log_every_steps: int, provenance: Mapping[str, Any]
    ) -> None:
        self._trackers = list(trackers)
        self._log_every_steps = log_every_steps
        self._provenance = dict(provenance)
        self._run_dir: RunDir | None = None
        self._skip_through = 0  # steps an earlier attempt already sent (see Tracker)
        self._last_step = 0
        self._open = False

    # ------------------------------------------------------------------ start
    def start(self, cfg: Config, run_dir: RunDir, resumed_step: int) -> None:
        self._run_dir = run_dir
        record = run_dir.read_trackers()
        self._skip_through = int(record.get(LAST_STEP, 0))
        self._last_step = max(resumed_step, self._skip_through)
        text = to_yaml(cfg)
        digest = hashlib.sha256(text.encode()).hexdigest()
        changed = record.get(CONFIG_HASH) != digest
        config = ConfigRecord(to_plain(cfg), text) if changed else None
        name, group = run_name(run_dir)
        for tracker in self._trackers:
            start = TrackerStart(run_dir, record.get(tracker.name), resumed_step, name, group)
            try:
                record[tracker.name] = tracker.open(start)
                run_dir.write_trackers(record)  # at once: a later failure must not lose it
                tracker.describe(config, self._provenance_of(run_dir))
            except Exception as err:
                raise TrackerError(f"logger.{tracker.name}: cannot start: {err}") from err
        record[CONFIG_HASH] = digest
        run_dir.write_trackers(record)
        self._open = True

    def _provenance_of(self, run_dir: RunDir) -> dict[str, Any]:
        """This attempt: the job's start record in attempts.jsonl (Slurm: job id, nodes,
        GPU, git revision, versions) over what the rank knows itself."""
        provenance = {"run_dir": str(run_dir.path)}
        provenance.update({k: v for k, v in self._provenance.items() if v is not None})
        job_id = provenance.get("job_id")
        starts = [a for a in run_dir.read_attempts() if a.get("event") == "start"]
        if job_id and starts and str(starts[-1].get("job_id")) == str(job_id):
            provenance.update({k: v for k, v in starts[-1].items() if v is not None})
            provenance.pop("event", None)
        return provenance

    # ------------------------------------------------------------------ events
    def log_step(self, step: int, values: Mapping[str, float]) -> None:
        if step % self._log_every_steps:
            return
        self._send(step, {f"step/{key}": float(value) for key, value in values.items()})

    def log_epoch(self, step: int, row: Mapping[str, Any]) -> None:
        values = {
            f"epoch/{key}": float(v) for key, v in row.items() if key != "step" and _number(v)
        }
        self._send(step, values)

    def _send(self, step: int, values: dict[str, float]) -> None:
        """To each tracker, flushed at once (every log_every_steps steps, and at epoch
        ends): a step that was logged is on disk even if the job is killed next, and a
        resumed attempt, which continues after its checkpoint, never leaves a hole."""
        self._last_step = max(self._last_step, step)
        for tracker in list(self._trackers):
            if step <= self._skip_through and not tracker.rewrites_on_resume:
                continue
            self._guarded(tracker, lambda t=tracker: _write(t, step, values))

    def _guarded(self, tracker: Tracker, call: Any) -> None:
        """A tracker that fails mid-run (a server gone, a full disk) is dropped with one
        line; the training, its checkpoints and metrics.csv go on."""
        try:
            call()
        except Exception as err:
            self._trackers.remove(tracker)
            print(f"logger.{tracker.name}: {err}; training goes on without it", flush=True)

    # ------------------------------------------------------------------ endings
    def finish(self, summary: Mapping[str, Any]) -> None:
        if not self._open:
            return
        step = int(summary.get("steps") or self._last_step)
        values = {key: float(v) for key, v in summary.items() if _number(v)}
        for tracker in list(self._trackers):
            self._guarded(tracker, lambda t=tracker: t.finish(step, values))
        self._end()
        for tracker in self._trackers:
            hint = tracker.hint()
            if hint:
                print(hint, flush=True)

    def close(self, *, failed: bool = False) -> None:
        if not self._open:
            return
        for tracker in list(self._trackers):
            self._guarded(tracker, lambda t=tracker: t.close(failed=failed))
        self._end()

    def _end(self) -> None:
        self._open = False
        assert self._run_dir is not None
        record = self._run_dir.read_trackers()
        record[LAST_STEP] = self._last_step
        try:
            self._run_dir.write_trackers(record)
        except (OSError, WriteError) as err:  # on the way out of an error, say, a full disk
            print(f"logger: {err}; a resume may send the last steps again", flush=True)


def run_name(run_dir: RunDir) -> tuple[str, str | None]:
    """(name, group): the run dir's name, or for a sweep trial "<sweep>/<trial>" and the
    sweep's name as the group."""
    sweep = SweepDir(run_dir.path.parent)
    if sweep.ledger_file.is_file():
        return f"{sweep.path.name}/{run_dir.path.name}", sweep.path.name
    return run_dir.path.name, None


def _write(tracker: Tracker, step: int, values: Mapping[str, float]) -> None:
    tracker.log(step, values)
    tracker.flush()


def _number(value: Any) -> bool:
    """An int or float, not a bool (metrics.csv's empty cells are None)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
