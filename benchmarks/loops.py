"""The overhead benchmark's work, and the loops that do it without hpcdl's trainer.

`Work` is what every loop trains, built by hpcdl from the case's config so that they all
train the same thing: the model (hpcdl's builder, after torch.manual_seed(trainer.seed),
which is drawn again after the build, as hpcdl's rank 0 does), the optimizer (hpcdl's optim config; these loops keep its rate constant, while hpcdl steps
its schedule, schedule=none by default, every step), the training rows (hpcdl's own split of the bundled
data, one tensor on the device), the batch size, and the precision (autocast in bf16/fp16,
and a GradScaler in fp16, as hpcdl's trainer does).

Two loops a careful user writes by hand, each reading its loss once per epoch:

    raw slicing:  perm = epoch_order(epoch); for each batch: idx = perm[i:i+b];
                  zero_grad; cross_entropy(model(x[idx]), y[idx]); backward; step
                  (epoch_order: randperm(n) from a generator seeded by seed and epoch,
                  as hpcdl draws it, so this loop does hpcdl's arithmetic exactly and
                  ends with hpcdl's weights, bit for bit, on the CPU)
    DataLoader:   for xb, yb in DataLoader(TensorDataset(x, y), batch_size, shuffle=True):
                  the same step on xb.to(device), yb.to(device)   (rows on the host,
                  torch's default collate, no workers; pinned memory on a GPU)

and, in benchmarks.lightning_loop, a Lightning Trainer. Each calls
benchmarks.hooks.write_record after every optimizer step, as hpcdl's loop does through its
step hook, so every loop pays the same for being timed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from benchmarks import hooks

if TYPE_CHECKING:
    import torch
    from torch import nn

    from hpcdl.config.schema import Config, Precision


@dataclass
class Work:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: Optional[torch.amp.GradScaler]  # fp16 only
    autocast_dtype: Optional[torch.dtype]  # None: fp32, no autocast at all
    precision: Precision
    x: torch.Tensor  # the training rows, on the device
    y: torch.Tensor
    x_val: torch.Tensor  # the validation rows, on the device
    y_val: torch.Tensor
    batch_size: int
    device: torch.device
    seed: int  # trainer.seed: the epochs' orders (epoch_order)

    @property
    def num_steps_per_epoch(self) -> int:
        return -(-self.x.shape[0] // self.batch_size)


def build_work(overrides: Sequence[str]) -> Work:
    """The work hpcdl does for `hpcdl train cluster=debug OVERRIDES`, for a loop of our own."""
    from hpcdl.cli.compose import compose_config

    return build_work_from(compose_config(["cluster=debug", *overrides]))


def build_work_from(cfg: Config) -> Work:
    """build_work for a composed config: reads the data and builds the model."""
    import torch

    from hpcdl.build import seed_everything
    from hpcdl.config.schema import Precision
    from hpcdl.data.feed import build_feed
    from hpcdl.dist import pick_device
    from hpcdl.models import build_model
    from hpcdl.optim import build_optimizer, use_fused

    check_comparable(cfg)
    t = cfg.trainer
    device = pick_device(t.device.value, 0)
    seed_everything(t.seed, t.deterministic)
    feed: Any = build_feed(cfg.data, device, seed=t.seed)  # a TensorFeed: checked above
    model = build_model(cfg.model, feed.input_shape, feed.num_classes).to(device)
    torch.manual_seed(t.seed)  # dropout's draws start here, as in hpcdl's rank 0
    dtype = {Precision.bf16: torch.bfloat16, Precision.fp16: torch.float16}.get(t.precision)
    return Work(
        model=model,
        # The same kernel as hpcdl's (optim.fused): fused and foreach steps round differently.
        optimizer=build_optimizer(
            cfg.optim, model.parameters(), use_fused(cfg.optim, t.lagged_sync, device, model)
        ),
        scaler=torch.amp.GradScaler(device.type) if t.precision == Precision.fp16 else None,
        autocast_dtype=dtype,
        precision=t.precision,
        x=feed.data.x_train.to(device),
        y=feed.data.y_train.to(device),
        x_val=feed.data.x_val.to(device),
        y_val=feed.data.y_val.to(device),
        batch_size=t.batch_size,
        device=device,
        seed=t.seed,
    )


def epoch_order(work: Work, epoch: int) -> torch.Tensor:
    """The epoch's order of the rows, drawn as hpcdl draws it: randperm from a generator
    seeded by (seed, epoch), on the host, moved to the device once. The same order makes
    the loops do exactly hpcdl's arithmetic: their final weights can be compared bit for bit."""
    import torch

    from hpcdl.data.sharding import EPOCH_SEED_STRIDE, GENERATOR_SEED_MODULUS

    seed = (work.seed * EPOCH_SEED_STRIDE + epoch) % GENERATOR_SEED_MODULUS
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(work.x.shape[0], generator=generator).to(work.device)


def check_comparable(cfg: Config) -> None:
    """A ConfigError naming what the loops here cannot do as hpcdl's does (no torch import:
    `hpcdl bench overhead` calls it first)."""
    from hpcdl.config.schema import ClassificationTaskConfig, CustomDataConfig, ImageFolderConfig
    from hpcdl.errors import ConfigError

    if isinstance(cfg.data, (CustomDataConfig, ImageFolderConfig)):
        raise ConfigError(
            f"data={cfg.data.name} is read lazily; these loops slice rows held in memory "
            "(breast_cancer, digits, mnist, cifar10, files, synthetic)"
        )
    if not isinstance(cfg.task, ClassificationTaskConfig):
        raise ConfigError(
            f"task={cfg.task.name}: the loops compared here train with cross-entropy; "
            "use task=classification"
        )
    t = cfg.trainer
    for key, value in (
        ("compile", t.compile),
        ("channels_last", t.channels_last),
        ("grad_clip_norm", t.grad_clip_norm),
    ):
        if value:
            raise ConfigError(
                f"trainer.{key}={value}: the hand-written and Lightning loops do not do this; "
                "compare without it"
            )


def train_step(work: Work, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """zero_grad, forward and loss (in autocast unless fp32), backward, optimizer step."""
    import torch
    import torch.nn.functional as F

    work.optimizer.zero_grad(set_to_none=True)
    autocast: Any = (
        contextlib.nullcontext()
        if work.autocast_dtype is None
        else torch.autocast(work.device.type, dtype=work.autocast_dtype)
    )
    with autocast:
        loss = F.cross_entropy(work.model(x), y)
    if work.scaler is None:
        loss.backward()
        work.optimizer.step()
    else:
        work.scaler.scale(loss).backward()
        work.scaler.step(work.optimizer)
        work.scaler.update()
    return loss


def raw_slicing_loop(work: Work, num_epochs: int) -> None:
    """The hand-written loop over resident rows: P1's strict baseline."""
    import torch

    batch = work.batch_size
    global_step = 0
    for epoch in range(num_epochs):
        work.model.train()
        perm = epoch_order(work, epoch)
        loss_sum = torch.zeros((), device=work.device)
        for step in range(work.num_steps_per_epoch):
            idx = perm[step * batch : (step + 1) * batch]
            loss = train_step(work, work.x[idx], work.y[idx])
            loss_sum += loss.detach()
            global_step += 1
            hooks.write_record("step", global_step, epoch, step + 1, 0)
        loss_sum.item()  # the epoch's one read of the loss


def dataloader_loop(work: Work, num_epochs: int) -> None:
    """The loop most tutorials write for tensors in memory: DataLoader(TensorDataset)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    device = work.device
    loader = DataLoader(
        TensorDataset(work.x.cpu(), work.y.cpu()),
        batch_size=work.batch_size,
        shuffle=True,
        pin_memory=device.type == "cuda",
    )
    global_step = 0
    for epoch in range(num_epochs):
        work.model.train()
        loss_sum = torch.zeros((), device=device)
        for step, (xb, yb) in enumerate(loader, start=1):
            x, y = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            loss = train_step(work, x, y)
            loss_sum += loss.detach()
            global_step += 1
            hooks.write_record("step", global_step, epoch, step, 0)
        loss_sum.item()
