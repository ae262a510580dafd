"""Per-rank telemetry at the progress-log interval (trainer.log_every_steps): the step
time, and on a GPU its utilisation, memory (used now, peak of this process) and power.
One JSON line per sample in RUN_DIR/telemetry/rank<N>.jsonl, which `hpcdl status` reads
(its last line per rank) for the site's allocation police and for you. A GPU that stays
below trainer.low_gpu_util_pct for LOW_UTIL_SAMPLES samples in a row gets one warning in
the log, naming the usual causes.

GPU figures come from NVML (nvidia-ml-py, imported only on a CUDA device, and only if it
is installed; without it only torch's memory figures are there).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import torch

# Samples in a row below the utilisation threshold before the warning.
LOW_UTIL_SAMPLES = 3


class Telemetry:
    def __init__(
        self,
        path: Path,
        device: torch.device,
        low_util_pct: float,
        warn: Callable[[str], None],
    ) -> None:
        self.path = path
        self.device = device
        self.low_util_pct = low_util_pct
        self._warn = warn
        self._last: Optional[tuple[float, int]] = None  # (time, global step) of the last sample
        self._low_streak = 0
        self._nvml = _nvml_handle(device) if device.type == "cuda" else None

    def sample(self, global_step: int) -> dict[str, Any]:
        now = time.monotonic()
        record: dict[str, Any] = {"time": round(time.time(), 3), "global_step": global_step}
        if self._last is not None and global_step > self._last[1]:
            record["step_s"] = round((now - self._last[0]) / (global_step - self._last[1]), 6)
        self._last = (now, global_step)
        if self.device.type == "cuda":
            record.update(self._gpu())
        self._check_utilisation(record.get("gpu_util_pct"))
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
        except OSError:  # telemetry never stops training
            pass
        return record

    def _gpu(self) -> dict[str, Any]:
        mib = 2**20
        out: dict[str, Any] = {
            "gpu_mem_allocated_mib": round(torch.cuda.memory_allocated(self.device) / mib, 1),
            "gpu_mem_peak_mib": round(torch.cuda.max_memory_allocated(self.device) / mib, 1),
        }
        if self._nvml is not None:
            nvml, handle = self._nvml
            try:
                out["gpu_util_pct"] = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                out["gpu_mem_used_mib"] = round(nvml.nvmlDeviceGetMemoryInfo(handle).used / mib, 1)
                out["gpu_power_w"] = round(nvml.nvmlDeviceGetPowerUsage(handle) / 1000, 1)
            except Exception:  # NVML errors (no permission, not supported): skip the figure
                pass
        return out

    def _check_utilisation(self, util: Optional[float]) -> None:
        if util is None or util >= self.low_util_pct:
            self._low_streak = 0
            return
        self._low_streak += 1
        if self._low_streak == LOW_UTIL_SAMPLES:
            self._warn(
                f"warning: GPU utilisation below {self.low_util_pct:g}% for {LOW_UTIL_SAMPLES} "
                f"samples in a row (now {util:g}%): the GPU waits for the CPU. Usual causes: "
                "data loading (raise data.num_workers, or keep small data in memory), a tiny "
                "batch or model (raise trainer.batch_size), or CPU-bound steps (per-step Python "
                "work, logging); `hpcdl bench devices` shows whether the GPU helps this model"
            )


def _nvml_handle(device: torch.device) -> Optional[tuple[Any, Any]]:
    """NVML's handle for this torch device (by UUID: CUDA_VISIBLE_DEVICES renumbers)."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        return pynvml, handle
    except Exception:  # not installed, no driver access, an older torch without uuid
        return None

