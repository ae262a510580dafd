"""Optimizers and learning-rate schedules from typed config.

Every schedule is a StepSchedule: each param group's lr is its base lr times a plain
function of the optimizer step, as torch's LambdaLR computes it, so
``scheduler.state_dict()`` holds plain values only (weights_only-safe, LambdaLR's keys) and
the shape of the schedule always comes from the config, not from a checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Optional

import torch

from hpcdl.config.schema import (
    AdamConfig,
    AdamWConfig,
    RmspropConfig,
    ScheduleConfig,
    SgdConfig,
)
from hpcdl.config.validate import check_optim, check_schedule
from hpcdl.errors import CheckpointError, ConfigError

ParamsT = Iterable[Any]  # tensors or param-group dicts, as torch.optim accepts


# ----------------------------------------------------------------------------- optimizers
def use_fused(
    cfg: Any, lagged_sync: str, device: torch.device, model: Optional[torch.nn.Module] = None
) -> bool:
    """optim.fused resolved: "auto" fuses on CUDA when the model's parameters allow it, and
    wherever trainer.lagged_sync=true needs the fused kernel's on-device skip of a
    non-finite step (rmsprop has none)."""
    choice = str(getattr(cfg, "fused", "false")).lower()  # validated: auto, true or false
    if choice != "auto":
        return choice == "true"
    if str(lagged_sync).lower() == "true":
        return True
    return device.type == "cuda" and (model is None or fusable(model))


def fusable(model: torch.nn.Module) -> bool:
    """Whether torch's fused step takes this model's parameters: dense floating tensors
    (no complex ones), no embedding with sparse gradients."""
    if any(getattr(m, "sparse", False) is True for m in model.modules()):
        return False
    return all(p.is_floating_point() and not p.is_sparse for p in model.parameters())


def build_optimizer(cfg: Any, params: ParamsT, fused: bool = False) -> torch.optim.Optimizer:
    """The optimizer named by ``cfg`` (a dataclass from schema.OPTIM_SCHEMAS); ``fused``
    (sgd, adam, adamw): torch's one-kernel step (see use_fused)."""
    check_optim(cfg)  # the ranges, as on the login node
    kernel = {"fused": True} if fused else {}
    # AdamWConfig subclasses AdamConfig: test it first.
    if isinstance(cfg, AdamWConfig):
        return torch.optim.AdamW(
            params, lr=cfg.lr, betas=_betas(cfg), eps=cfg.eps, weight_decay=cfg.weight_decay, **kernel
        )
    if isinstance(cfg, AdamConfig):
        return torch.optim.Adam(
            params, lr=cfg.lr, betas=_betas(cfg), eps=cfg.eps, weight_decay=cfg.weight_decay, **kernel
        )
    if isinstance(cfg, SgdConfig):
        sgd = torch.optim.SGD(
            params,
            lr=cfg.lr,
            momentum=cfg.momentum,
            nesterov=cfg.nesterov,
            weight_decay=cfg.weight_decay,
            **kernel,
        )
        zero_missing_momentum_buffers(sgd)
        return sgd
    if isinstance(cfg, RmspropConfig):
        return torch.optim.RMSprop(
            params,
            lr=cfg.lr,
            alpha=cfg.alpha,
            eps=cfg.eps,
            momentum=cfg.momentum,
            weight_decay=cfg.weight_decay,
        )
    raise ConfigError(
        f"optim.name={getattr(cfg, 'name', None)!r}: unknown optimizer; "
        "choose one of sgd, adam, adamw, rmsprop"
    )


def zero_missing_momentum_buffers(optimizer: torch.optim.Optimizer) -> None:
    """torch's fused SGD makes its momentum buffers with empty_like on its first step and
    fills them in the kernel, which a step skipped on the device (GradScaler's overflow skip
    in fp16, trainer.lagged_sync's non-finite skip) does not run: the next step would apply
    whatever that memory held. Zeros from the start make the first step's buffer
    momentum * 0 + grad, the gradient torch would have copied there (no dampening here).
    Buffers already there (a restored state) are kept; other optimizers are left alone."""
    if not isinstance(optimizer, torch.optim.SGD):
        return
    for group in optimizer.param_groups:
        if not (group.get("fused") and group["momentum"]):
            continue
        for param in group["params"]:
            state = optimizer.state[param]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(param)


# Keys of a param group that name its parameters; every other key is a setting.
GROUP_PARAMS = ("params", "param_names")
# The per-parameter state each optimizer family keeps (Adam and AdamW share theirs).
STATE_KINDS = (("exp_avg", "adam"), ("square_avg", "rmsprop"), ("momentum_buffer", "sgd"))


# The optimizer families by class (Adam and AdamW keep the same state).
KINDS = {"SGD": "sgd", "Adam": "adam", "AdamW": "adam", "RMSprop": "rmsprop"}


def optimizer_kind(optimizer: torch.optim.Optimizer) -> str:
    """sgd, adam (Adam or AdamW), rmsprop, or the class name."""
    name = type(optimizer).__name__
    return KINDS.get(name, name)


def saved_kind(saved: dict[str, Any]) -> Optional[str]:
    """The optimizer family whose per-parameter state ``saved`` holds; None if it holds none
    (no step yet, or SGD without momentum)."""
    for state in saved.get("state", {}).values():
        for key, kind in STATE_KINDS:
            if key in state:
                return kind
    return None


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, saved: dict[str, Any], where: str
) -> None:
    """A checkpoint's per-parameter optimizer state (momentum buffers, Adam's moments and
    step counts) into ``optimizer``, whose settings all stay as this run's config built them.

    torch takes every param-group key but the params from the saved groups: the lr,
    momentum, betas, weight decay of the run that saved it (a resume with optim.lr changed
    would have gone on with the old one, while config.yaml showed the new), and ``fused`` /
    ``foreach``: a state saved by the plain step (a CPU run, optim.fused=false) would turn off
    the fused step built here, and trainer.lagged_sync's or fp16's skip on the device would
    then fail in torch's plain step. For an unchanged config the settings are the saved ones.
    A fused SGD then gets zeros for the momentum buffers a state saved before any step lacks.
    A state of another optimizer family is refused (``where``: the checkpoint, for the
    message)."""
    live_kind, kind = optimizer_kind(optimizer), saved_kind(saved)
    if kind is not None and kind != live_kind:
        raise CheckpointError(
            f"{where}: holds {kind} optimizer state, and this run's {type(optimizer).__name__} "
            f"keeps {live_kind} state; resume with optim={kind}, or start a new run from these "
            f"weights with init_from={where}"
        )
    live, groups = optimizer.param_groups, saved.get("param_groups")
    if isinstance(groups, list) and len(groups) == len(live):  # else torch's own error
        mine = [{k: v for k, v in group.items() if k not in GROUP_PARAMS} for group in live]
        saved = {**saved, "param_groups": [{**g, **m} for g, m in zip(groups, mine, strict=True)]}
    optimizer.load_state_dict(saved)
    zero_missing_momentum_buffers(optimizer)


def match_parameter_layout(optimizer: torch.optim.Optimizer) -> None:
    """Give each state tensor shaped like its parameter the parameter's strides (e.g. a
    state saved without channels_last, restored for a channels_last model). The values stay
    the same; torch's fused CUDA steps refuse state whose strides differ from the
    parameter's."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            for key, value in state.items():
                if (
                    isinstance(value, torch.Tensor)
                    and value.shape == param.shape
                    and value.stride() != param.stride()
                ):
                    state[key] = torch.empty_like(param, dtype=value.dtype).copy_(value)


def _betas(cfg: AdamConfig) -> tuple[float, float]:
    return float(cfg.betas[0]), float(cfg.betas[1])


# ----------------------------------------------------------------------------- schedules
def build_scheduler(
    cfg: ScheduleConfig, optimizer: torch.optim.Optimizer, total_steps: int, steps_per_epoch: int
) -> StepSchedule:
    """A StepSchedule stepped once per optimizer step; see ``lr_multiplier`` for the shapes."""
    constant = cfg.name in ("none", "warmup") and cfg.warmup_steps == 0
    return StepSchedule(optimizer, lr_multiplier(cfg, total_steps, steps_per_epoch), constant)


class StepSchedule:
    """Sets each param group's lr to base_lr * multiplier(step) for optimizer step ``step``
    (0-based; ``step()`` after each optimizer step): LambdaLR's arithmetic, bit for bit.

    Why not LambdaLR itself: stepping it costs a tiny model's step several percent (its
    wrapper around ``optimizer.step``, its checks and lists), and ``schedule=none`` paid
    that too. A constant schedule here only counts the step. ``state_dict()`` has
    LambdaLR's keys (checkpoints written with LambdaLR load here, and the other way round).
    Unlike LambdaLR, the config's lrs win over the saved base lrs on resume: a run resumed
    with optim.lr changed takes the new lr from its next step, on the same schedule.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        multiplier: Callable[[int], float],
        constant: bool = False,
    ) -> None:
        self.optimizer = optimizer
        self.multiplier = multiplier
        self.constant = constant
        for group in optimizer.param_groups:  # as LambdaLR records it
            lr = group["lr"]
            group.setdefault("initial_lr", lr.clone() if isinstance(lr, torch.Tensor) else lr)
        self.base_lrs = [float(group["initial_lr"]) for group in optimizer.param_groups]
        self.last_epoch = 0  # LambdaLR's name: optimizer steps taken
        self._apply()

    def step(self) -> None:
        self.last_epoch += 1
        if not self.constant:
            self._apply()

    def _apply(self) -> None:
        factor = self.multiplier(self.last_epoch)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            lr = base * factor
            if isinstance(group["lr"], torch.Tensor):  # a tensor lr is filled, not replaced
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr

    def get_last_lr(self) -> list[float]:
        return [float(group["lr"]) for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {
            "base_lrs": list(self.base_lrs),
            "last_epoch": self.last_epoch,
            "_step_count": self.last_epoch + 1,
            "_last_lr": self.get_last_lr(),
            "lr_lambdas": [None] * len(self.base_lrs),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        base_lrs = [float(lr) for lr in state["base_lrs"]]
        if len(base_lrs) != len(self.optimizer.param_groups):
            raise ValueError(
                f"the saved schedule has {len(base_lrs)} param groups, the optimizer "
                f"{len(self.optimizer.param_groups)}"
            )
        self.last_epoch = int(state["last_epoch"])
        self._apply()  # this step's lr from the configured base lrs (the saved one, unchanged)


def lr_multiplier(
    cfg: ScheduleConfig, total_steps: int, steps_per_epoch: int
) -> Callable[[int], float]:
    """The factor on the configured lr used by optimizer step ``step`` (0-based).

    Warmup: step s < warmup_steps uses (s + 1) / warmup_steps, so the ramp rises linearly
    from 0 and no step runs with lr 0. ``step`` counts epochs from the start of the run;
    ``cosine`` and ``onecycle`` run over the steps after the warmup, from 1 to
    min_lr_ratio at the last step (onecycle first rises linearly to max_lr_ratio at
    pct_start of them, then follows a half cosine down).
    """
    _check_schedule(cfg, total_steps, steps_per_epoch)
    warmup = cfg.warmup_steps
    # Steps from the end of the warmup to the last step (total_steps - 1).
    decay_steps = max(1, total_steps - 1 - warmup)

    def after_warmup(step: int) -> float:
        return min(1.0, max(0.0, (step - warmup) / decay_steps))

    def main(step: int) -> float:
        if cfg.name in ("none", "warmup"):
            return 1.0
        if cfg.name == "step":
            epoch = step // steps_per_epoch
            return float(cfg.gamma ** (epoch // cfg.step_size_epochs))
        if cfg.name == "cosine":
            return _cosine(after_warmup(step), 1.0, cfg.min_lr_ratio)
        # onecycle
        progress = after_warmup(step)
        if progress <= cfg.pct_start:
            return 1.0 + (cfg.max_lr_ratio - 1.0) * progress / cfg.pct_start
        down = (progress - cfg.pct_start) / (1.0 - cfg.pct_start)
        return _cosine(down, cfg.max_lr_ratio, cfg.min_lr_ratio)

    def multiplier(step: int) -> float:
        ramp = min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
        return ramp * main(step)

    return multiplier


def _cosine(progress: float, start: float, end: float) -> float:
    return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _check_schedule(cfg: ScheduleConfig, total_steps: int, steps_per_epoch: int) -> None:
    check_schedule(cfg)  # the ranges, as on the login node
    _require(
        total_steps > 0,
        f"total_steps={total_steps}: must be > 0 (set trainer.max_epochs / trainer.max_steps)",
    )
    _require(
        steps_per_epoch > 0,
        f"steps_per_epoch={steps_per_epoch}: must be > 0 (trainer.batch_size vs the data size)",
    )


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)
