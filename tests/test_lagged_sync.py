"""trainer.lagged_sync: each step's sums and agreed flags are read one step late, the
non-finite skip is made on the device, and nothing else changes: the same weights, the
same skipped steps, the same metrics, an exact resume, and all ranks acting at one step.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from hpcdl.cli.compose import compose_config
from hpcdl.errors import ConfigError
from tests import fault_hook

HERE = "tests.test_lagged_sync"
# 240 rows of 8 features, batch 32: 8 steps an epoch; two rows are NaN, so the one or two
# batches holding them each epoch have a non-finite loss and are skipped.
NAN_DATA = ["data=custom", f"data.target={HERE}:nan_rows", "data.num_classes=2", "data.num_workers=0"]
BASE = ["trainer.max_epochs=3", "trainer.batch_size=32", "trainer.max_bad_steps=3"]
EAGER = ["optim.fused=true", "trainer.lagged_sync=false"]  # the same kernel, read every step
LAGGED = ["trainer.lagged_sync=true"]


def nan_rows():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(240, 8, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    x[7] = float("nan")
    x[150, 3] = float("inf")
    val = torch.randn(64, 8, generator=g)
    return {"train": TensorDataset(x, y), "val": TensorDataset(val, (val[:, 0] > 0).long())}


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def rows_without_timing(run_dir: Path) -> list[str]:
    return [",".join(r.split(",")[:7]) for r in (run_dir / "metrics.csv").read_text().splitlines()]


def train_here(run_dir: Path, extra: list[str], capsys) -> str:
    from hpcdl.cli.main import main

    code = main(["train", f"run_dir={run_dir}", *NAN_DATA, *BASE, *extra])
    out = capsys.readouterr()
    assert code == 0, out.err + out.out
    return out.out + out.err


@pytest.mark.parametrize("optim", [["optim=sgd", "optim.momentum=0.9"], ["optim=adam"]])
def test_lagged_sync_skips_the_same_steps_and_ends_with_the_same_weights(
    tmp_path, capsys, monkeypatch, optim
) -> None:
    from hpcdl.step_sync import HostCopies

    eager = train_here(tmp_path / "eager", [*optim, *EAGER], capsys)
    sent: list[int] = []
    real = HostCopies.send
    monkeypatch.setattr(
        HostCopies, "send", lambda self, step, *a: (sent.append(step), real(self, step, *a))[1]
    )
    lagged = train_here(tmp_path / "lagged", [*optim, *LAGGED], capsys)
    e, g = summary(tmp_path / "eager"), summary(tmp_path / "lagged")
    assert sent == list(range(1, 25))  # every step's sums went through the lagged path
    assert e["num_skipped_steps"] >= 3 and e["steps"] == 24  # the NaN batches, each epoch
    assert g["num_skipped_steps"] == e["num_skipped_steps"]
    assert g["weights_sha256"] == e["weights_sha256"]
    assert rows_without_timing(tmp_path / "lagged") == rows_without_timing(tmp_path / "eager")
    skipped = re.compile(r"step (\d+): non-finite loss, step skipped")
    assert skipped.findall(lagged) == skipped.findall(eager) != []


def test_one_rank_lagged_counts_a_custom_tasks_tensor_and_number_statistics(
    tmp_path, capsys
) -> None:
    """One lagged rank sends only its tensors to the host (the loss and a custom task's tensor
    statistics); its Python number statistics, sample counts and flags stay there. The rows,
    skips and weights are the eager step's."""
    custom = ["task=custom", f"task.target={HERE}:step_with_a_number"]
    train_here(tmp_path / "eager", [*custom, *EAGER], capsys)
    train_here(tmp_path / "lagged", [*custom, *LAGGED], capsys)
    e, g = summary(tmp_path / "eager"), summary(tmp_path / "lagged")
    assert e["num_skipped_steps"] >= 3 and g["num_skipped_steps"] == e["num_skipped_steps"]
    assert g["weights_sha256"] == e["weights_sha256"]
    rows = {r: (tmp_path / r / "metrics.csv").read_text().splitlines() for r in ("eager", "lagged")}
    assert "train_acc" in rows["eager"][0] and "train_one" in rows["eager"][0]
    header = rows["eager"][0].split(",")
    assert header[-2:] == ["seconds", "samples_per_s"]

    def kept(lines: list[str]) -> list[list[str]]:
        return [line.split(",")[:-2] for line in lines]

    assert kept(rows["lagged"]) == kept(rows["eager"])
    assert all(line.split(",")[header.index("train_one")] == "1.0" for line in rows["eager"][1:])


def test_lagged_sync_stops_with_the_same_error_after_max_bad_steps(tmp_path, capsys) -> None:
    from hpcdl.cli.main import main

    args = ["train", "optim.lr=1e12", "optim.momentum=0.9", "trainer.max_bad_steps=3"]
    assert main([*args, f"run_dir={tmp_path / 'eager'}", *EAGER]) != 0
    eager = capsys.readouterr()
    assert main([*args, f"run_dir={tmp_path / 'lagged'}", *LAGGED]) != 0
    lagged = capsys.readouterr()
    error = re.compile(r"3 non-finite losses in a row at step \d+")
    assert error.findall(lagged.err + lagged.out) == error.findall(eager.err + eager.out) != []


@pytest.mark.parametrize("optim", [["optim=sgd", "optim.momentum=0.9"], ["optim=adam"]])
def test_a_state_saved_by_the_plain_step_resumes_with_the_fused_one(tmp_path, capsys, optim) -> None:
    """A run saved by the plain (non-fused) step, e.g. on the CPU, resumed where the fused
    step and its on-device skip are used (a GPU node; here trainer.lagged_sync=true). torch
    would load the saved groups' fused=False and its plain step would refuse the skip's
    found_inf; the resumed run keeps the fused step, skips the same NaN batches, and its
    checkpoints say fused. The other way round the plain step stays plain."""
    from hpcdl.checkpoint import CheckpointStore
    from hpcdl.cli.main import main

    def resume(run: Path, *overrides: str) -> None:
        code = main(["resume", str(run), *overrides, "trainer.max_steps=null"])
        out = capsys.readouterr()
        assert code == 0, out.err + out.out

    def fused_groups(run: Path) -> list[bool]:
        found = CheckpointStore(run / "checkpoints").load_latest()
        assert found is not None
        return [bool(group.get("fused")) for group in found[1]["optimizer"]["param_groups"]]

    whole = tmp_path / "whole"
    train_here(whole, [*optim, *EAGER], capsys)
    plain = tmp_path / "plain"
    train_here(plain, [*optim, "optim.fused=false", "trainer.lagged_sync=false", "trainer.max_steps=3"], capsys)
    assert fused_groups(plain) == [False]
    resume(plain, "optim.fused=auto", "trainer.lagged_sync=true")
    assert fused_groups(plain) == [True]
    assert summary(plain)["steps"] == 24
    assert summary(plain)["num_skipped_steps"] == summary(whole)["num_skipped_steps"]

    fused = tmp_path / "fused"
    train_here(fused, [*optim, *EAGER, "trainer.max_steps=3"], capsys)
    assert fused_groups(fused) == [True]
    resume(fused, "optim.fused=false")
    assert fused_groups(fused) == [False]


@pytest.mark.slow
def test_two_ranks_act_on_a_signal_one_step_later_together_and_resume_exactly(hpcdl, tmp_path):
    """SIGTERM after step 7 on both ranks: step 8's sums carry the stop (the eager mode
    stops after step 8) and are read one step late, so both ranks stop after step 9, with
    a checkpoint there; the resume ends with the weights of the uninterrupted run, which
    are those of the eager run with the same kernel."""
    two = ["cluster=local", "cluster.tasks_per_node=2", "trainer.max_epochs=2"]
    for name, extra in (("eager", EAGER), ("whole", LAGGED)):
        out = hpcdl("train", f"run_dir={name}", *two, *extra)
        assert out.returncode == 0, out.stderr + out.stdout
    run = tmp_path / "cut"
    first = hpcdl(
        "train", f"run_dir={run}", *two, *LAGGED, fault_hook.OVERRIDE, env=fault_hook.env("SIGTERM@7")
    )
    assert first.returncode == 3, first.stderr + first.stdout
    assert "stopped by SIGTERM at global step 9" in first.stdout
    assert [p.name for p in (run / "checkpoints").glob("step_*.pt")] == ["step_000000009.pt"]
    again = hpcdl("resume", str(run), env=fault_hook.env(None))
    assert again.returncode == 0, again.stderr + again.stdout
    whole = summary(tmp_path / "whole")
    assert whole["weights_sha256"] == summary(tmp_path / "eager")["weights_sha256"]
    assert summary(run)["weights_sha256"] == whole["weights_sha256"]
    assert rows_without_timing(run) == rows_without_timing(tmp_path / "whole")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["optim=rmsprop", "trainer.lagged_sync=true"], "trainer.lagged_sync=true: optim=rmsprop"),
        (["optim.fused=false", "trainer.lagged_sync=true"], "remove optim.fused=false"),
        (["trainer.lagged_sync=sometimes"], "trainer.lagged_sync='sometimes': choose auto"),
        (["optim=adam", "optim.fused=yes"], "optim.fused='yes': choose auto"),
    ],
)
def test_lagged_sync_choices_are_checked(overrides, message) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        compose_config(overrides)


def test_auto_is_on_only_on_cuda_with_a_fused_optimizer() -> None:
    from hpcdl.trainer import lagged_sync

    model = torch.nn.Linear(2, 2)
    fused = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
    plain = torch.optim.SGD(model.parameters(), lr=0.1)
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert lagged_sync("auto", cuda, fused) and not lagged_sync("auto", cuda, plain)
    assert not lagged_sync("auto", cpu, fused) and lagged_sync("True", cpu, fused)
    assert not lagged_sync("false", cuda, fused)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_found_inf_is_one_exactly_for_nan_and_inf(dtype) -> None:
    from hpcdl.step_sync import found_inf_of

    for value, expected in [(0.0, 0.0), (-0.0, 0.0), (3e4, 0.0), (-2.5, 0.0), (1e-30, 0.0)]:
        found = found_inf_of(torch.tensor(value, dtype=dtype))
        assert found.dtype == torch.float32 and found.item() == expected, value
    for value in (float("nan"), float("inf"), float("-inf")):
        assert found_inf_of(torch.tensor(value, dtype=dtype)).item() == 1.0, value
    loss = torch.tensor(2.0, dtype=dtype, requires_grad=True) * 3
    assert found_inf_of(loss).item() == 0.0 and loss.item() == 6.0  # the loss is left as it is


# ----------------------------------------------------------------------------- GPU
SYNC_CHECK = f"trainer.step_hooks=[{HERE}:no_syncs_inside_the_epoch]"


def no_syncs_inside_the_epoch(event) -> None:
    """A step hook: from the epoch's 3rd step to its second-to-last, any call that waits for
    the GPU raises (torch's sync debug mode); at the epoch's end (evaluation, checkpoint)
    syncs are allowed again."""
    inside = 2 <= event.step_in_epoch < 13 - 1  # breast cancer at batch 32: 13 steps
    torch.cuda.set_sync_debug_mode("error" if inside else "default")


def step_with_a_number(model, batch):
    """A custom task whose metrics are a tensor and a plain Python number."""
    x, y = batch
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.float(), y)
    return loss, {"acc": (logits.argmax(1) == y).float().mean(), "one": 1}


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16", "custom-task"])
def test_on_cuda_the_steps_inside_an_epoch_never_wait_for_the_gpu(tmp_path, capsys, precision):
    """The point of lagged sync: the host never waits for a step, so it queues ahead. With
    lagged_sync=false the same check fails at the first step's sums. A custom task's Python
    number metric must not add a wait either."""
    from hpcdl.cli.main import main

    common = ["train", "trainer.max_epochs=5", "trainer.lagged_sync=true", SYNC_CHECK]
    if precision == "custom-task":
        common += ["task=custom", f"task.target={HERE}:step_with_a_number"]
    else:
        common.append(f"trainer.precision={precision}")
    assert main([*common, f"run_dir={tmp_path / 'lagged'}"]) == 0, capsys.readouterr().err
    done = summary(tmp_path / "lagged")
    assert done["test_accuracy" if precision != "custom-task" else "test_acc"] > 0.8
    capsys.readouterr()
    try:
        code = main([*common, f"run_dir={tmp_path / 'eager'}", "trainer.lagged_sync=false"])
        err = capsys.readouterr().err
    except RuntimeError as error:  # however main reports it: torch's sync check fired
        code, err = 1, str(error)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert code != 0 and "synchroniz" in err.lower(), err


def test_auto_fuses_on_cuda_only_what_the_fused_step_takes() -> None:
    from hpcdl.config.schema import AdamConfig, RmspropConfig, SgdConfig
    from hpcdl.optim import use_fused

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    dense = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 2))
    sparse = torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True), torch.nn.Linear(4, 2))
    assert use_fused(SgdConfig(), "auto", cuda, dense) and not use_fused(SgdConfig(), "auto", cpu, dense)
    assert not use_fused(AdamConfig(), "auto", cuda, sparse)  # torch's fused step refuses them
    assert use_fused(AdamConfig(), "true", cpu, dense)  # lagged sync needs it, on any device
    assert not use_fused(SgdConfig(fused="false"), "auto", cuda, dense)
    assert use_fused(SgdConfig(fused="True"), "auto", cpu, dense)
    assert not use_fused(RmspropConfig(), "auto", cuda, dense)  # no fused kernel
