"""logger=wandb: one W&B run for all the attempts of an hpcdl run.

Its id is made on the first attempt and kept in trackers.json; every later attempt calls
wandb.init(id=..., resume="allow"). Offline by default (compute nodes often have no
internet): each attempt writes RUN_DIR/wandb/offline-run-<time>-<id>, and `wandb sync`
uploads them, in order, into the one run.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Mapping
from typing import Any, ClassVar, Optional

from hpcdl.config.schema import WandbConfig, WandbMode
from hpcdl.exit_codes import EXIT_INTERRUPTED
from hpcdl.trackers.base import ConfigRecord, TrackerStart


class WandbTracker:
    name: ClassVar[str] = "wandb"
    rewrites_on_resume: ClassVar[bool] = False

    def __init__(self, settings: WandbConfig) -> None:
        self.settings = settings
        self._run: Any = None
        self._sync_glob = ""

    def open(self, start: TrackerStart) -> dict[str, Any]:
        import wandb

        s = self.settings
        run_id = (start.identity or {}).get("id") or new_run_id()
        self._run = wandb.init(
            project=s.project,
            entity=s.entity,
            name=s.name or start.run_name,
            group=s.group or start.group,
            tags=list(s.tags) or None,
            id=run_id,
            resume="allow",
            mode=s.mode.value,
            dir=str(start.run_dir.path),  # W&B writes its wandb/ folder in here
            # The rank logs already hold the console; git: the run's records hold the
            # revision of the code the job runs (a frozen copy on Slurm).
            settings=wandb.Settings(console="off", disable_git=True, quiet=True),
        )
        self._sync_glob = f"{start.run_dir.wandb_dir}/offline-run-*-{run_id}"
        return {"id": run_id, "project": s.project, "entity": s.entity}

    def describe(self, config: Optional[ConfigRecord], provenance: Mapping[str, Any]) -> None:
        update: dict[str, Any] = {"provenance": dict(provenance)}
        if config is not None:
            update.update(config.plain)
        self._run.config.update(update, allow_val_change=True)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self._run.log(dict(values), step=step)

    def flush(self) -> None:
        pass  # W&B's own process writes (or streams) each record as it comes

    def finish(self, step: int, summary: Mapping[str, float]) -> None:
        self._run.summary.update(dict(summary))
        self._run.finish()

    def close(self, *, failed: bool) -> None:
        if not failed:
            self._run.mark_preempting()  # shown as preempted, continued by the next attempt
        self._run.finish(exit_code=1 if failed else EXIT_INTERRUPTED)

    def hint(self) -> Optional[str]:
        if self.settings.mode != WandbMode.offline:
            return None
        return f"wandb: offline run; upload it with: wandb sync {self._sync_glob}"


def new_run_id() -> str:
    """8 characters of [a-z0-9], the form of W&B's own run ids."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))
