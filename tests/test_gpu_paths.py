"""GPU tier (pytest -m gpu; skipped without CUDA): the paths added since the GPU was last
lent, each on a real GPU with a real (one-rank) NCCL process group where one is made:
micro-batches with a loss count under bf16 and fp16, the fp16 gradient norm a tracker logs,
docs/examples/fsdp_train.py with NCCL stopped and resumed, and `hpcdl run`'s stall watch
on a rank blocked waiting for the GPU."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hpcdl.exit_codes import EXIT_INTERRUPTED, EXIT_STALLED
from tests.conftest import REPO, run_hpcdl
from tests.test_micro_batches import TAGGER, final_weights, rows
from tests.test_trackers import scalars

pytestmark = pytest.mark.gpu


def biggest_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[n].float() - b[n].float()).abs().max().item() for n in a)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_micro_batches_with_a_loss_count_train_the_whole_batchs_weights_on_the_gpu(
    tmp_path: Path, precision: str
) -> None:
    """1 pass and 4 passes of a counted per-token loss end near each other (autocast's
    rounding apart), much nearer than 4 uncounted passes, which weight each pass's mean by
    its samples; under fp16 the scaler scales every pass and unscales once."""
    (tmp_path / "tagging.py").write_text(TAGGER)
    common = ["model=custom", "model.target=tagging:Tagger", "data=custom",
              "data.target=tagging:build", "task=custom", "trainer.max_epochs=2",
              "trainer.batch_size=32", "optim=sgd", "optim.lr=0.5", "trainer.device=auto",
              f"trainer.precision={precision}"]  # fmt: skip
    runs = {
        "whole": ["task.target=tagging:counted", "trainer.micro_batches=1"],
        "parts": ["task.target=tagging:counted", "trainer.micro_batches=4"],
        "uncounted": ["task.target=tagging:token_mean", "trainer.micro_batches=4"],
    }
    for run, extra in runs.items():
        out = run_hpcdl(
            "train", f"run_dir={run}", *common, *extra, cwd=tmp_path,
            env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', REPO)}"},
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        summary = json.loads((tmp_path / run / "summary.json").read_text())
        assert summary["versions"].get("gpu"), summary["versions"]
    whole, parts = final_weights(tmp_path / "whole"), final_weights(tmp_path / "parts")
    uncounted = final_weights(tmp_path / "uncounted")
    assert biggest_gap(whole, parts) < 0.25 * biggest_gap(whole, uncounted)
    for x, y in zip(rows(tmp_path / "whole"), rows(tmp_path / "parts"), strict=True):
        assert float(x["train_loss"]) == pytest.approx(float(y["train_loss"]), rel=2e-2)


def test_the_fp16_gradient_norm_logged_is_the_unscaled_one_the_optimizer_used(
    tmp_path: Path,
) -> None:
    """Plain SGD: a step moves the weights by lr times the (unscaled) gradient, so each
    logged norm can be read back from two checkpoints in a row; a step the scaler skipped
    (an overflow while the scale is found) leaves the weights where they were."""
    run_dir, lr = tmp_path / "run", 0.05
    out = run_hpcdl(
        "train", f"run_dir={run_dir}", "model=cnn", "data=digits", "trainer.device=auto",
        "trainer.precision=fp16", "trainer.max_steps=12", "trainer.log_every_steps=1",
        "trainer.checkpoint_every_steps=1", "trainer.keep_last=20", f"optim.lr={lr}",
        "optim.momentum=0", "optim.weight_decay=0", "logger=tensorboard", cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    norms = dict(scalars(run_dir / "tensorboard", "step/grad_norm"))
    from hpcdl.checkpoint import read_checkpoint

    def weights(step: int) -> list:
        path = run_dir / "checkpoints" / f"step_{step:09d}.pt"
        return [t.float().cpu() for t in read_checkpoint(path)["model"].values()]

    moved_steps = 0
    for step, logged in sorted(norms.items()):
        if step == 1:
            continue  # no checkpoint before the first step
        moved = [(a - b).double().norm() for a, b in zip(weights(step - 1), weights(step), strict=True)]  # fmt: skip
        size = float(sum(m**2 for m in moved) ** 0.5)
        if not torch.isfinite(torch.tensor(logged)):
            assert size == 0, step  # skipped: nothing moved
            continue
        moved_steps += 1
        assert logged == pytest.approx(size / lr, rel=1e-3), step
    assert moved_steps >= 5, norms


def fsdp_run(cwd: Path, run_dir: str, steps: int) -> subprocess.Popen:
    script = REPO / "docs" / "examples" / "fsdp_train.py"
    return subprocess.Popen(
        [sys.executable, "-m", "hpcdl.cli.main", "run", "cluster=local",
         "cluster.tasks_per_node=1", "cluster.gpus_per_node=1", f"run_dir={run_dir}", "--",
         "python", str(script),
         "--steps", str(steps)],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_the_fsdp_example_on_nccl_stopped_and_resumed_ends_with_the_whole_runs_weights(
    tmp_path: Path,
) -> None:
    whole = fsdp_run(tmp_path, "whole", 400)
    out, _ = whole.communicate(timeout=300)
    assert whole.returncode == 0, out
    stopped = fsdp_run(tmp_path, "stopped", 400)
    first = tmp_path / "stopped" / "checkpoints" / "step_000000010"
    deadline = time.monotonic() + 120
    while not first.is_dir() and time.monotonic() < deadline and stopped.poll() is None:
        time.sleep(0.05)
    stopped.send_signal(signal.SIGINT)
    out, _ = stopped.communicate(timeout=120)
    assert stopped.returncode == EXIT_INTERRUPTED, out
    resumed = subprocess.run(
        [sys.executable, "-m", "hpcdl.cli.main", "resume", "stopped"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from step_" in resumed.stdout, resumed.stdout
    a = torch.load(tmp_path / "whole" / "final.pt", weights_only=True)
    b = torch.load(tmp_path / "stopped" / "final.pt", weights_only=True)
    for name in a:
        assert torch.equal(a[name], b[name]), name


WAIT_FOR_GPU = """\
import os
import torch
import torch.distributed as dist

print("imported", flush=True)
torch.cuda.set_device(os.environ["HPCDL_DEVICE"])
dist.init_process_group("nccl")
print("initialized", flush=True)
value = torch.ones(1, device="cuda")
dist.all_reduce(value)  # NCCL's threads now run beside this one
print("reduced", value.item(), flush=True)

def wait_for_gpu():
    torch.cuda._sleep(2**40)  # a kernel of many minutes
    torch.cuda.synchronize()

wait_for_gpu()
"""


def test_the_stall_watch_ends_a_rank_blocked_on_the_gpu_with_its_stack(tmp_path: Path) -> None:
    (tmp_path / "wait.py").write_text(WAIT_FOR_GPU)
    started = time.monotonic()
    out = run_hpcdl(
        "run", "cluster=local", "cluster.tasks_per_node=1", "cluster.gpus_per_node=1",
        "stall_timeout_s=15", "run_dir=run",
        "--", "python", "wait.py", cwd=tmp_path, timeout=150,
    )  # fmt: skip
    took = time.monotonic() - started
    assert out.returncode == EXIT_STALLED, out.stdout + out.stderr
    assert took < 90, took
    [log] = (tmp_path / "run" / "logs").glob("*_0_log.out")
    text = log.read_text()
    assert "reduced 1.0" in text, text
    assert re.search(r'wait.py", line 1[45] in wait_for_gpu', text), text
    assert "error: rank 0: stalled" in out.stderr, out.stderr
