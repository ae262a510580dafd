"""P7: model FLOP utilization (MFU) of hpcdl's training loop.

MFU = the FLOPs a training step must do / the step's time / the device's peak. Here:

    FLOPs a step    counted once, by torch.utils.flop_counter.FlopCounterMode, over one
                    forward pass, cross-entropy and backward pass of the model hpcdl builds
                    for the case, at the case's batch size (matmuls and convolutions: what
                    MFU counts; the count is the same in any precision)
    step time       hpcdl's median step inside an epoch (benchmarks.hooks.record_time,
                    epoch 0 not counted: it compiles), run in-process as `cluster=debug`
    peak            the dense matmul FLOP/s of this device in the case's precision,
                    measured in the same round: the best of several timed n x n matmuls

A row's ratio is hpcdl's step time / the step's FLOPs at that peak, i.e. 1 / MFU (lower
is better, like every ratio of the suite); `details.mfu` is MFU itself. The issue's goal,
MFU >= 0.35, is the ratio <= 1 / 0.35 for ResNet-18 in bf16 with channels_last and
torch.compile on a GPU. On a CPU the case is a narrower ResNet-18 in fp32 without compile
(the full one takes seconds a step there), reported without a goal.
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Optional

from benchmarks import hooks
from benchmarks.base import Row, Settings
from benchmarks.inprocess import create_run, run_in_process
from benchmarks.lazy_epoch import compared, epoch_times
from benchmarks.timing import interleaved, summarize

if TYPE_CHECKING:
    import torch

MFU_GOAL = 0.35  # the issue's, for ResNet-18 bf16 channels_last compile on a GPU


@dataclass(frozen=True)
class MfuCase:
    name: str
    overrides: tuple[str, ...]
    epochs: int  # 1 warm-up (compiles) + measured (>= 2)
    matmul_size: int  # n of the n x n matmuls that measure the peak
    goal: Optional[float]  # on the ratio (1 / MFU)


def cifar_shaped(width: int, num_samples: int, batch_size: int) -> tuple[str, ...]:
    """ResNet-18 (CIFAR variant) on synthetic 3x32x32 images of 10 classes. The split
    (a quarter for validation, an eighth for test) leaves 5/8 of the samples to train: with
    num_samples a multiple of 8 * batch_size every training batch is full, so a compiled
    model sees one batch shape (a short last batch would make torch.compile recompile for
    a dynamic batch size, and time that graph)."""
    return (
        "model=resnet18",
        f"model.width={width}",
        "data=synthetic",
        "data.shape=[3,32,32]",
        "data.num_classes=10",
        f"data.num_samples={num_samples}",
        "data.val_fraction=0.25",
        "data.test_fraction=0.125",
        f"trainer.batch_size={batch_size}",
        "trainer.channels_last=true",
    )


GPU_CASE = MfuCase(
    "resnet18",
    (
        *cifar_shaped(64, 16384, 256),
        "trainer.precision=bf16",
        "trainer.compile=true",
    ),
    epochs=3,
    matmul_size=8192,
    goal=1 / MFU_GOAL,
)
CPU_CASE = MfuCase("resnet18_w16", cifar_shaped(16, 1024, 64), 3, 1024, None)
SMOKE_CASE = MfuCase("resnet18_w8", cifar_shaped(8, 128, 16), 3, 256, None)


def run(settings: Settings) -> list[Row]:
    import torch

    settings.work_dir.mkdir(parents=True)
    full = GPU_CASE if torch.cuda.is_available() else CPU_CASE
    return [measure(SMOKE_CASE if settings.smoke else full, settings)]


def measure(case: MfuCase, settings: Settings) -> Row:
    import torch

    from hpcdl.cli.compose import compose_config
    from hpcdl.config.schema import Precision
    from hpcdl.dist import pick_device

    cfg = compose_config(["cluster=debug", *case.overrides])
    device = pick_device(cfg.trainer.device.value, 0)
    dtype = {Precision.bf16: torch.bfloat16, Precision.fp16: torch.float16}.get(
        cfg.trainer.precision, torch.float32
    )
    flops = step_flops(case, device)
    counter = itertools.count()
    peaks: list[float] = []

    def hpcdl_run() -> dict[str, float]:
        index = next(counter)
        times = settings.work_dir / f"{case.name}-{index}.times"
        run_dir = create_run(
            [*case.overrides, *RUN_OVERRIDES, f"trainer.max_epochs={case.epochs}"],
            settings.work_dir / f"{case.name}-{index}",
        )
        run_in_process(run_dir, settings.log, {hooks.TIMES_VAR: str(times)})
        steps = int((run_dir.read_summary() or {}).get("steps", 0))
        return epoch_times(hooks.read_records(times), steps // case.epochs)

    def at_peak() -> dict[str, float]:
        peak = matmul_peak(device, dtype, case.matmul_size)
        peaks.append(peak)
        return {"step": flops / peak}

    rounds = interleaved(
        {"hpcdl": hpcdl_run, "peak": at_peak}, settings.repeats, settings.warmup_rounds
    )
    step = compared(rounds["hpcdl"], rounds["peak"], "step")
    ratio = step.pop("ratio")
    measured_peaks = peaks[-settings.repeats :]
    hpcdl_step = statistics.median(r["step"] for r in rounds["hpcdl"])
    dtype_name = str(dtype).replace("torch.", "")
    return Row(
        id=f"mfu.{case.name}",
        what=f"hpcdl's median training step ({' '.join(case.overrides)}) on {device.type}; "
        "ratio = 1 / MFU",
        baseline=f"the step's counted FLOPs ({flops / 1e9:.1f} GFLOP: forward, loss and "
        f"backward, torch.utils.flop_counter) at this device's dense {dtype_name} matmul "
        f"peak, measured in the same round ({case.matmul_size}x{case.matmul_size} matmuls, "
        "the best of several)",
        ratio=ratio,
        goal=case.goal,
        details={
            **step,
            "mfu": 1 / ratio,
            "mfu_goal": MFU_GOAL if case.goal is not None else None,
            "flops_per_step": flops,
            "achieved_flops_per_s": flops / hpcdl_step,
            "peak_flops_per_s": summarize(measured_peaks).as_dict(0),
            "matmul_dtype": dtype_name,
            "device": device.type,
            "case": asdict(case),
        },
    )


# The step-time hook, no per-step log lines, no early stop in the few epochs timed.
RUN_OVERRIDES = (
    "trainer.step_hooks=[benchmarks.hooks:record_time]",
    "trainer.log_every_steps=1000000",
    "trainer.early_stopping.patience=1000",
)


def step_flops(case: MfuCase, device: torch.device) -> float:
    """FLOPs of one training step of the case's model at its batch size: forward, loss,
    backward (the optimizer's elementwise update is not counted, as MFU does not)."""
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from hpcdl.cli.compose import compose_config
    from hpcdl.data.feed import build_feed
    from hpcdl.models import build_model

    cfg = compose_config(["cluster=debug", *case.overrides])
    feed = build_feed(cfg.data, torch.device("cpu"), seed=cfg.trainer.seed)
    model = build_model(cfg.model, feed.input_shape, feed.num_classes).to(device)
    batch = cfg.trainer.batch_size
    x = torch.randn(batch, *feed.input_shape, device=device)
    y = torch.randint(feed.num_classes, (batch,), device=device)
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), y).backward()
    return float(counter.get_total_flops())


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int, trials: int = 5) -> float:
    """Dense matmul FLOP/s: the fastest of `trials` timed batches of n x n products."""
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    per_trial = 10 if device.type == "cuda" else 3

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(2):  # warm-up: kernels chosen, clocks up
        torch.mm(a, b, out=out)
    sync()
    best = float("inf")
    for _ in range(trials):
        started = time.perf_counter()
        for _ in range(per_trial):
            torch.mm(a, b, out=out)
        sync()
        best = min(best, (time.perf_counter() - started) / per_trial)
    return 2 * n**3 / best
