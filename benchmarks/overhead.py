"""P1 per-step overhead: hpcdl's training loop vs a hand-written loop doing the same work.

Same model (hpcdl builds it from the same config, for both), same optimizer (hpcdl's
optim config), same training rows (hpcdl's own split of the bundled data, as one tensor on
the device), same batch size and precision. The hand-written loop is the strict baseline
a careful user writes:

    perm = torch.randperm(n)
    for each batch: idx = perm[i:i+b]; zero_grad; cross_entropy(model(x[idx]), y[idx]);
                    backward; step; loss_sum += loss.detach()   (one host read per epoch)

hpcdl adds its per-step work on top: the task's statistics, the all-reduced step sums
(loss, samples, non-finite count, stop/eval/save flags), the progress line, the step
hooks. A step hook (benchmarks.hooks.record_time) stamps the time after every step in both
loops. Epoch 0 is warm-up and not counted.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import hooks
from benchmarks.base import Row, Settings
from benchmarks.inprocess import create_run, environ, run_in_process
from benchmarks.lazy_epoch import compared, epoch_times
from benchmarks.timing import interleaved


@dataclass(frozen=True)
class Case:
    name: str
    overrides: tuple[str, ...]  # model, data, batch size: the rest is hpcdl's defaults
    epochs: int  # 1 warm-up + measured (>= 2 measured: epoch_times needs a boundary)


FULL = (
    # The workshop's MLP on breast cancer at hpcdl's defaults (batch 32): a tiny model,
    # where a framework's per-step cost shows most.
    Case("mlp", ("model=mlp", "data=breast_cancer", "trainer.batch_size=32"), 6),
    Case("cnn", ("model=cnn", "data=digits", "trainer.batch_size=64"), 4),
)
SMOKE = (Case("mlp", ("model=mlp", "data=breast_cancer", "trainer.batch_size=128"), 3),)


def run(settings: Settings) -> list[Row]:
    work = settings.work_dir
    work.mkdir(parents=True)
    rows: list[Row] = []
    for case in SMOKE if settings.smoke else FULL:
        rows += measure(case, settings, work)
    return rows


def overrides_for(case: Case) -> list[str]:
    return [
        *case.overrides,
        f"trainer.max_epochs={case.epochs}",
        "trainer.step_hooks=[benchmarks.hooks:record_time]",
        "trainer.log_every_steps=1000000",
        "trainer.early_stopping.patience=1000",
    ]


def measure(case: Case, settings: Settings, work: Path) -> list[Row]:
    counter = itertools.count()
    steps_per_epoch = {}

    def hpcdl_run() -> dict[str, float]:
        index = next(counter)
        times = work / f"{case.name}-hpcdl-{index}.times"
        run_dir = create_run(overrides_for(case), work / f"{case.name}-run-{index}")
        run_in_process(run_dir, settings.log, {hooks.TIMES_VAR: str(times)})
        return epoch_times(hooks.read_records(times), steps_per_epoch["n"])

    def hand_run() -> dict[str, float]:
        times = work / f"{case.name}-hand-{next(counter)}.times"
        with environ({hooks.TIMES_VAR: str(times)}):
            steps_per_epoch["n"] = hand_written_loop(case)
        return epoch_times(hooks.read_records(times), steps_per_epoch["n"])

    # The hand loop runs first in each round: it also tells how many steps an epoch has.
    rounds = interleaved(
        {"hand": hand_run, "hpcdl": hpcdl_run}, settings.repeats, settings.warmup_rounds
    )
    hpcdl, hand = rounds["hpcdl"], rounds["hand"]
    setup = {"case": asdict(case), "num_steps_per_epoch": steps_per_epoch["n"]}
    loop, step = compared(hpcdl, hand, "loop"), compared(hpcdl, hand, "step")
    period = compared(hpcdl, hand, "period")
    return [
        Row(
            id=f"overhead.{case.name}.loop",
            what=f"hpcdl's training loop over one epoch ({' '.join(case.overrides)}): first "
            "to last step, no epoch boundary",
            baseline="a hand-written loop: same model, optimizer, rows (one tensor on the "
            "device, randperm indexing), batch size; one loss read per epoch",
            ratio=loop.pop("ratio"),
            goal=1.05,
            details={**loop, "step": step, **setup},
        ),
        Row(
            id=f"overhead.{case.name}.epoch",
            what="a whole hpcdl epoch, last step to last step: the loop plus the epoch end "
            "(validation pass, checkpoint, metrics row)",
            baseline="a whole hand-written epoch (its loop and its epoch's loss read; no "
            "validation, no checkpoint)",
            ratio=period.pop("ratio"),
            goal=None,
            details={**period, **setup},
        ),
    ]


def hand_written_loop(case: Case) -> int:
    """The baseline; returns its steps per epoch."""
    import torch
    import torch.nn.functional as F

    from hpcdl.cli.compose import compose_config
    from hpcdl.data.feed import build_feed
    from hpcdl.dist import pick_device
    from hpcdl.models import build_model
    from hpcdl.optim import build_optimizer

    cfg = compose_config(["cluster=debug", *overrides_for(case)])
    device = pick_device(cfg.trainer.device.value, 0)
    torch.manual_seed(cfg.trainer.seed)
    feed: Any = build_feed(cfg.data, device, seed=cfg.trainer.seed)
    x, y = feed.data.x_train.to(device), feed.data.y_train.to(device)
    model = build_model(cfg.model, feed.input_shape, feed.num_classes).to(device)
    optimizer = build_optimizer(cfg.optim, model.parameters())
    n, batch = x.shape[0], cfg.trainer.batch_size
    steps = -(-n // batch)
    global_step = 0
    for epoch in range(case.epochs):
        model.train()
        perm = torch.randperm(n, device=device)
        loss_sum = torch.zeros((), device=device)
        for step in range(steps):
            idx = perm[step * batch : (step + 1) * batch]
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
            global_step += 1
            hooks.write_record("step", global_step, epoch, step + 1, 0)
        loss_sum.item()  # the epoch's one read of the loss
    return steps
