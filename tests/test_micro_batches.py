"""trainer.micro_batches (gradient accumulation): a step's batch as K forward/backward
passes gives the batch's gradient (the same weights but for the order of float sums), the
same metrics and steps, on one rank and across DDP ranks (no_sync until the last pass)."""

from __future__ import annotations

import csv
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from hpcdl.micro_batches import split_batch
from tests.conftest import run_hpcdl


def test_a_batch_splits_along_its_samples_and_keeps_the_rest_whole() -> None:
    x, y = torch.arange(20.0).reshape(10, 2), torch.arange(10)
    parts = split_batch((x, y), 3)
    assert [len(p[1]) for p in parts] == [4, 3, 3]
    assert torch.equal(torch.cat([p[0] for p in parts]), x)
    assert isinstance(parts[0], tuple)
    names = [f"f{i}.png" for i in range(10)]
    weights = torch.ones(5)  # not per sample: each part gets it whole
    parts = split_batch({"image": x, "names": names, "w": weights, "k": 3}, 4)
    assert [p["names"] for p in parts][1] == ["f3.png", "f4.png", "f5.png"]
    assert all(p["w"] is weights and p["k"] == 3 for p in parts)
    Pair = namedtuple("Pair", "x y")
    parts = split_batch(Pair(x, y), 2)
    assert isinstance(parts[1], Pair) and torch.equal(parts[1].y, y[5:])
    assert len(split_batch((x[:2], y[:2]), 8)) == 2  # fewer samples than parts: no empty one
    assert split_batch((x, y), 1)[0][0] is x


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    newest = sorted((run / "checkpoints").glob("step_*.pt"))[-1]
    return torch.load(newest, weights_only=False, map_location="cpu")["model"]


def rows(run: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((run / "metrics.csv").open()))


@pytest.mark.parametrize(
    "extra",
    [
        [],  # one rank, eager sums, accuracy deferred
        # one rank, sums read a step later; both variants also run in CI within
        # test_a_step_that_returns_its_loss_count_trains_the_same_for_any_passes_and_ranks
        pytest.param(["trainer.lagged_sync=true"], marks=pytest.mark.extended),
        pytest.param(  # DDP: no_sync until the last pass
            ["cluster=local", "cluster.tasks_per_node=2"], marks=pytest.mark.extended
        ),
    ],
    ids=["one-rank", "lagged", "two-ranks"],
)
def test_micro_batches_train_the_same_weights_and_metrics(tmp_path: Path, extra) -> None:
    common = ["trainer.max_epochs=2", "model.dropout=0", *extra]
    env = {"OMP_NUM_THREADS": "1"}
    for run, k in (("whole", 1), ("parts", 4)):
        out = run_hpcdl(
            "train", f"run_dir={run}", *common, f"trainer.micro_batches={k}", cwd=tmp_path, env=env
        )
        assert out.returncode == 0, out.stdout + out.stderr
    whole, parts = final_weights(tmp_path / "whole"), final_weights(tmp_path / "parts")
    assert whole.keys() == parts.keys()
    for name in whole:
        assert torch.allclose(whole[name], parts[name], atol=1e-5), name
        assert not torch.equal(whole[name], torch.zeros_like(whole[name]))
    a, b = rows(tmp_path / "whole"), rows(tmp_path / "parts")
    assert [r["step"] for r in a] == [r["step"] for r in b]  # the same optimizer steps
    for x, y in zip(a, b, strict=True):
        assert x["train_accuracy"] == y["train_accuracy"]
        assert float(x["train_loss"]) == pytest.approx(float(y["train_loss"]), rel=1e-5)


def test_more_micro_batches_than_a_ranks_samples_is_refused(tmp_path: Path) -> None:
    out = run_hpcdl("train", "trainer.batch_size=8", "trainer.micro_batches=16", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr == (
        "error: trainer.micro_batches=16: more passes than samples in each rank's share of "
        "trainer.batch_size=8 (8); give at most 8\n"
    )
    # Each rank's share: 40 was taken as 32 on 2 ranks of 64 (persona, lm2).
    two = ["cluster=local", "cluster.tasks_per_node=2", "trainer.batch_size=64"]
    out = run_hpcdl("train", *two, "trainer.micro_batches=40", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr == (
        "error: trainer.micro_batches=40: more passes than samples in each rank's share of "
        "trainer.batch_size=64 (32 on 2 ranks); give at most 32\n"
    )
    assert not (tmp_path / "outputs").exists()


TAGGER = '''
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset


class Sentences(Dataset):
    """Token sequences of 1 to 11 tokens padded to 12 (label -100 past the end)."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.lengths = torch.randint(1, 12, (n,), generator=g)
        self.tokens = torch.randint(1, 50, (n, 12), generator=g)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        end = int(self.lengths[i])
        x = self.tokens[i].clone()
        y = x * 7 % 5
        x[end:] = 0
        y[end:] = -100
        return {"x": x, "y": y}


def build(**kwargs):
    return {"train": Sentences(96, 0), "val": Sentences(40, 1)}


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.out = nn.Linear(16, 5)

    def forward(self, x):
        return self.out(torch.tanh(self.embed(x)))


def token_mean(model, batch):
    logits, y = model(batch["x"]), batch["y"]
    return F.cross_entropy(logits.reshape(-1, 5), y.reshape(-1), ignore_index=-100), {}


def counted(model, batch):
    loss, metrics = token_mean(model, batch)
    return loss, metrics, (batch["y"] != -100).sum()
'''


def test_a_step_that_returns_its_loss_count_trains_the_same_for_any_passes_and_ranks(
    tmp_path: Path,
) -> None:
    """A per-token mean loss with a count: 1 pass, 4 passes (lagged sums) and 2 ranks of 2
    passes give the same weights and losses; without the count, 4 passes weight each pass's
    mean by its samples and train other weights (what the count is for)."""
    (tmp_path / "tagging.py").write_text(TAGGER)
    common = [
        "model=custom",
        "model.target=tagging:Tagger",
        "data=custom",
        "data.target=tagging:build",
        "task=custom",
        "trainer.max_epochs=2",
        "trainer.batch_size=32",
        "optim=sgd",
        "optim.lr=0.5",
    ]
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(tmp_path)}
    runs = {
        "whole": ["task.target=tagging:counted", "trainer.micro_batches=1"],
        "parts": [
            "task.target=tagging:counted",
            "trainer.micro_batches=4",
            "trainer.lagged_sync=true",
        ],
        "ranks": [
            "task.target=tagging:counted",
            "trainer.micro_batches=2",
            "cluster=local",
            "cluster.tasks_per_node=2",
        ],
        "uncounted": ["task.target=tagging:token_mean", "trainer.micro_batches=4"],
    }
    for run, extra in runs.items():
        out = run_hpcdl("train", f"run_dir={run}", *common, *extra, cwd=tmp_path, env=env)
        assert out.returncode == 0, out.stdout + out.stderr
    whole = final_weights(tmp_path / "whole")
    for run in ("parts", "ranks"):
        other = final_weights(tmp_path / run)
        for name in whole:
            assert torch.allclose(whole[name], other[name], atol=1e-6), (run, name)
        for x, y in zip(rows(tmp_path / "whole"), rows(tmp_path / run), strict=True):
            for key in ("train_loss", "val_loss"):
                assert float(x[key]) == pytest.approx(float(y[key]), rel=1e-6), (run, key)
    uncounted = final_weights(tmp_path / "uncounted")
    assert max((whole[n] - uncounted[n]).abs().max().item() for n in whole) > 1e-3
