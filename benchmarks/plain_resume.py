"""`python -m benchmarks.plain_resume IMAGES STATE NUM_STEPS [--smoke] [--save]`: L2's plain
baseline, a hand-written script resuming L1's model in a fresh process, as a user's own
script does after a requeue:

    model = SmallCnn(...); optimizer = SGD(...)
    state = torch.load(STATE, weights_only=True); model/optimizer.load_state_dict(...)
    for x, y in DataLoader(dataset, batch_size, shuffle=True, num_workers=N): one step

It writes the benchmark's records: `called` first, `start` just before it iterates the
loader (the workers start there), a `step` after each step; it stops after NUM_STEPS steps.
With --save it first trains from scratch and writes STATE after its steps (the state the
timed runs resume from). Torch's threads come from $HPCDL_BENCH_THREADS.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

from benchmarks import hooks
from benchmarks.job_process import THREADS_VAR


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    hooks.write_record("called", 0, 0, 0, 0)
    images, state_path, num_steps = Path(args[0]), Path(args[1]), int(args[2])
    import torch
    import torch.nn.functional as F

    from benchmarks import lazy
    from benchmarks.lazy_epoch import FULL, SMOKE, plain_loader
    from hpcdl.config.schema import SgdConfig
    from hpcdl.dist import pick_device

    if os.environ.get(THREADS_VAR):
        torch.set_num_threads(int(os.environ[THREADS_VAR]))
    sizes = SMOKE if "--smoke" in args else FULL
    device = pick_device("auto", 0)
    shape = (3, sizes.image_size, sizes.image_size)
    model = lazy.SmallCnn(shape, lazy.NUM_CLASSES).to(device)
    sgd = SgdConfig()
    optimizer = torch.optim.SGD(model.parameters(), lr=sgd.lr, momentum=sgd.momentum)
    if "--save" not in args:
        state = torch.load(state_path, weights_only=True, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    loader = plain_loader(sizes, images)
    hooks.write_record("start", 0, 0, 0, 0)
    for step, (x, y) in enumerate(loader, start=1):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        hooks.write_record("step", step, 0, step, 0)
        if step == num_steps:
            break
    if "--save" in args:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, state_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
