"""What one training step asks of the device, counted: hpcdl's loop with lagged sync on and
off, and the hand-written loop, over the same steps of the same work.

    python -m benchmarks.kernels [OVERRIDES]      e.g. model=cnn data=digits trainer.precision=bf16

On a GPU a tiny model's step is bound by the host launching kernels (tens of microseconds
each), so the kernels, copies and waits a loop adds per step are its overhead there. This
profiles STEPS steps in the middle of the second epoch with torch.profiler and prints, per
step: device kernels and copies (CUDA; on a CPU, the aten operators instead), kernel
launches, host-device copies, waits for the device, pinned allocations; then the kernels
hpcdl runs more often than the hand-written loop, by name. Counts, not timings: one run is
enough and the machine's noise does not matter.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Optional

STEPS = 6
FIRST = 4  # profile from after this step of the epoch's
_profiler: Optional[Any] = None
counts: dict[str, Counter[str]] = {}  # loop -> event name -> count over the profiled steps

RUNTIME = {  # host-side runtime calls, by what they mean for the step
    "launches": ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx"),
    "copies": ("cudaMemcpyAsync", "cudaMemcpy", "cudaMemsetAsync"),
    "waits": ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize"),
    "pinned allocs": ("cudaHostAlloc", "cudaMallocHost"),
    "events recorded": ("cudaEventRecord", "cudaEventRecordWithFlags"),
}


def _start() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    global _profiler
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        activities.append(ProfilerActivity.CUDA)
    _profiler = profile(activities=activities)
    _profiler.__enter__()


def _stop(loop: str) -> None:
    import torch

    global _profiler
    assert _profiler is not None
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    _profiler.__exit__(None, None, None)
    counted: Counter[str] = Counter()
    for event in _profiler.events():
        kind = str(event.device_type).rsplit(".", 1)[-1]
        if kind == "CUDA":
            counted["device:" + event.name] += 1
        elif event.name.startswith("aten::") and event.cpu_parent is None:
            counted["aten:" + event.name] += 1  # top-level operators (the CPU's work)
        else:
            counted["host:" + event.name] += 1
    counts[loop] = counted
    _profiler = None


def profile_hook(event: Any) -> None:  # an hpcdl step hook (hpcdl.hooks.StepEvent)
    """trainer.step_hooks=[benchmarks.kernels:profile_hook]: profiles epoch 1's steps
    FIRST+1 .. FIRST+STEPS (epochs count from 0), into counts[$HPCDL_KERNELS_LOOP]."""
    if event.epoch != 1:
        return
    if event.step_in_epoch == FIRST:
        _start()
    elif event.step_in_epoch == FIRST + STEPS:
        _stop(os.environ["HPCDL_KERNELS_LOOP"])


def hand_written(overrides: list[str]) -> None:
    """The hand-written loop of benchmarks.loops, its epoch 1 profiled like hpcdl's."""
    import torch

    from benchmarks import loops

    work = loops.build_work(overrides)
    batch = work.batch_size
    if work.num_steps_per_epoch < FIRST + STEPS:
        raise SystemExit(
            f"an epoch has {work.num_steps_per_epoch} steps; this needs {FIRST + STEPS}"
        )
    for epoch in range(2):
        perm = loops.epoch_order(work, epoch)
        loss_sum = torch.zeros((), device=work.device)
        for step in range(work.num_steps_per_epoch):
            idx = perm[step * batch : (step + 1) * batch]
            loss = loops.train_step(work, work.x[idx], work.y[idx])
            loss_sum += loss.detach()
            if epoch == 1 and step + 1 == FIRST:
                _start()
            elif epoch == 1 and step + 1 == FIRST + STEPS:
                _stop("hand-written")
        loss_sum.item()


def hpcdl(overrides: list[str], lagged: str, run_dir: Path) -> None:
    from benchmarks.inprocess import create_run, run_in_process

    loop = f"hpcdl lagged_sync={lagged}"
    run = create_run(
        [
            *overrides,
            "trainer.max_epochs=2",
            f"trainer.lagged_sync={lagged}",
            "trainer.step_hooks=[benchmarks.kernels:profile_hook]",
        ],
        run_dir,
    )
    with open(os.devnull, "w") as log:
        outcome = run_in_process(run, log, {"HPCDL_KERNELS_LOOP": loop})
    if loop not in counts:
        raise SystemExit(f"{loop}: no steps profiled ({outcome})")


def per_step(counted: Counter[str], names: tuple[str, ...]) -> float:
    return sum(counted["host:" + n] for n in names) / STEPS


def table(on_cuda: bool) -> str:
    work = "device kernels + copies" if on_cuda else "aten operators"
    lines = [
        f"| loop | {work} | " + " | ".join(RUNTIME) + " |",
        "|---" * (len(RUNTIME) + 2) + "|",
    ]
    for loop, counted in counts.items():
        prefix = "device:" if on_cuda else "aten:"
        main = sum(v for k, v in counted.items() if k.startswith(prefix)) / STEPS
        cells = [f"{per_step(counted, names):.1f}" for names in RUNTIME.values()]
        lines.append(f"| {loop} | {main:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def extra(on_cuda: bool) -> str:
    """Per step, what each hpcdl loop runs more often than the hand-written one."""
    prefix = "device:" if on_cuda else "aten:"
    base = counts.get("hand-written", Counter())
    lines = []
    for loop, counted in counts.items():
        if loop == "hand-written":
            continue
        more = {
            k[len(prefix) :]: (v - base[k]) / STEPS
            for k, v in counted.items()
            if k.startswith(prefix) and v > base[k]
        }
        shown = ", ".join(
            f"{name[:70]} +{n:g}" for name, n in sorted(more.items(), key=lambda i: -i[1])
        )
        lines.append(f"- {loop}: {shown or 'nothing'}")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    import torch

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.kernels", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("overrides", nargs="*", help="e.g. model=cnn data=digits")
    args = parser.parse_args(argv)
    # The same optimizer kernel in every loop (lagged sync needs the fused one).
    overrides = ["optim.fused=true", *(args.overrides or ["model=mlp", "data=breast_cancer"])]
    on_cuda = torch.cuda.is_available()
    hand_written(overrides)
    with tempfile.TemporaryDirectory() as scratch:
        for lagged in ("true", "false"):
            hpcdl(overrides, lagged, Path(scratch) / f"lagged-{lagged}")
    print(
        f"{' '.join(overrides)} on {'cuda' if on_cuda else 'cpu'}: per step, over {STEPS} steps of epoch 2"
    )
    print(table(on_cuda))
    print()
    print(extra(on_cuda))
    return 0


if __name__ == "__main__":  # the step hook imports benchmarks.kernels: count into that one
    from benchmarks.kernels import main as imported_main

    sys.exit(imported_main())
