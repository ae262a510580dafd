"""logger=mlflow: one MLflow run for all the attempts of an hpcdl run.

Its run id is made on the first attempt and kept in trackers.json; later attempts log
into it again. Without logger.mlflow.tracking_uri the store is a folder in the run dir
(RUN_DIR/mlruns), so no server is needed on the compute nodes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar, Optional

from hpcdl.config.schema import MlflowConfig
from hpcdl.rundir import RunDir
from hpcdl.trackers.base import ConfigRecord, TrackerStart

# MLflow's log_batch takes at most this many params per call (its documented limit).
MAX_PARAMS_PER_BATCH = 100


class MlflowTracker:
    name: ClassVar[str] = "mlflow"
    rewrites_on_resume: ClassVar[bool] = False

    def __init__(self, settings: MlflowConfig) -> None:
        self.settings = settings
        self._client: Any = None
        self._run_id = ""
        self._new = False
        self._uri = ""

    def open(self, start: TrackerStart) -> dict[str, Any]:
        s = self.settings
        self._uri = s.tracking_uri or start.run_dir.mlflow_store.resolve().as_uri()
        with _file_store_allowed(s.tracking_uri is None):
            self._open(start)
        return {"run_id": self._run_id, "tracking_uri": s.tracking_uri}

    def _open(self, start: TrackerStart) -> None:
        s = self.settings
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=self._uri)
        known = start.identity or {}
        self._new = not known.get("run_id") or known.get("tracking_uri") != s.tracking_uri
        if self._new:
            experiment_id = self._experiment_id(s.experiment)
            run = self._client.create_run(experiment_id, run_name=s.run_name or start.run_name)
            self._run_id = run.info.run_id
        else:
            self._run_id = known["run_id"]
            self._client.update_run(self._run_id, status="RUNNING")

    def _experiment_id(self, name: str) -> str:
        found = self._client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(self._client.create_experiment(name))
        except Exception:  # made meanwhile by another run on a shared server
            found = self._client.get_experiment_by_name(name)
            if found is None:
                raise
            return str(found.experiment_id)

    def describe(self, config: Optional[ConfigRecord], provenance: Mapping[str, Any]) -> None:
        from mlflow.entities import Param, RunTag

        if config is not None:
            if self._new:  # MLflow refuses to change a param's value: only the first config
                params = [Param(k, str(v)) for k, v in _flat(config.plain)]
                for i in range(0, len(params), MAX_PARAMS_PER_BATCH):
                    batch = params[i : i + MAX_PARAMS_PER_BATCH]
                    self._client.log_batch(self._run_id, params=batch)
            self._client.log_text(self._run_id, config.yaml, RunDir.CONFIG)  # as in the run dir
        tags = [RunTag(f"hpcdl.{k}", str(v)) for k, v in _flat(dict(provenance))]
        self._client.log_batch(self._run_id, tags=tags)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now_ms = int(time.time() * 1000)
        metrics = [Metric(key, value, now_ms, step) for key, value in values.items()]
        self._client.log_batch(self._run_id, metrics=metrics)

    def flush(self) -> None:
        pass  # every call is written through to the store

    def finish(self, step: int, summary: Mapping[str, float]) -> None:
        self.log(step, {f"summary/{key}": value for key, value in summary.items()})
        self._client.set_terminated(self._run_id, "FINISHED")

    def close(self, *, failed: bool) -> None:
        self._client.set_terminated(self._run_id, "FAILED" if failed else "KILLED")

    def hint(self) -> Optional[str]:
        if self.settings.tracking_uri is not None:
            return f"mlflow: run {self._run_id} at {self._uri}"
        return f"mlflow: run {self._run_id}; browse with: MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri {self._uri}"


@contextmanager
def _file_store_allowed(allowed: bool) -> Iterator[None]:
    """Recent MLflow refuses its file store unless MLFLOW_ALLOW_FILE_STORE says yes: it
    prefers a database, which a run dir on a cluster file system would lock badly. Set
    while the client makes its store (then kept by MLflow for the process), and put back
    as it was: a notebook's own MLflow calls are not changed by a run's."""
    name = "MLFLOW_ALLOW_FILE_STORE"
    before = os.environ.get(name)
    if allowed:
        os.environ[name] = "true"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def _flat(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """("trainer.early_stopping.patience", 0), ...: nested keys joined with dots."""
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
