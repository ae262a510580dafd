"""Assemble the trainer's parts from typed config: data, model, optimizer, store, logs."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hpcdl.checkpoint import CheckpointStore, read_checkpoint, resolve_checkpoint
from hpcdl.config.convert import config_hash, to_plain
from hpcdl.config.schema import Config, Precision
from hpcdl.data import EpochSharder
from hpcdl.data.feed import Feed, build_feed
from hpcdl.env import RankEnv
from hpcdl.errors import CheckpointError, plural
from hpcdl.evaluation import load_matching_weights
from hpcdl.hooks import load_step_hooks
from hpcdl.models import build_model
from hpcdl.optim import build_optimizer, build_scheduler, use_fused
from hpcdl.progress import ProgressReporter
from hpcdl.rundir import RunDir
from hpcdl.signals import StopFlag
from hpcdl.state import Progress
from hpcdl.tasks import build_task
from hpcdl.telemetry import Telemetry
from hpcdl.trackers import build_logger
from hpcdl.trainer import Parts, Start, Trainer, saved_with, total_steps


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        # cuBLAS needs this workspace setting for deterministic matmuls (CUDA docs); it is
        # read at the process's first cuBLAS call, so set it before any GPU work.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
    # Set either way: a run in a process where an earlier one was deterministic (the Python
    # API, a notebook, a test session) would otherwise inherit the slower kernels.
    torch.use_deterministic_algorithms(deterministic)


def warm_start_checkpoint(ref: str) -> Path:
    """init_from: a checkpoint file, or a run dir's best checkpoint (its newest without one)."""
    try:
        return resolve_checkpoint(ref, "best")
    except CheckpointError:
        return resolve_checkpoint(ref, "last")


def warm_start(model: nn.Module, ckpt: Path, model_config: dict[str, Any]) -> str:
    """init_from: the checkpoint's weights into `model`, refusing a mismatch in one line that
    names the model config the checkpoint was saved with where this run's differs; returns
    what was loaded (`the weights of .../best.pt, saved after 4 epochs (global step 52)`)."""
    state = read_checkpoint(ckpt, mmap=True)
    try:
        load_matching_weights(model, state["model"], str(ckpt))
    except CheckpointError as err:
        saved = state.get("model_config") or {}
        if saved.get("name") not in (None, model_config.get("name")):
            hint = (
                f"; it was saved by a model={saved['name']} run and this run builds "
                f"model={model_config.get('name')}: init_from needs the same model"
            )
        else:
            keys = saved_with(saved, model_config, "model")
            hint = f"; it was saved with{keys}" if keys else ""
        raise CheckpointError(f"{err}{hint}") from None
    progress = state.get("progress")
    if not isinstance(progress, dict):
        return f"the weights of {ckpt}"
    pr = Progress.from_dict(progress)
    when = (
        f"saved after {plural(pr.epoch, 'epoch')} (global step {pr.global_step})"
        if pr.step_in_epoch == 0
        else f"saved at {pr.position()}"
    )
    return f"the weights of {ckpt}, {when}"


def build_trainer(
    cfg: Config, env: RankEnv, run_dir: RunDir, device: torch.device, stop: StopFlag
) -> Trainer:
    t = cfg.trainer
    # The model is built from the same seed on every rank (DDP also broadcasts rank 0's
    # weights); dropout and other randomness then differ per rank.
    seed_everything(t.seed, t.deterministic)
    feed = build_feed(cfg.data, device, seed=t.seed, task=cfg.task)
    sharder = EpochSharder(
        num_samples=feed.num_samples("train"),
        global_batch_size=t.batch_size,
        rank=env.rank,
        world_size=env.world_size,
        seed=t.seed,
    )
    store = CheckpointStore(run_dir.checkpoint_dir, keep_last=t.keep_last)
    start = first_batches(cfg, feed, sharder, store, device)
    raw_model = build_model(cfg.model, feed.input_shape, feed.num_classes)
    if cfg.init_from and not store.list_steps():  # a resumed run restores its own weights
        described = warm_start(
            raw_model, warm_start_checkpoint(cfg.init_from), to_plain(cfg)["model"]
        )
        if env.is_main:
            print(f"init_from: {described}", flush=True)
    raw_model.to(device)
    if t.channels_last:
        raw_model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    seed_everything(t.seed + env.rank, t.deterministic)

    model: nn.Module = raw_model
    if env.world_size > 1:
        ids = [device.index] if device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(raw_model, device_ids=ids)
    if t.compile:
        model = torch.compile(model)  # type: ignore[assignment]

    fused = use_fused(cfg.optim, t.lagged_sync, device, raw_model)
    optimizer = build_optimizer(cfg.optim, raw_model.parameters(), fused)
    num_steps = total_steps(cfg, sharder.num_steps_per_epoch)
    scheduler = build_scheduler(cfg.schedule, optimizer, num_steps, sharder.num_steps_per_epoch)
    parts = Parts(
        feed=feed,
        raw_model=raw_model,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=torch.amp.GradScaler(device.type, enabled=t.precision == Precision.fp16),
        sharder=sharder,
        store=store,
        metrics=run_dir.metrics,
        reporter=ProgressReporter(
            enabled=env.is_main,
            log_every_steps=t.log_every_steps,
            # The epochs this run reaches: trainer.max_steps can end it before max_epochs.
            max_epochs=-(-num_steps // sharder.num_steps_per_epoch),
        ),
        device=device,
        config_hash=config_hash(cfg),
        model_config=to_plain(cfg)["model"],
        data_config=to_plain(cfg)["data"],
        task=build_task(cfg.task, feed.target_stats, feed.num_classes),
        step_hooks=load_step_hooks(t.step_hooks),
        logger=build_logger(cfg, env),
        telemetry=Telemetry(
            run_dir.telemetry_file(env.rank),
            device,
            low_util_pct=t.low_gpu_util_pct,
            warn=print if env.is_main else lambda _: None,
        ),
    )
    # Last: starting a tracker can take seconds (W&B's service), while the loader reads ahead.
    parts.logger.start(
        cfg, run_dir, start.progress(parts.sharder, cfg.trainer.early_stopping).global_step
    )
    return Trainer(cfg, env, parts, stop, start)


def first_batches(
    cfg: Config, feed: Feed, sharder: EpochSharder, store: CheckpointStore, device: torch.device
) -> Start:
    """The newest valid checkpoint, and the batches the run continues with, their loader
    started now: its workers start and read ahead while the model is built, moved to the
    device, wrapped and restored (the loader draws nothing from the global RNG streams, so
    the model's initial weights are the same). Not when the run has nothing left to do."""
    start = Start(checkpoint=store.load_latest(mmap=True))
    if start.checkpoint is not None and "data_state" in start.checkpoint[1]:
        # The datasets prepare samples as the run's first attempt's did, from before the
        # loader below starts its workers (they copy the datasets).
        feed.load_data_state(start.checkpoint[1]["data_state"])
    progress = start.progress(sharder, cfg.trainer.early_stopping)
    t = cfg.trainer
    if progress.early_stopped or progress.epoch >= t.max_epochs:
        return start
    if t.max_steps is not None and progress.global_step >= t.max_steps:
        return start
    start.batches = feed.train_batches(sharder, progress.epoch, progress.step_in_epoch, device)
    return start
