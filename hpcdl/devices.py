"""`hpcdl bench devices`: the GPU course's lab table for this node. The same model, data and
optimizer step timed on the CPU and on every visible GPU, at a small and a large batch,
with the speedup over the CPU at the same batch size (a tiny model is often no faster on
a GPU: launching its kernels costs more than computing them).

One step is what the trainer does (forward, loss, backward, optimizer step), on batches
drawn from the run's own training rows already on the device, in the run's precision.
Each figure is the median of `rounds` timed blocks of `steps` steps, after a warm-up block;
a GPU block ends with a synchronize, so queued work is counted.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hpcdl.config.schema import Config, Precision
from hpcdl.data.feed import TensorFeed, build_feed
from hpcdl.errors import ConfigError
from hpcdl.models import build_model
from hpcdl.optim import build_optimizer, use_fused


@dataclass(frozen=True)
class DeviceRow:
    device: str  # "cpu (16 threads)", "cuda:0 NVIDIA H100 80GB HBM3"
    batch_size: int
    step_s: float
    samples_per_s: float
    speedup: float  # CPU step time / this step time, same batch size


def measure_devices(
    cfg: Config, batch_sizes: tuple[int, ...], steps: int = 20, rounds: int = 5
) -> list[DeviceRow]:
    devices = [torch.device("cpu")]
    devices += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    cpu_time: dict[int, float] = {}
    rows = []
    for device in devices:
        for batch in batch_sizes:
            step_s = time_steps(cfg, device, batch, steps, rounds)
            if device.type == "cpu":
                cpu_time[batch] = step_s
            rows.append(
                DeviceRow(
                    device=describe(device),
                    batch_size=batch,
                    step_s=step_s,
                    samples_per_s=batch / step_s,
                    speedup=cpu_time[batch] / step_s,
                )
            )
    return rows


def describe(device: torch.device) -> str:
    if device.type == "cpu":
        threads = torch.get_num_threads()
        return f"cpu ({threads} thread{'s' if threads != 1 else ''})"
    return f"{device} {torch.cuda.get_device_name(device)}"


def time_steps(cfg: Config, device: torch.device, batch: int, steps: int, rounds: int) -> float:
    feed = build_feed(cfg.data, device, seed=cfg.trainer.seed)
    if not isinstance(feed, TensorFeed):
        raise ConfigError(
            f"hpcdl bench devices: data={cfg.data.name} is read lazily; this table needs data "
            "held in memory (breast_cancer, digits, mnist, cifar10, files, synthetic)"
        )
    torch.manual_seed(cfg.trainer.seed)
    x, y = feed.data.x_train.to(device), feed.data.y_train.to(device)
    model = build_model(cfg.model, feed.input_shape, feed.num_classes).to(device)
    # The optimizer step the trainer would take here (fused on CUDA where the model allows).
    fused = use_fused(cfg.optim, cfg.trainer.lagged_sync, device, model)
    optimizer = build_optimizer(cfg.optim, model.parameters(), fused)
    dtype = {Precision.bf16: torch.bfloat16, Precision.fp16: torch.float16}.get(
        cfg.trainer.precision
    )
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.trainer.precision == Precision.fp16)
    # Batches cycle over the training rows (with replacement when the batch is larger).
    index = torch.randint(0, x.shape[0], (steps, batch), device=device)

    def block() -> float:
        _sync(device)
        start = time.perf_counter()
        for i in range(steps):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = F.cross_entropy(model(x[index[i]]).float(), y[index[i]])
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        _sync(device)
        return (time.perf_counter() - start) / steps

    block()  # warm-up: allocator, cuDNN autotuning, first kernels
    return statistics.median(block() for _ in range(rounds))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def no_gpu_note() -> str | None:
    """Why the table has no GPU row where one may be expected: a CPU-only torch build, or
    CUDA_VISIBLE_DEVICES set and no device seen (None: a GPU row is there, or no sign)."""
    if torch.cuda.device_count():
        return None
    if torch.version.cuda is None:
        return (
            f"note: torch {torch.__version__} is a CPU-only build: no GPU rows (on a GPU node, "
            "install a CUDA build of torch)"
        )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return f"note: torch sees no CUDA GPU (CUDA_VISIBLE_DEVICES={visible}): no GPU rows"
    return None


def table(rows: list[DeviceRow], model: str, data: str, precision: str) -> str:
    head = f"model={model} data={data} precision={precision}\n"
    lines = [
        "| device | batch | step (ms) | samples/s | speedup vs CPU |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.device} | {r.batch_size} | {r.step_s * 1e3:.2f} | {r.samples_per_s:,.0f} "
            f"| {r.speedup:.2f}x |"
        )
    return head + "\n".join(lines)
