"""logger=tensorboard: event files in RUN_DIR/tensorboard, one log dir for all attempts.

A resumed attempt opens its writer with purge_step = the resumed step + 1: TensorBoard's
readers then drop what earlier attempts logged from that step on (points an interrupted
attempt logged after its last checkpoint), and the resumed attempt logs those steps again.
So each step shows once, with the values of the attempt that the checkpoints continue.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar, Optional

from hpcdl.config.schema import TensorBoardConfig
from hpcdl.rundir import RunDir
from hpcdl.trackers.base import ConfigRecord, TrackerStart


class TensorBoardTracker:
    name: ClassVar[str] = "tensorboard"
    rewrites_on_resume: ClassVar[bool] = True

    def __init__(self, settings: TensorBoardConfig) -> None:
        self.settings = settings
        self._writer: Any = None
        self._step = 0
        self._log_dir = ""

    def open(self, start: TrackerStart) -> dict[str, Any]:
        from torch.utils.tensorboard import SummaryWriter

        self._log_dir = str(start.run_dir.tensorboard_dir)
        self._step = start.resumed_step
        self._writer = SummaryWriter(self._log_dir, purge_step=start.resumed_step + 1)
        return {"log_dir": RunDir.TENSORBOARD}

    def describe(self, config: Optional[ConfigRecord], provenance: Mapping[str, Any]) -> None:
        # Text summaries are Markdown: fenced, the YAML and JSON keep their layout.
        if config is not None:
            self._writer.add_text("config", f"```yaml\n{config.yaml}```", self._step)
        text = json.dumps(dict(provenance), indent=2, default=str)
        self._writer.add_text("provenance", f"```json\n{text}\n```", self._step)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for key, value in values.items():
            self._writer.add_scalar(key, value, step)

    def flush(self) -> None:
        self._writer.flush()

    def finish(self, step: int, summary: Mapping[str, float]) -> None:
        self.log(step, {f"summary/{key}": value for key, value in summary.items()})
        self._writer.close()

    def close(self, *, failed: bool) -> None:
        self._writer.close()

    def hint(self) -> Optional[str]:
        return f"tensorboard: tensorboard --logdir {self._log_dir}"
