"""What the trainer logs to (Logger) and what one experiment tracker is (Tracker).

The trainer holds one Logger: a NullLogger for logger=csv and on every rank but 0, else a
TrackerLogger (hpcdl.trackers.logger) that hands each event to the chosen trackers.
metrics.csv is written by the trainer itself either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Optional, Protocol

from hpcdl.config.schema import Config
from hpcdl.rundir import RunDir


class Logger(Protocol):
    def start(self, cfg: Config, run_dir: RunDir, resumed_step: int) -> None:
        """Create the tracker runs, or continue the ones in the run dir's trackers.json;
        `resumed_step` is the global step of the checkpoint the run continues from."""

    def log_step(self, step: int, values: Mapping[str, float]) -> None:
        """One optimizer step's values (loss, lr); kept every trainer.log_every_steps."""

    def log_epoch(self, step: int, row: Mapping[str, Any]) -> None:
        """The epoch's metrics.csv row, at the global step that ended it."""

    def finish(self, summary: Mapping[str, Any]) -> None:
        """The run completed: its summary (test metrics), then close."""

    def close(self, *, failed: bool = False) -> None:
        """The run stopped before completing (a stop signal, or an error): flush, close,
        leave the tracker runs to be continued."""


class NullLogger:
    """logger=csv, and every rank but 0: metrics.csv is all there is."""

    def start(self, cfg: Config, run_dir: RunDir, resumed_step: int) -> None:
        pass

    def log_step(self, step: int, values: Mapping[str, float]) -> None:
        pass

    def log_epoch(self, step: int, row: Mapping[str, Any]) -> None:
        pass

    def finish(self, summary: Mapping[str, Any]) -> None:
        pass

    def close(self, *, failed: bool = False) -> None:
        pass


@dataclass(frozen=True)
class TrackerStart:
    """What a tracker needs to create or continue its run in one attempt."""

    run_dir: RunDir
    # The identity this tracker stored in trackers.json on an earlier attempt; None: new.
    identity: Optional[dict[str, Any]]
    resumed_step: int
    run_name: str  # the run dir's name; a sweep trial's is "<sweep>/<trial>"
    group: Optional[str]  # a sweep trial's sweep dir name


@dataclass(frozen=True)
class ConfigRecord:
    """The resolved config, as nested plain data and as the YAML in config.yaml."""

    plain: dict[str, Any]
    yaml: str


class Tracker(Protocol):
    name: ClassVar[str]
    # True: a resumed attempt replaces what an earlier one logged after the checkpoint
    # (TensorBoard's purge_step). False: the tracker keeps every point it is sent, so the
    # steps an earlier attempt already logged are not sent again.
    rewrites_on_resume: ClassVar[bool]

    def open(self, start: TrackerStart) -> dict[str, Any]:
        """Create or continue the tracker's run; returns its identity for trackers.json."""

    def describe(self, config: Optional[ConfigRecord], provenance: Mapping[str, Any]) -> None:
        """The config (None: unchanged since it was last sent) and this attempt's provenance."""

    def log(self, step: int, values: Mapping[str, float]) -> None: ...

    def flush(self) -> None: ...

    def finish(self, step: int, summary: Mapping[str, float]) -> None: ...

    def close(self, *, failed: bool) -> None: ...

    def hint(self) -> Optional[str]:
        """One line on where the run's data is and how to look at or upload it."""
