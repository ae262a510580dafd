"""Telemetry: per-rank step time (and GPU figures on CUDA) at the log interval, read back by
`hpcdl status`; a warning when the GPU keeps waiting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hpcdl.launch.monitor import run_status
from hpcdl.rundir import RunDir
from hpcdl.telemetry import LOW_UTIL_SAMPLES, Telemetry


def test_a_run_writes_its_step_time_and_status_shows_it(hpcdl, tmp_path: Path) -> None:
    out = hpcdl("train", "run_dir=run", "trainer.max_epochs=2", "trainer.log_every_steps=5")
    assert out.returncode == 0, out.stderr
    lines = (tmp_path / "run" / "telemetry" / "rank0.jsonl").read_text().splitlines()
    records = [json.loads(ln) for ln in lines]
    assert [r["global_step"] for r in records] == list(range(5, 27, 5))  # 13 steps an epoch
    assert all(r["step_s"] > 0 for r in records[1:])
    status = run_status(RunDir(tmp_path / "run"))
    assert status["rank 0"].startswith("step 25, ") and " ms/step" in status["rank 0"]


def test_low_utilisation_warns_once_per_streak(tmp_path: Path) -> None:
    said: list[str] = []
    t = Telemetry(tmp_path / "t.jsonl", torch.device("cpu"), low_util_pct=30, warn=said.append)
    for util in [10.0] * (LOW_UTIL_SAMPLES + 2) + [90.0] + [5.0] * LOW_UTIL_SAMPLES:
        t._check_utilisation(util)
    assert len(said) == 2 and "below 30%" in said[0] and "data.num_workers" in said[0]


@pytest.mark.gpu
def test_gpu_samples_hold_memory_and_nvml_figures(tmp_path: Path) -> None:
    device = torch.device("cuda", 0)
    x = torch.randn(1024, 1024, device=device)
    (x @ x).sum().item()
    t = Telemetry(tmp_path / "t.jsonl", device, low_util_pct=30, warn=print)
    t.sample(1)
    record = t.sample(2)
    assert record["gpu_mem_peak_mib"] >= 4.0 and record["step_s"] > 0
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return
    assert 0 <= record["gpu_util_pct"] <= 100 and record["gpu_mem_used_mib"] > 0
