"""probe_user_code: run the user's model, data and task once before the run dir exists.

A broken model.target, data.target, collate_fn, task.target or task.predict (one that cannot
be imported, raises, returns the wrong thing, or gives samples the task cannot use) is then
refused as one line, with nothing written, instead of inside the job. The same goes for the
content of the user's data files (data=files, mnist, cifar10): rows of different widths,
labels that are not class labels, a missing label column; and an init_from checkpoint
that does not verify or does not fit the model. Only for launchers that train on
this machine (debug, local): a Slurm login node never imports torch or reads the data, so
there the job finds such errors on its first batch.
"""

from __future__ import annotations

from dataclasses import replace

from hpcdl.config.schema import (
    DATASET_SOURCES,
    Config,
    CustomModelConfig,
    CustomTaskConfig,
    Launcher,
)

# Built-in sources that read files the user points data.path at (the others are bundled).
FILE_SOURCES = ("files", "mnist", "cifar10")


def uses_user_code(cfg: Config) -> bool:
    """User code, or user files, that only running them can check."""
    return (
        isinstance(cfg.model, CustomModelConfig)
        or isinstance(cfg.task, CustomTaskConfig)
        or cfg.data.name in DATASET_SOURCES
        or cfg.data.name in FILE_SOURCES
        or cfg.init_from is not None  # a checkpoint: verified, and fitted to the model
    )


def probe_user_code(cfg: Config) -> None:
    """Build the data and the model, and run the task's step on the first training batch
    (no optimizer step, nothing written), and task.predict on it when set; raises the
    one-line errors the job (or `hpcdl predict`) would."""
    if cfg.cluster.launcher == Launcher.slurm or not uses_user_code(cfg):
        return
    import torch

    from hpcdl.data.feed import build_feed
    from hpcdl.data.sharding import EpochSharder
    from hpcdl.models import build_model
    from hpcdl.tasks import build_prediction, build_task, check_monitor

    device = torch.device("cpu")
    # One batch: no worker processes needed.
    data = replace(cfg.data, num_workers=0)
    feed = build_feed(data, device, seed=cfg.trainer.seed, task=cfg.task)
    model = build_model(cfg.model, feed.input_shape, feed.num_classes)
    if cfg.init_from is not None:  # as the job's warm start does (hpcdl.build)
        from hpcdl.build import warm_start_checkpoint
        from hpcdl.checkpoint import read_checkpoint
        from hpcdl.evaluation import load_matching_weights

        ckpt = warm_start_checkpoint(cfg.init_from)
        load_matching_weights(model, read_checkpoint(ckpt, mmap=True)["model"], str(ckpt))
    task = build_task(cfg.task, feed.target_stats)
    sharder = EpochSharder(
        num_samples=feed.num_samples("train"),
        global_batch_size=cfg.trainer.batch_size,
        rank=0,
        world_size=1,
        seed=cfg.trainer.seed,
    )
    batches = feed.train_batches(sharder, 0, 0, device)
    _, batch, _ = next(iter(batches))
    out = task.batch_stats(model, batch)
    out.loss_sum.backward()
    check_monitor(cfg.trainer.early_stopping.monitor, task)
    if isinstance(cfg.task, CustomTaskConfig) and cfg.task.predict is not None:
        model.eval()
        with torch.no_grad():
            build_prediction(cfg.task).outputs(model, batch)
