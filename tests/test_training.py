"""Training quality and the multi-process path (real gloo DDP ranks through submitit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hpcdl.threads import usable_cpus


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.slow
def test_breast_cancer_mlp_default_reaches_95_percent(hpcdl, tmp_path: Path) -> None:
    out = hpcdl("train", "run_dir=run")
    assert out.returncode == 0, out.stderr
    s = summary(tmp_path / "run")
    assert s["test_accuracy"] >= 0.95, s
    assert s["epochs"] == 30 and s["world_size"] == 1


@pytest.mark.slow
@pytest.mark.extended  # 2-rank gloo DDP trains in many CI cases; this one checks accuracy
def test_digits_cnn_two_rank_gloo_ddp_reaches_95_percent(hpcdl, tmp_path: Path) -> None:
    out = hpcdl(
        "train",
        "run_dir=run",
        "model=cnn",
        "data=digits",
        "cluster=local",
        "cluster.tasks_per_node=2",
        "trainer.max_epochs=12",
        env={"OMP_NUM_THREADS": None},
    )
    assert out.returncode == 0, out.stderr + out.stdout
    s = summary(tmp_path / "run")
    assert s["world_size"] == 2
    # The two ranks split this machine's CPUs (torch's default would give each all of them).
    assert s["cpu_threads"] == max(1, usable_cpus() // 2)
    assert s["test_accuracy"] >= 0.95, s
    logs = sorted((tmp_path / "run" / "logs").glob("*_log.out"))
    assert len(logs) == 2  # one log per rank
    # Only rank 0 writes the run's files; both ranks ran the same number of steps.
    assert "epoch 12/12" in out.stdout
    # The terminal shows rank 0's own lines; submitit's start/end lines stay in its log.
    assert "submitit INFO" not in out.stdout and "submitit INFO" in logs[0].read_text()
    assert out.stdout.rstrip().endswith(f"done: {tmp_path / 'run' / 'summary.json'}")


def test_early_stopping_target_stops_at_the_first_epoch_that_reaches_it(hpcdl, tmp_path) -> None:
    """trainer.early_stopping.target: max mode stops at the first val_accuracy >= target,
    min mode at the first val_loss <= target; every earlier epoch was short of it."""
    import csv

    for name, mode, column, target in (
        ("max", "max", "val_accuracy", 0.9),
        ("min", "min", "val_loss", 0.3),
    ):
        out = hpcdl(
            "train",
            f"run_dir={name}",
            f"trainer.early_stopping.monitor={column}",
            f"trainer.early_stopping.mode={mode}",
            f"trainer.early_stopping.target={target}",
        )
        assert out.returncode == 0, out.stderr
        s = summary(tmp_path / name)
        rows = list(csv.DictReader((tmp_path / name / "metrics.csv").open()))
        values = [float(r[column]) for r in rows]
        reached = [v >= target if mode == "max" else v <= target for v in values]
        assert s["early_stopped"] and 1 < s["epochs"] < 30, (s, values)
        assert reached[-1] and not any(reached[:-1]), values
    bad = hpcdl("train", "run_dir=bad", "trainer.early_stopping.target=high")
    assert bad.returncode != 0 and "trainer.early_stopping.target" in bad.stderr
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_nonfinite_losses_stop_with_a_clear_error(hpcdl, tmp_path: Path) -> None:
    out = hpcdl(
        "train", "run_dir=run", "optim.lr=1e12", "optim.momentum=0.9", "trainer.max_bad_steps=3"
    )
    assert out.returncode != 0
    assert "non-finite losses in a row" in out.stderr + out.stdout


@pytest.mark.gpu
def test_bf16_compile_on_gpu(hpcdl, tmp_path: Path) -> None:
    out = hpcdl(
        "train",
        "run_dir=run",
        "model=cnn",
        "data=digits",
        "trainer.precision=bf16",
        "trainer.compile=true",
        "trainer.channels_last=true",
        "trainer.max_epochs=8",
    )
    assert out.returncode == 0, out.stderr
    s = summary(tmp_path / "run")
    assert s["test_accuracy"] >= 0.9 and s["versions"].get("gpu")


@pytest.mark.gpu
def test_channels_last_resumes_on_the_gpu_with_the_fused_step(hpcdl, tmp_path: Path) -> None:
    """On CUDA the checkpoint is written from pinned host copies (async) and SGD is fused;
    torch's fused CUDA step refuses momentum buffers whose strides differ from their
    parameter's. A channels_last run resumes; so does one that turns channels_last off, then
    on again (the restored state takes the parameters' layout)."""
    base = ["model=cnn", "data=digits", "trainer.channels_last=true"]
    out = hpcdl("train", "run_dir=run", *base, "trainer.max_epochs=1")
    assert out.returncode == 0, out.stderr + out.stdout
    for epochs, channels_last in ((2, "true"), (3, "false"), (4, "true")):
        out = hpcdl(
            "resume",
            "run",
            f"trainer.max_epochs={epochs}",
            f"trainer.channels_last={channels_last}",
        )
        assert out.returncode == 0, out.stderr + out.stdout
        assert summary(tmp_path / "run")["epochs"] == epochs


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_run_started_on_the_cpu_continues_on_the_gpu(
    hpcdl, tmp_path: Path, precision: str
) -> None:
    """The CPU's plain SGD state, resumed where the fused step, lagged sync's skip on the
    device and (fp16) a fresh loss scale are used."""
    base = ["model=cnn", "data=digits"]
    out = hpcdl("train", "run_dir=run", *base, "trainer.device=cpu", "trainer.max_steps=5")
    assert out.returncode == 0, out.stderr + out.stdout
    out = hpcdl(
        "resume",
        "run",
        "trainer.device=auto",
        f"trainer.precision={precision}",
        "trainer.max_steps=null",
        "trainer.max_epochs=2",
    )
    assert out.returncode == 0, out.stderr + out.stdout
    s = summary(tmp_path / "run")
    assert s["epochs"] == 2 and s["versions"].get("gpu")


@pytest.mark.gpu
def test_nccl_on_every_visible_gpu(hpcdl, tmp_path: Path) -> None:
    """One rank per visible GPU (on a one-GPU machine, one rank: as below, without fp16)."""
    import torch

    gpus = torch.cuda.device_count()
    out = hpcdl(
        "train",
        "run_dir=run",
        "cluster=local",
        f"cluster.tasks_per_node={gpus}",
        f"cluster.gpus_per_node={gpus}",
        "trainer.max_epochs=2",
    )
    assert out.returncode == 0, out.stderr + out.stdout
    assert summary(tmp_path / "run")["world_size"] == gpus


@pytest.mark.gpu
def test_nccl_single_rank_local(hpcdl, tmp_path: Path) -> None:
    out = hpcdl(
        "train",
        "run_dir=run",
        "cluster=local",
        "cluster.tasks_per_node=1",
        "cluster.gpus_per_node=1",
        "trainer.max_epochs=3",
        "trainer.precision=fp16",
    )
    assert out.returncode == 0, out.stderr + out.stdout
    assert summary(tmp_path / "run")["versions"].get("gpu")


def test_deterministic_mode_is_the_runs_own_setting() -> None:
    """A run after a deterministic one in the same process (the Python API, a notebook, a
    test session) does not inherit torch's deterministic mode."""
    from hpcdl.build import seed_everything

    before = torch.are_deterministic_algorithms_enabled()
    try:
        seed_everything(0, True)
        assert torch.are_deterministic_algorithms_enabled()
        seed_everything(0, False)
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize(("first", "then"), [("fp32", "fp16"), ("fp16", "bf16"), ("bf16", "fp16")])
def test_a_run_resumes_in_another_precision(tmp_path: Path, capsys, first: str, then: str) -> None:
    """Continuing a run in fp16 (on a GPU node, say) from a checkpoint saved in fp32 or
    bf16, which holds no loss scale: the scaler starts afresh, with a message; the other
    way, the saved scale is not needed."""
    from hpcdl.cli.main import main

    run = tmp_path / "run"
    assert (
        main(["train", f"run_dir={run}", "trainer.max_steps=5", f"trainer.precision={first}"]) == 0
    )
    capsys.readouterr()
    assert main(["resume", str(run), "trainer.max_steps=20", f"trainer.precision={then}"]) == 0
    out = capsys.readouterr()
    fresh = "saved without trainer.precision=fp16; the fp16 loss scale starts at its initial value"
    assert (fresh in out.out + out.err) == (first != "fp16" and then == "fp16")
    assert summary(run)["steps"] == 20


class RunsOutOfMemory(torch.nn.Module):
    """A model whose third forward pass runs out of (GPU) memory, as torch reports it."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(input_shape[0], num_classes)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 3:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                "79.10 GiB of which 1.02 GiB is free. Including non-PyTorch memory, ..."
            )
        return self.linear(x)


def test_out_of_memory_is_one_line_naming_what_to_lower(tmp_path: Path, capsys) -> None:
    from hpcdl.cli.main import main

    args = ["train", f"run_dir={tmp_path / 'run'}", "model=custom"]
    code = main([*args, "model.target=tests.test_training:RunsOutOfMemory"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [
        "error: out of cpu memory at global step 2 (trainer.batch_size=32, trainer.precision=fp32): "
        "lower trainer.batch_size, split each step's batch with trainer.micro_batches=2, train "
        "in trainer.precision=bf16, or spread the batch over more GPUs (cluster.gpus_per_node); "
        "the checkpoints are intact (CUDA out of memory. Tried to allocate 2.00 GiB)"
    ]


def test_gpus_asked_for_where_torch_sees_none_is_said(tmp_path: Path, capsys) -> None:
    """A CPU-only torch build on a GPU node (or the FAQ's local GPU command on a laptop)
    trained on the CPU without a word."""
    from hpcdl.cli.main import main

    run = ["cluster=debug", "cluster.gpus_per_node=2", "trainer.max_epochs=1"]
    assert main(["train", *run, f"run_dir={tmp_path / 'run'}"]) == 0
    err = capsys.readouterr().err
    said = "hpcdl: warning: cluster.gpus_per_node=2, but torch "
    if torch.cuda.is_available():
        assert said not in err
    else:
        assert said in err and "sees no CUDA GPU here, so the ranks train on the CPU" in err
