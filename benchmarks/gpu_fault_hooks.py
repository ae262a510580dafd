"""Step hooks for checks of hpcdl's failure behaviour on one GPU (benchmarks/gpu_faults.sh,
`bash benchmarks/gpu.sh faults`). HPCDL_GPU_FAULT=<kind>@<step>; kinds:
  spin       enqueue a ~10 min spin kernel on the current stream, return (host not blocked):
             the next read of the step sums blocks in event.synchronize, NCCL's queued
             all-reduce times out -> who ends the rank: hpcdl's watchdog or NCCL's?
  spin_raise spin kernel + an all-reduce queued behind it, then raise: the traceback must
             come out at once (the failing rank skips NCCL's collective teardown)
  assert     a device-side assert (out-of-range gather index), return
  oom        allocate far more than the GPU has (torch.OutOfMemoryError), i.e. raise
  cpu_raise  raise only (plumbing check without a GPU)
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any


def _spec() -> tuple[str, int]:
    kind, _, step = os.environ.get("HPCDL_GPU_FAULT", "").partition("@")
    return kind, int(step or 0)


def after_step(event: Any) -> None:
    kind, step = _spec()
    if not kind or event.global_step != step:
        return
    print(f"FAULT {kind} at step {step} t={time.time():.1f}", file=sys.stderr, flush=True)
    import torch

    if kind in ("spin", "spin_raise"):
        torch.cuda._sleep(int(2e12))  # ~10+ min of spinning at ~2 GHz
        if kind == "spin_raise":
            import torch.distributed as dist

            dist.all_reduce(torch.ones(1, device="cuda"))  # queued behind the spin
            raise RuntimeError("rank failed on purpose with a collective queued")
    elif kind == "assert":
        x = torch.zeros(4, device="cuda")
        idx = torch.tensor([1 << 20], device="cuda")
        x[idx] = 1.0  # index_put with an out-of-range index: device-side assert
    elif kind == "oom":
        torch.empty(1 << 44, dtype=torch.uint8, device="cuda")  # 16 TiB
    elif kind == "cpu_raise":
        raise RuntimeError("rank failed on purpose")
