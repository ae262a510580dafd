"""Experiment trackers beside metrics.csv: logger=tensorboard, wandb, mlflow (docs/trackers.md).

A tracker's package is imported only inside the job, only on rank 0, and only when the
config chooses it: build_logger hands every other rank, and logger=csv, a NullLogger.
"""

from __future__ import annotations

import socket

from hpcdl.config.schema import Config
from hpcdl.env import RankEnv
from hpcdl.trackers.base import Logger, NullLogger


def build_logger(cfg: Config, env: RankEnv) -> Logger:
    chosen = cfg.logger.chosen()
    if not env.is_main or not chosen:
        return NullLogger()
    from hpcdl.provenance import collect_versions
    from hpcdl.trackers.base import Tracker
    from hpcdl.trackers.logger import TrackerLogger

    trackers: list[Tracker] = []
    for name in chosen:
        if name == "tensorboard":
            from hpcdl.trackers.tensorboard import TensorBoardTracker

            trackers.append(TensorBoardTracker(cfg.logger.tensorboard))
        elif name == "wandb":
            from hpcdl.trackers.wandb import WandbTracker

            trackers.append(WandbTracker(cfg.logger.wandb))
        elif name == "mlflow":
            from hpcdl.trackers.mlflow import MlflowTracker

            trackers.append(MlflowTracker(cfg.logger.mlflow))
    provenance = {
        "launcher": env.launcher,
        "job_id": env.job_id,
        "restart_count": env.restart_count,
        "nodes": env.hostname or socket.gethostname(),
        "world_size": env.world_size,
        "versions": collect_versions(),
    }
    return TrackerLogger(trackers, cfg.trainer.log_every_steps, provenance)
