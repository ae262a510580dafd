"""Optimizers and learning-rate schedules (StepSchedule) from typed config."""

from __future__ import annotations

import io
import math
from typing import Any, Optional

import pytest
import torch

from hpcdl.config.schema import (
    SCHEDULE_NAMES,
    AdamConfig,
    AdamWConfig,
    RmspropConfig,
    ScheduleConfig,
    SgdConfig,
)
from hpcdl.errors import ConfigError
from hpcdl.optim import build_optimizer, build_scheduler, lr_multiplier

LR = 0.1


def params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.ones(3))]


def test_sgd_options_are_applied() -> None:
    opt = build_optimizer(
        SgdConfig(lr=0.5, momentum=0.8, nesterov=True, weight_decay=1e-3), params()
    )
    assert isinstance(opt, torch.optim.SGD)
    group = opt.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"], group["weight_decay"]) == (
        0.5,
        0.8,
        True,
        1e-3,
    )


@pytest.mark.parametrize(
    ("cfg_type", "opt_type"), [(AdamConfig, torch.optim.Adam), (AdamWConfig, torch.optim.AdamW)]
)
def test_adam_family_options_are_applied(cfg_type: type, opt_type: type) -> None:
    opt = build_optimizer(
        cfg_type(lr=0.003, betas=[0.8, 0.95], eps=1e-6, weight_decay=0.05), params()
    )
    assert type(opt) is opt_type
    group = opt.param_groups[0]
    assert group["lr"] == 0.003
    assert tuple(group["betas"]) == (0.8, 0.95)
    assert group["eps"] == 1e-6
    assert group["weight_decay"] == 0.05


def test_adamw_default_weight_decay() -> None:
    assert build_optimizer(AdamWConfig(), params()).param_groups[0]["weight_decay"] == 0.01


def test_rmsprop_options_are_applied() -> None:
    cfg = RmspropConfig(lr=0.02, alpha=0.9, momentum=0.5, eps=1e-7, weight_decay=0.1)
    opt = build_optimizer(cfg, params())
    assert isinstance(opt, torch.optim.RMSprop)
    group = opt.param_groups[0]
    assert (
        group["lr"],
        group["alpha"],
        group["momentum"],
        group["eps"],
        group["weight_decay"],
    ) == (
        0.02,
        0.9,
        0.5,
        1e-7,
        0.1,
    )


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (SgdConfig(lr=-1), "optim.lr=-1: must be > 0"),
        (AdamConfig(lr=0.0), "optim.lr=0.0: must be > 0"),
        (SgdConfig(momentum=0.0, nesterov=True), "optim.nesterov=true needs optim.momentum > 0"),
        (SgdConfig(weight_decay=-0.1), "optim.weight_decay=-0.1: must be >= 0"),
        (AdamConfig(betas=[0.9, 1.0]), r"optim.betas=\[0.9, 1.0\]: need two values in \[0, 1\)"),
        (AdamWConfig(eps=0.0), "optim.eps=0.0: must be > 0"),
        (RmspropConfig(alpha=1.0), r"optim.alpha=1.0: must be in \[0, 1\)"),
    ],
)
def test_bad_optimizer_config_names_the_key(cfg: object, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{message}") as info:
        build_optimizer(cfg, params())
    assert "\n" not in str(info.value)


def lrs(cfg: ScheduleConfig, total_steps: int, steps_per_epoch: int = 10) -> list[float]:
    """The lr used by each optimizer step, stepping the scheduler once per step."""
    opt = torch.optim.SGD(params(), lr=LR)
    return used_lrs(opt, build_scheduler(cfg, opt, total_steps, steps_per_epoch), total_steps)


def used_lrs(opt: torch.optim.Optimizer, sched: Any, num_steps: int) -> list[float]:
    """The lr of each of the next num_steps optimizer steps, the schedule stepped after each."""
    used = []
    for _ in range(num_steps):
        used.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return used


def test_none_is_constant() -> None:
    assert lrs(ScheduleConfig(name="none"), 20) == pytest.approx([LR] * 20)


def test_warmup_rises_linearly_then_stays() -> None:
    used = lrs(ScheduleConfig(name="warmup", warmup_steps=4), 10)
    assert used == pytest.approx([LR * 0.25, LR * 0.5, LR * 0.75, LR] + [LR] * 6)


def test_step_multiplies_by_gamma_every_step_size_epochs() -> None:
    used = lrs(ScheduleConfig(name="step", step_size_epochs=2, gamma=0.5), 60, steps_per_epoch=10)
    # Epochs 0-1 at LR, 2-3 at LR/2, 4-5 at LR/4.
    assert used[0] == used[19] == pytest.approx(LR)
    assert used[20] == used[39] == pytest.approx(LR * 0.5)
    assert used[40] == used[59] == pytest.approx(LR * 0.25)


def test_cosine_follows_the_formula_down_to_min_lr_ratio() -> None:
    total = 21
    used = lrs(ScheduleConfig(name="cosine", min_lr_ratio=0.1), total)
    for step in (0, 5, 10, 15, 20):
        progress = step / (total - 1)
        expected = LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        assert used[step] == pytest.approx(expected)
    assert used[10] == pytest.approx(LR * 0.55)
    assert used[-1] == pytest.approx(LR * 0.1)


def test_cosine_with_warmup_starts_decaying_after_the_warmup() -> None:
    used = lrs(ScheduleConfig(name="cosine", warmup_steps=5), 25)
    assert used[:5] == pytest.approx([LR * k / 5 for k in range(1, 6)])
    # 19 decay steps from step 5 (lr) to step 24 (0).
    assert used[5 + 19 // 2] == pytest.approx(LR * 0.5 * (1 + math.cos(math.pi * 9 / 19)))
    assert used[-1] == pytest.approx(0.0, abs=1e-12)


def test_onecycle_rises_to_peak_then_cosines_down() -> None:
    total = 11  # progress = step / 10
    used = lrs(
        ScheduleConfig(name="onecycle", max_lr_ratio=10.0, pct_start=0.2, min_lr_ratio=0.0), total
    )
    assert used[0] == pytest.approx(LR)
    assert used[1] == pytest.approx(LR * 5.5)  # halfway up from 1x to 10x
    assert used[2] == pytest.approx(LR * 10)  # peak at pct_start
    assert max(used) == pytest.approx(LR * 10)
    # progress 0.6: half way down the cosine from 10x to 0.
    assert used[6] == pytest.approx(LR * 5)
    assert used[-1] == pytest.approx(0.0, abs=1e-12)


def test_warmup_applies_in_front_of_step_schedule() -> None:
    used = lrs(ScheduleConfig(name="step", warmup_steps=2, step_size_epochs=1, gamma=0.1), 20)
    assert used[:3] == pytest.approx([LR / 2, LR, LR])
    assert used[10] == pytest.approx(LR * 0.1)


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_state_dict_is_weights_only_safe_and_resumes_identically(name: str) -> None:
    cfg = ScheduleConfig(name=name, warmup_steps=3, step_size_epochs=1)
    total, per_epoch, stop_at = 40, 5, 17
    reference = lrs(cfg, total, per_epoch)

    opt = torch.optim.SGD(params(), lr=LR)
    sched = build_scheduler(cfg, opt, total, per_epoch)
    for _ in range(stop_at):
        opt.step()
        sched.step()
    buffer = io.BytesIO()
    torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)

    new_opt = torch.optim.SGD(params(), lr=LR)
    new_sched = build_scheduler(cfg, new_opt, total, per_epoch)
    new_opt.load_state_dict(saved["optimizer"])
    new_sched.load_state_dict(saved["scheduler"])
    assert used_lrs(new_opt, new_sched, total - stop_at) == reference[stop_at:]


def lambda_lr_lrs(cfg: ScheduleConfig, total_steps: int, steps_per_epoch: int) -> list[float]:
    """lrs() with torch's LambdaLR over the same multiplier: the reference arithmetic."""
    opt = torch.optim.SGD(params(), lr=LR)
    multiplier = lr_multiplier(cfg, total_steps, steps_per_epoch)
    return used_lrs(opt, torch.optim.lr_scheduler.LambdaLR(opt, multiplier), total_steps)


@pytest.mark.parametrize("warmup_steps", [0, 3])
@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_each_schedule_is_lambda_lr_bit_for_bit(name: str, warmup_steps: int) -> None:
    cfg = ScheduleConfig(name=name, warmup_steps=warmup_steps, step_size_epochs=1, gamma=0.3)
    assert lrs(cfg, 40, 7) == lambda_lr_lrs(cfg, 40, 7)  # ==, not approx: the same floats


@pytest.mark.parametrize("name", ["none", "cosine"])
def test_lambda_lr_checkpoints_resume_here_and_the_other_way_round(name: str) -> None:
    """A checkpoint written while hpcdl stepped a LambdaLR resumes into StepSchedule on the
    same lrs, and a StepSchedule state loads into a LambdaLR."""
    cfg = ScheduleConfig(name=name, warmup_steps=2)
    total, per_epoch, stop_at = 30, 5, 11
    reference = lambda_lr_lrs(cfg, total, per_epoch)

    opt = torch.optim.SGD(params(), lr=LR)
    old = torch.optim.lr_scheduler.LambdaLR(opt, lr_multiplier(cfg, total, per_epoch))
    for _ in range(stop_at):
        opt.step()
        old.step()
    new_opt = torch.optim.SGD(params(), lr=LR)
    new = build_scheduler(cfg, new_opt, total, per_epoch)
    new_opt.load_state_dict(opt.state_dict())
    new.load_state_dict(old.state_dict())
    assert used_lrs(new_opt, new, total - stop_at) == reference[stop_at:]

    back_opt = torch.optim.SGD(params(), lr=LR)
    back = torch.optim.lr_scheduler.LambdaLR(back_opt, lr_multiplier(cfg, total, per_epoch))
    back_opt.load_state_dict(new_opt.state_dict())
    back.load_state_dict(new.state_dict())
    assert back.last_epoch == total
    assert back.get_last_lr() == new.get_last_lr()


def test_a_schedule_leaves_optimizer_step_unwrapped_and_fills_tensor_lrs() -> None:
    """No wrapper around optimizer.step (LambdaLR's counting one costs every step), and a
    tensor lr (capturable optimizers) is filled in place, as LambdaLR does."""
    opt = torch.optim.SGD(params(), lr=torch.tensor(LR))
    step = opt.step
    lr = opt.param_groups[0]["lr"]
    sched = build_scheduler(ScheduleConfig(name="warmup", warmup_steps=4), opt, 10, 5)
    assert opt.step == step
    assert opt.param_groups[0]["lr"] is lr
    assert float(lr) == pytest.approx(LR / 4)
    opt.step()
    sched.step()
    assert float(lr) == pytest.approx(LR / 2)


def test_a_saved_schedule_for_other_param_groups_is_refused() -> None:
    opt = torch.optim.SGD(params(), lr=LR)
    sched = build_scheduler(ScheduleConfig(), opt, 10, 5)
    state = sched.state_dict()
    state["base_lrs"] = [LR, LR]
    with pytest.raises(ValueError, match="2 param groups, the optimizer 1"):
        sched.load_state_dict(state)


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (
            ScheduleConfig(name="linear"),
            "schedule.name='linear': unknown; choose one of none, step",
        ),
        (ScheduleConfig(warmup_steps=-1), "schedule.warmup_steps=-1: must be >= 0"),
        (
            ScheduleConfig(name="onecycle", pct_start=1.0),
            r"schedule.pct_start=1.0: must be in \(0, 1\)",
        ),
        (
            ScheduleConfig(name="onecycle", pct_start=0.0),
            r"schedule.pct_start=0.0: must be in \(0, 1\)",
        ),
        (
            ScheduleConfig(name="onecycle", max_lr_ratio=0.5),
            "schedule.max_lr_ratio=0.5: must be >= 1",
        ),
        (
            ScheduleConfig(name="cosine", min_lr_ratio=1.5),
            r"schedule.min_lr_ratio=1.5: must be in \[0, 1\]",
        ),
        (
            ScheduleConfig(name="step", step_size_epochs=0),
            "schedule.step_size_epochs=0: must be > 0",
        ),
        (ScheduleConfig(name="step", gamma=0.0), "schedule.gamma=0.0: must be > 0"),
    ],
)
def test_bad_schedule_config_names_the_key(cfg: ScheduleConfig, message: str) -> None:
    opt = torch.optim.SGD(params(), lr=LR)
    with pytest.raises(ConfigError, match=f"^{message}") as info:
        build_scheduler(cfg, opt, 100, 10)
    assert "\n" not in str(info.value)


def test_no_steps_is_refused() -> None:
    opt = torch.optim.SGD(params(), lr=LR)
    with pytest.raises(ConfigError, match="total_steps=0"):
        build_scheduler(ScheduleConfig(), opt, 0, 10)


@pytest.fixture
def empty_memory_is_nan() -> Any:
    """torch fills memory from empty()/empty_like() with NaN in deterministic mode: an
    uninitialized buffer shows instead of holding zeros by chance."""
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(was)


def test_a_first_step_skipped_by_the_grad_scaler_leaves_fused_sgds_momentum_zero(
    empty_memory_is_nan: Any,
) -> None:
    """fp16's GradScaler skips a step whose scaled gradients overflow, on the device, through
    the fused kernel's found_inf; torch's fused SGD would keep the uninitialized momentum
    buffers it made for that first step. The run must continue as if the step was never
    taken: the same weights as a plain SGD that took only the second step."""
    cfg = SgdConfig(lr=0.1, momentum=0.9)
    weights = torch.nn.Parameter(torch.ones(4))
    fused = build_optimizer(cfg, [weights], fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**100)
    for factor in (1e30, 1.0):  # 1e30 * 2**100 overflows float32: the first step is skipped
        fused.zero_grad()
        scaler.scale((weights * factor).sum()).backward()
        scaler.step(fused)
        scaler.update()
    assert scaler.get_scale() == 2.0**99  # one skip: the scale was halved once

    reference = torch.nn.Parameter(torch.ones(4))
    plain = build_optimizer(cfg, [reference], fused=False)
    reference.grad = torch.ones(4)
    plain.step()
    assert torch.equal(weights.detach(), reference.detach())
    assert torch.equal(fused.state[weights]["momentum_buffer"], torch.ones(4))


def test_zero_momentum_buffers_give_torchs_own_first_step_bit_for_bit() -> None:
    torch.manual_seed(0)
    start = torch.randn(64)
    grads = [torch.randn(64) for _ in range(5)]
    ends = []
    for ours in (True, False):
        param = torch.nn.Parameter(start.clone())
        opt = (
            build_optimizer(SgdConfig(lr=0.1, nesterov=True), [param], fused=True)
            if ours
            else torch.optim.SGD([param], lr=0.1, momentum=0.9, nesterov=True, fused=True)
        )
        assert bool(opt.state) == ours
        for grad in grads:
            param.grad = grad.clone()
            opt.step()
        ends.append(param.detach().clone())
    assert torch.equal(ends[0], ends[1])


def test_a_plain_state_loads_into_a_fused_sgd_with_zero_buffers_and_its_skip() -> None:
    """load_optimizer_state keeps the live optimizer's kernel (torch would take the saved
    group's fused=False) and gives a fused SGD the momentum buffers a state saved before
    any step lacks: a first step skipped on the device then leaves zeros, not memory."""
    from hpcdl.optim import load_optimizer_state

    param = torch.nn.Parameter(torch.ones(4))
    saved = build_optimizer(SgdConfig(), [param]).state_dict()  # plain, no step yet
    assert saved["state"] == {} and saved["param_groups"][0]["fused"] is None
    fused = build_optimizer(SgdConfig(), [param], fused=True)
    load_optimizer_state(fused, saved, "ckpt")
    assert fused.param_groups[0]["fused"] is True
    assert torch.equal(fused.state[param]["momentum_buffer"], torch.zeros(4))
    param.grad = torch.full((4,), 2.0)
    fused.grad_scale, fused.found_inf = None, torch.ones(())  # type: ignore[attr-defined]
    fused.step()  # skipped on the device: nothing changes, and no error
    assert torch.equal(param.detach(), torch.ones(4))
    fused.found_inf = torch.zeros(())  # type: ignore[attr-defined]
    fused.step()
    assert torch.equal(param.detach(), torch.ones(4) - 0.01 * 2.0)


def test_a_fused_state_loads_into_a_plain_optimizer_as_plain() -> None:
    from hpcdl.optim import load_optimizer_state

    param = torch.nn.Parameter(torch.ones(4))
    fused = build_optimizer(AdamConfig(), [param], fused=True)
    param.grad = torch.ones(4)
    fused.step()
    plain = build_optimizer(AdamConfig(), [param])
    load_optimizer_state(plain, fused.state_dict(), "ckpt")
    assert not plain.param_groups[0]["fused"]
    assert plain.state[param]["step"].item() == 1.0
    plain.step()
    assert plain.state[param]["step"].item() == 2.0


def test_a_resumed_optimizer_and_schedule_take_the_configs_settings() -> None:
    """The saved per-parameter state, the config's settings: with the same config the lrs
    go on exactly as uninterrupted; with optim.lr or momentum changed, the new values run
    from the next step, on the same schedule (torch would have kept the saved ones)."""
    from hpcdl.optim import load_optimizer_state

    cfg = ScheduleConfig(name="cosine", warmup_steps=2)
    total, per_epoch, stop_at = 20, 5, 7

    def run(lr: float, momentum: float, saved: Optional[dict]) -> tuple[list[float], dict]:
        param = torch.nn.Parameter(torch.ones(3))
        opt = build_optimizer(SgdConfig(lr=lr, momentum=momentum), [param])
        sched = build_scheduler(cfg, opt, total, per_epoch)
        if saved is not None:
            load_optimizer_state(opt, saved["optimizer"], "ckpt")
            sched.load_state_dict(saved["scheduler"])
        assert opt.param_groups[0]["momentum"] == momentum
        used = []
        for _ in range(stop_at if saved is None else total - stop_at):
            used.append(opt.param_groups[0]["lr"])
            param.grad = torch.ones(3)
            opt.step()
            sched.step()
        return used, {"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}

    first, saved = run(0.1, 0.9, None)
    assert first + run(0.1, 0.9, saved)[0] == lrs(cfg, total, per_epoch)  # LR: the same floats
    opt = torch.optim.SGD(params(), lr=0.05)
    at_005 = used_lrs(opt, build_scheduler(cfg, opt, total, per_epoch), total)
    assert run(0.05, 0.5, saved)[0] == at_005[stop_at:]


def test_another_optimizers_state_is_refused_in_one_line() -> None:
    from hpcdl.errors import CheckpointError
    from hpcdl.optim import load_optimizer_state

    param = torch.nn.Parameter(torch.ones(3))
    sgd = build_optimizer(SgdConfig(), [param])
    param.grad = torch.ones(3)
    sgd.step()
    adam = build_optimizer(AdamConfig(), [param])
    with pytest.raises(
        CheckpointError, match=r"^ckpt: holds sgd optimizer state, and this run's Adam keeps adam"
    ):
        load_optimizer_state(adam, sgd.state_dict(), "ckpt")
    adamw = build_optimizer(AdamWConfig(), [param])
    adam.step()
    load_optimizer_state(adamw, adam.state_dict(), "ckpt")  # the same state: allowed
    assert adamw.param_groups[0]["weight_decay"] == AdamWConfig().weight_decay
    plain = build_optimizer(SgdConfig(momentum=0.0), [param])
    plain.step()  # no momentum: no state, nothing to refuse
    load_optimizer_state(build_optimizer(AdamConfig(), [param]), plain.state_dict(), "ckpt")


def test_restored_state_takes_its_parameters_layout() -> None:
    """A checkpoint saved without channels_last resumed with it: each state tensor gets its
    parameter's strides (torch's fused CUDA steps refuse others), with the same values."""
    from hpcdl.optim import match_parameter_layout

    conv = torch.nn.Conv2d(3, 8, 3)
    opt = build_optimizer(SgdConfig(), conv.parameters())
    conv(torch.randn(2, 3, 8, 8)).sum().backward()
    opt.step()
    saved = opt.state_dict()

    conv = conv.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    resumed = build_optimizer(SgdConfig(), conv.parameters())
    resumed.load_state_dict(saved)
    weight_buffer = resumed.state[conv.weight]["momentum_buffer"]
    assert weight_buffer.stride() != conv.weight.stride()
    match_parameter_layout(resumed)
    for index, param in enumerate(conv.parameters()):
        buffer = resumed.state[param]["momentum_buffer"]
        assert buffer.stride() == param.stride()
        assert torch.equal(buffer, saved["state"][index]["momentum_buffer"])
