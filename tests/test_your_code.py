"""Bring your own model, data and loss: the docs/examples/mylab package, end to end.

mylab is a small segmentation project written without hpcdl in mind (docs/your-code.md): a
U-Net class, a Dataset that reads one sample at a time from .npy files and flips at random,
and a step function with Dice and pixel-accuracy metrics. It is trained through the real
`hpcdl` command (a fresh interpreter each time), with docs/examples on PYTHONPATH as a
user would have it.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import fault_hook
from tests.conftest import REPO, run_hpcdl

EXAMPLES = REPO / "docs" / "examples"

# 100 images of 32x32: 80 train (10 steps of 8 per epoch), 10 val, 10 test.
NUM_IMAGES = 100
BATCH_SIZE = 8
NUM_TRAIN = 80


def user_env(extra_path: Path | None = None, fault: str | None = None) -> dict[str, str]:
    """mylab (and extra_path, for a test's own modules) importable by the command and its
    ranks; the fault hook armed with `fault`."""
    env = fault_hook.env(fault)
    paths = [str(EXAMPLES), *([str(extra_path)] if extra_path else []), env["PYTHONPATH"]]
    # Two ranks (and their DataLoader workers) share two cores: one thread each.
    return {**env, "PYTHONPATH": os.pathsep.join(paths), "OMP_NUM_THREADS": "1"}


def example(root: Path) -> list[str]:
    """The documented command's overrides (docs/your-code.md), sized for a test."""
    return [
        "model=custom",
        "model.target=mylab.models:TinyUNet",
        "model.kwargs.base=4",
        "data=custom",
        "data.target=mylab.data:build_datasets",
        f"data.kwargs.root={root}",
        "task=custom",
        "task.target=mylab.tasks:segmentation_step",
        "trainer.early_stopping.monitor=val_dice",
        "trainer.early_stopping.mode=max",
        f"trainer.batch_size={BATCH_SIZE}",
        "trainer.max_epochs=2",
        "trainer.checkpoint_every_steps=3",
    ]


@pytest.fixture(scope="module")
def cells(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic data set, written by the documented `python -m mylab.make_data`."""
    root = tmp_path_factory.mktemp("cells")
    out = subprocess.run(
        [sys.executable, "-m", "mylab.make_data", str(root), f"--num={NUM_IMAGES}", "--size=32"],
        capture_output=True,
        text=True,
        env={**os.environ, **user_env()},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert f"wrote {NUM_IMAGES} images of 32x32" in out.stdout
    return root


@pytest.fixture
def mylab(monkeypatch: pytest.MonkeyPatch):
    """The example package, imported in this process."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import mylab.data

    return mylab


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def metrics_rows(run_dir: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((run_dir / "metrics.csv").open()))


def without_timing(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [{k: v for k, v in r.items() if k not in ("seconds", "samples_per_s")} for r in rows]


# ----------------------------------------------------------------------------- the package
def test_the_dataset_reads_one_sample_at_a_time_and_flips_with_torchs_rng(mylab, cells) -> None:
    import numpy as np
    import torch

    splits = mylab.data.build_datasets(cells)
    assert {k: len(v) for k, v in splits.items()} == {"train": 80, "val": 10, "test": 10}
    train = splits["train"]
    images = np.load(cells / "images.npy")
    j = int(train.indices[5])
    assert np.array_equal(train.images[j], images[j])
    upright = torch.from_numpy(images[j].astype(np.float32) / 255).unsqueeze(0)
    torch.manual_seed(0)
    draws = [train[5]["image"] for _ in range(20)]
    assert all(torch.equal(d, upright) or torch.equal(d, upright.flip(-1)) for d in draws)
    assert len({torch.equal(d, upright) for d in draws}) == 2  # both orientations occur
    torch.manual_seed(7)
    first = train[5]["image"]
    torch.manual_seed(7)
    assert torch.equal(train[5]["image"], first)  # the flip is torch's RNG, so seedable


# ----------------------------------------------------------------------------- end to end
def test_the_example_trains_and_evaluate_prints_its_metrics(hpcdl, tmp_path, cells) -> None:
    run_dir = tmp_path / "run"
    out = hpcdl("train", f"run_dir={run_dir}", *example(cells), env=user_env())
    assert out.returncode == 0, out.stderr + out.stdout
    assert "val_dice" in out.stdout
    rows = metrics_rows(run_dir)
    assert list(rows[0])[:8] == [
        "epoch",
        "step",
        "train_loss",
        "train_dice",
        "train_pixel_accuracy",
        "val_loss",
        "val_dice",
        "val_pixel_accuracy",
    ]
    assert [int(r["step"]) for r in rows] == [10, 20]
    done = summary(run_dir)
    assert done["num_test_samples"] == 10
    assert 0 <= done["test_dice"] <= 1 and 0 <= done["test_pixel_accuracy"] <= 1
    assert done["peak_rss_mb"] > 0
    # mode=max: best.pt and best_metric follow the highest val_dice.
    dice = [float(r["val_dice"]) for r in rows]
    assert done["best_metric_name"] == "val_dice"
    assert done["best_metric"] == pytest.approx(max(dice))
    assert done["best_epoch"] == 1 + dice.index(max(dice))

    shown = hpcdl("evaluate", str(run_dir), "--checkpoint", "last", env=user_env())
    assert shown.returncode == 0, shown.stderr
    # The final weights: the same numbers as summary.json's test metrics.
    assert f"test_dice {done['test_dice']:.4f}" in shown.stdout
    assert f"test_pixel_accuracy {done['test_pixel_accuracy']:.4f}" in shown.stdout
    assert "(10 samples)" in shown.stdout


def test_imagefolder_trains_on_a_folder_of_pngs(hpcdl, tmp_path) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for label, (low, high) in {"dark": (0, 100), "light": (150, 255)}.items():
        folder = tmp_path / "pictures" / label
        folder.mkdir(parents=True)
        for i in range(12):
            pixels = rng.integers(low, high, size=(20, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}.png")
    out = hpcdl(
        "train",
        "run_dir=run",
        "data=imagefolder",
        "data.path=pictures",
        "data.crop_size=16",
        "data.random_flip=true",
        "model=cnn",
        "trainer.max_epochs=1",
        "trainer.batch_size=4",
    )
    assert out.returncode == 0, out.stderr + out.stdout
    done = summary(tmp_path / "run")
    assert done["epochs"] == 1 and done["num_test_samples"] > 0
    assert 0 <= done["test_accuracy"] <= 1
    shown = hpcdl("evaluate", "run")
    assert shown.returncode == 0, shown.stderr
    assert "dark" in shown.stdout and "light" in shown.stdout  # class names from the folders

    # New images of one of the classes: their labels are that class, by its folder's name
    # (numbered by the new folder alone, "light" would be class 0, the model's "dark").
    new = tmp_path / "new" / "light"
    new.mkdir(parents=True)
    for i in range(3):
        pixels = rng.integers(150, 255, size=(20, 16, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(new / f"{i}.png")
    rows = hpcdl("predict", "run", "--split", "all", "data.path=new")
    assert rows.returncode == 0, rows.stderr
    header, *lines = [line.split(",") for line in rows.stdout.splitlines()]
    assert len(lines) == 3 and {row[header.index("true")] for row in lines} == {"1"}
    # Each row's image, to join by: a split's relative to data.path, its label its folder's.
    test = list(csv.DictReader(hpcdl("predict", "run", "--split", "test").stdout.splitlines()))
    assert test and all(
        r["path"].split("/")[0] == ["dark", "light"][int(r["true"])] for r in test
    ), test
    assert all((tmp_path / "pictures" / r["path"]).is_file() for r in test)
    # Unlabelled images, in no class folder: --input, each row named by its file, with the
    # same numbers as the labelled copy read through --split.
    labelled = list(csv.DictReader(rows.stdout.splitlines()))
    flat = hpcdl("predict", "run", "--input", "new/light")
    assert flat.returncode == 0, flat.stderr
    unlabelled = list(csv.DictReader(flat.stdout.splitlines()))
    assert [r["path"] for r in unlabelled] == ["0.png", "1.png", "2.png"]
    assert [r["path"] for r in labelled] == ["light/0.png", "light/1.png", "light/2.png"]
    for a, b in zip(unlabelled, labelled, strict=True):
        assert (a["predicted"], a["class_name"]) == (b["predicted"], b["class_name"])
        assert abs(float(a["probability"]) - float(b["probability"])) < 1e-6
        assert "true" not in a
    from hpcdl.client import Job

    as_data = Job.from_run_dir(tmp_path / "run").predict(input=tmp_path / "new" / "light" / "2.png")
    assert [(r["row"], r["path"], r["class_name"]) for r in as_data] == [
        (0, "2.png", unlabelled[2]["class_name"])
    ]
    Image.fromarray(rng.integers(0, 255, size=(10, 10, 3), dtype=np.uint8)).save(
        tmp_path / "small.png"
    )  # the run center-crops 16x16: too small, named
    small = hpcdl("predict", "run", "--input", "small.png")
    assert small.returncode == 2 and small.stderr == (
        "error: --input 'small.png': small.png is 10x10 pixels; the run crops 16x16 "
        "(data.crop_size); give images at least that big first\n"
    ), small.stderr
    (tmp_path / "new" / "grey").mkdir()
    Image.fromarray(pixels).save(tmp_path / "new" / "grey" / "0.png")
    other = hpcdl("evaluate", "run", "data.path=new")
    assert other.returncode == 2 and "grey" in other.stderr and "dark, light" in other.stderr


# ----------------------------------------------------------------------------- predict
def train_in_process(run_dir: Path, cells: Path, extra: list[str], capsys) -> None:
    """Two steps of the example in this process (no DataLoader workers: nothing forked)."""
    from hpcdl.cli.main import main

    changes = ["trainer.max_steps=2", "data.num_workers=0", *extra]
    code = main(["train", f"run_dir={run_dir}", *replaced(example(cells), changes)])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()


def model_outputs(mylab, run_dir: Path, cells: Path, split: str) -> dict:
    """mylab.tasks.cell_fractions of the run's best checkpoint on a whole split, computed
    here with the user's own code."""
    import mylab.models
    import mylab.tasks
    import torch

    from hpcdl.checkpoint import read_checkpoint

    model = mylab.models.TinyUNet(base=4)
    model.load_state_dict(read_checkpoint(run_dir / "checkpoints" / "best.pt")["model"])
    model.eval()
    samples = mylab.data.build_datasets(cells)[split]
    batch = {k: torch.stack([samples[i][k] for i in range(len(samples))]) for k in samples[0]}
    with torch.no_grad():
        return {k: v.tolist() for k, v in mylab.tasks.cell_fractions(model, batch).items()}


def test_predict_writes_what_task_predict_returns(mylab, cells, tmp_path, capsys) -> None:
    from hpcdl.cli.main import main

    run_dir = tmp_path / "run"
    train_in_process(run_dir, cells, ["task.predict=mylab.tasks:cell_fractions"], capsys)
    code = main(["predict", str(run_dir), "--split", "test"])
    out = capsys.readouterr()
    assert code == 0, out.err
    rows = list(csv.DictReader(out.out.splitlines()))
    header = ["row", "cell_fraction", "mean_probability", "true_cell_fraction", "dice"]
    assert list(rows[0]) == header
    assert [int(r["row"]) for r in rows] == list(range(10))  # the 10 test images, in order
    for name, values in model_outputs(mylab, run_dir, cells, "test").items():
        assert [float(r[name]) for r in rows] == pytest.approx(values, rel=1e-5, abs=1e-6)


def test_predict_without_task_predict_says_how_to_add_it(mylab, cells, tmp_path, capsys) -> None:
    from hpcdl.cli.main import main

    run_dir = tmp_path / "run"
    train_in_process(run_dir, cells, [], capsys)
    stored = (run_dir / "config.yaml").read_text()
    code = main(["predict", str(run_dir), "--split", "test"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: task.predict is not set: {run_dir} was trained with task=custom")
    fix = f"hpcdl predict {run_dir} task.predict=package.module:function --split test"
    assert err.strip().endswith(fix), err
    # From Python, the advice is a call (before: the command, to a notebook's user).
    from hpcdl.client import Job
    from hpcdl.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        Job.from_run_dir(run_dir).predict(split="val")
    assert str(info.value).endswith(
        "e.g. job.predict(split='val', overrides=['task.predict=package.module:function'])"
    )
    # Rows from a file cannot go through images: that first, not advice that names --input.
    code = main(["predict", str(run_dir), "--input", str(tmp_path / "rows.csv")])
    err = capsys.readouterr().err
    assert code == 2 and "is not feature rows; predict on one of its splits with --split" in err
    # Named on the command line as the message says: the rows, and config.yaml unchanged.
    named = "task.predict=mylab.tasks:cell_fractions"
    code = main(["predict", str(run_dir), named, "--split", "test"])
    out = capsys.readouterr()
    assert code == 0, out.err
    rows = list(csv.DictReader(out.out.splitlines()))
    expected = model_outputs(mylab, run_dir, cells, "test")["dice"]
    assert [float(r["dice"]) for r in rows] == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert (run_dir / "config.yaml").read_text() == stored
    code = main(["predict", str(run_dir), "task.target=mylab.tasks:x", "--split", "test"])
    assert code == 2 and "hpcdl predict takes only data keys" in capsys.readouterr().err


def test_predict_that_raises_is_one_line_naming_task_predict(
    mylab, cells, tmp_path, capsys, monkeypatch
) -> None:
    # An LM's next_token(model, batch) written for (x, y) batches, run on dict batches.
    from hpcdl.cli.main import main

    (tmp_path / "otherpredict.py").write_text("def first_of(model, batch):\n    return batch[0]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    run_dir = tmp_path / "run"
    train_in_process(run_dir, cells, [], capsys)
    code = main(["predict", str(run_dir), "task.predict=otherpredict:first_of", "--split", "val"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: task.predict='otherpredict:first_of': raised KeyError: 0"), err


# ----------------------------------------------------------------------------- exact resume
@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, cells: Path) -> Path:
    """An uninterrupted run of the example on 2 ranks. (1 rank is left to
    tests/test_resume_exact.py's runs: the 2-rank case has all of its parts, plus the
    sampler's split and rank 1's kill, at half the CI time of both.)"""
    root = tmp_path_factory.mktemp("reference")
    run_dir = root / "ranks2"
    out = run_hpcdl(
        "train",
        f"run_dir={run_dir}",
        *example(cells),
        "cluster=local",
        "cluster.tasks_per_node=2",
        cwd=root,
        env=user_env(),
    )
    assert out.returncode == 0, out.stderr + out.stdout
    return run_dir


def newest_step(run_dir: Path) -> int:
    return max(int(p.stem.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*.pt"))


@pytest.mark.slow
def test_sigterm_then_sigkill_and_resume_is_exact(hpcdl, tmp_path, cells, reference) -> None:
    """SIGTERM mid-epoch 1 (checkpoint on the way out), then SIGKILL mid-epoch 2 (no
    handler: back to the last periodic checkpoint), then resume to the end: the same
    weights and metrics as the uninterrupted run, with the model, data and task of mylab
    and its DataLoader workers."""
    run_dir = tmp_path / "run"
    extra = ["cluster=local", "cluster.tasks_per_node=2"]
    first = hpcdl(
        "train",
        f"run_dir={run_dir}",
        *example(cells),
        *extra,
        fault_hook.OVERRIDE,
        env=user_env(fault="SIGTERM@4"),
    )
    assert first.returncode == 3, first.stderr + first.stdout
    assert 4 <= newest_step(run_dir) < 10  # mid-epoch 1

    kill = "SIGKILL@14:rank1"
    killed = hpcdl("resume", str(run_dir), env=user_env(fault=kill))
    assert killed.returncode not in (0, 3), killed.stderr + killed.stdout
    assert newest_step(run_dir) == 12  # every 3 steps: step 14's work is lost, 12 is kept

    final = hpcdl("resume", str(run_dir), env=user_env())
    assert final.returncode == 0, final.stderr + final.stdout
    assert "resumed from" in final.stdout
    assert summary(run_dir)["weights_sha256"] == summary(reference)["weights_sha256"]
    assert without_timing(metrics_rows(run_dir)) == without_timing(metrics_rows(reference))


LOGGED_DATASET = """
import os

from mylab.data import build_datasets


class ReadLog:
    '''A dataset that appends each index it reads to the file $MYLAB_READ_LOG.'''

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        with open(os.environ["MYLAB_READ_LOG"], "a") as log:
            log.write(f"{index}\\n")
        return self.dataset[index]


def build(root):
    splits = build_datasets(root)
    return {**splits, "train": ReadLog(splits["train"])}
"""


@pytest.mark.slow
@pytest.mark.parametrize("resumed_batch", [BATCH_SIZE, BATCH_SIZE // 2])
def test_a_resumed_epoch_reads_only_the_samples_not_yet_consumed(
    hpcdl, tmp_path, cells, resumed_batch
) -> None:
    # Also with a smaller batch on resume (as after running out of memory): the epoch goes
    # on at the same sample.
    (tmp_path / "readlog.py").write_text(LOGGED_DATASET)
    log = tmp_path / "reads.txt"
    overrides = [
        *example(cells),
        "data.target=readlog:build",
        "data.num_workers=0",  # reads in the training process, in order
        "trainer.max_epochs=1",
    ]
    env = {**user_env(tmp_path, "SIGTERM@4"), "MYLAB_READ_LOG": str(log)}
    first = hpcdl("train", "run_dir=run", *overrides, fault_hook.OVERRIDE, env=env)
    assert first.returncode == 3, first.stderr + first.stdout
    done = int(re.search(r"stopped by SIGTERM at global step (\d+)", first.stdout).group(1))
    assert 4 <= done < NUM_TRAIN // BATCH_SIZE
    before = [int(i) for i in log.read_text().split()]
    log.write_text("")

    smaller = [f"trainer.batch_size={resumed_batch}"] if resumed_batch != BATCH_SIZE else []
    env = {**user_env(tmp_path), "MYLAB_READ_LOG": str(log)}
    final = hpcdl("resume", "run", *smaller, env=env)
    assert final.returncode == 0, final.stderr + final.stdout
    after = [int(i) for i in log.read_text().split()]

    num_consumed = done * BATCH_SIZE
    consumed = before[-num_consumed:]  # the steps trained before the signal
    rest = after[len(after) - (NUM_TRAIN - num_consumed) :]
    assert sorted(consumed + rest) == list(range(NUM_TRAIN))  # every sample once in the epoch
    # Before those: only hpcdl's look at the first sample (its shape) and the last (that
    # __len__ holds), once per command, and in the first command the probe's one batch,
    # before the run dir existed.
    assert after[: len(after) - len(rest)] == [0, NUM_TRAIN - 1]
    assert len(before) - num_consumed == 2 + BATCH_SIZE + 2


# ----------------------------------------------------------------------------- bad input
BAD_CODE = """
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset


class Ragged(Dataset):
    '''Images whose size changes from sample to sample.'''

    def __len__(self):
        return 40

    def __getitem__(self, i):
        n = 8 + 2 * (i % 3)
        return {"image": torch.zeros(1, n, n), "mask": torch.zeros(1, n, n)}


def ragged(root):
    return Ragged(), Ragged()


class RawCounts(Dataset):
    '''Images as a uint16 memmap gives them, not converted to float.'''

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return {"image": torch.zeros(1, 8, 8, dtype=torch.uint16), "mask": torch.zeros(1, 8, 8)}


def raw_counts(root):
    return RawCounts(), RawCounts()


class Labels(Dataset):
    '''Three classes, but every label after the first is 3 or 4.'''

    classes = ["a", "b", "c"]

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.zeros(4), 0 if i == 0 else 3 + i % 2


def labels():
    return Labels(), Labels()


class LateLabel(Labels):
    '''One label out of range, far into the data.'''

    def __len__(self):
        return 200

    def __getitem__(self, i):
        return torch.zeros(4), 3 if i == 150 else i % 3


def late_label():
    return LateLabel(), LateLabel()


def missing(root):
    raise FileNotFoundError(f"{root}/images.npy: no such file")


def per_sample_loss(model, batch):
    logits = model(batch["image"])
    loss = F.binary_cross_entropy_with_logits(logits, batch["mask"], reduction="none")
    return loss.mean(dim=(1, 2, 3)), {}


def metrics_as_list(model, batch):
    logits = model(batch["image"])
    return F.binary_cross_entropy_with_logits(logits, batch["mask"]), [0.5]


def mean_over_batch(model, batch):
    return {"probability": torch.sigmoid(model(batch["image"])).mean()}


def first_of(model, batch):
    return batch[0]  # written for (x, y) batches: dict batches raise KeyError

class Exploding(torch.nn.Module):
    '''A model whose forward raises.'''

    def __init__(self, base=4):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 1, 3, padding=1)

    def forward(self, x):
        raise RuntimeError("the model failed on purpose")


def wrong_key(model, batch):
    return model(batch["pixels"]).mean(), {}


def nan_loss(model, batch):
    return (model(batch["image"]) * float("nan")).mean(), {}


def broken_collate(samples):
    raise ValueError("cannot pad")


def no_batch(samples):
    return None


def samples_second(samples):
    return {k: torch.stack([s[k] for s in samples], dim=1) for k in samples[0]}


class Nones(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return None


def nones(root):
    return Nones(), Nones()


class Unreadable(Nones):
    def __getitem__(self, i):  # the first sample reads, the batch's others do not
        if i > 0:
            raise OSError(f"sample {i}: input/output error")
        return {"image": torch.zeros(1, 32, 32), "mask": torch.zeros(1, 32, 32)}


def unreadable(root):
    return Unreadable(), Unreadable()


def needs_seed(root, split_seed, scale=1.0):
    return Nones(), Nones()
"""


def replaced(overrides: list[str], changes: list[str]) -> list[str]:
    """overrides with the keys that `changes` set replaced by them."""
    keys = {c.partition("=")[0] for c in changes}
    return [o for o in overrides if o.partition("=")[0] not in keys] + changes


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        (["data.target=badcode:ragged"], "data.target='badcode:ragged': samples of different"),
        (
            ["data.target=badcode:raw_counts"],
            "(the batch holds torch.uint16 tensors: a model's inputs must be floating point; "
            "convert them in data.target='badcode:raw_counts', e.g. ",
        ),
        (["task.target=badcode:per_sample_loss"], "task.target='badcode:per_sample_loss'"),
        (["task.target=badcode:metrics_as_list"], "task.target='badcode:metrics_as_list'"),
        (["trainer.early_stopping.monitor=val_nosuch"], "trainer.early_stopping.monitor"),
        (["trainer.early_stopping.monitor=val_Dice"], "'val_Dice': did you mean val_dice? task"),
        (["data.target=badcode:missing", "data.kwargs.root=/nowhere"], "data.target"),
        (["task.predict=badcode:mean_over_batch"], "task.predict='badcode:mean_over_batch'"),
        (["model.target=badcode:Exploding"], "model.target='badcode:Exploding': the first "),
        (["task.target=badcode:wrong_key"], "task.target='badcode:wrong_key': the first "),
        (["task.kwargs.pos_wieght=3"], "segmentation_step takes no task.kwargs.pos_wieght"),
        (["task.target=badcode:nan_loss"], "task.target='badcode:nan_loss': the loss of the"),
        (["data.collate_fn=badcode:broken_collate"], "data.collate_fn='badcode:broken_collate'"),
        (["data.collate_fn=badcode:no_batch"], "data.collate_fn='badcode:no_batch': returned None"),
        (["data.target=badcode:nones"], "data.target='badcode:nones': torch's default_collate"),
        (["data.collate_fn=badcode:samples_second"], "first tensor of shape (1, 2, 32, 32)"),
        (["task.predict=badcode:first_of"], "task.predict='badcode:first_of': raised KeyError"),
        (
            ["data.target=badcode:unreadable"],
            "data.target='badcode:unreadable': reading the first training batch failed: raised "
            "OSError: sample ",
        ),
        (["model.target=importfails:Net"], "model.target='importfails:Net': importing"),
        (["data.kwargs.rooot=/x"], "build_datasets takes no data.kwargs.rooot; its parameters: "
         "root, val_fraction, test_fraction, seed"),
        (["data.target=badcode:needs_seed"], "needs_seed needs data.kwargs.split_seed; set it "
         "(its parameters: root, split_seed, scale)"),
    ],
    ids=[
        "ragged-samples",
        "integer-inputs",
        "non-scalar-loss",
        "non-dict-metrics",
        "monitor",
        "monitor-typo",
        "data-target-raises",
        "predict-not-per-sample",
        "forward-raises",
        "step-raises",
        "task-kwargs-typo",
        "nan-loss",
        "collate-raises",
        "collate-returns-none",
        "sample-default-collate-cannot-batch",
        "collate-samples-not-first",
        "predict-raises",  # was the function's traceback from the probe, exit 1
        "dataset-raises",  # was the DataLoader's traceback from the probe, exit 1
        "module-raises-at-import",  # was the import's traceback, exit 1
        "data-kwargs-typo",  # was 'does not take data.kwargs={...}' and inspect's text
        "data-kwargs-missing",
    ],
)
def test_broken_user_code_is_one_line_and_no_run_dir(hpcdl, tmp_path, cells, changes, key) -> None:
    (tmp_path / "badcode.py").write_text(BAD_CODE)
    (tmp_path / "importfails.py").write_text("import math\n\nmath.sqrt(-1)\n")
    overrides = replaced(example(cells), changes)
    assert_refused(hpcdl("train", "run_dir=run", *overrides, env=user_env(tmp_path)), tmp_path, key)


TOKENS = """
import numpy as np
import torch


class Tokens(torch.utils.data.Dataset):
    \"\"\"Next-token pairs from a uint16 token stream, as np.memmap gives them.\"\"\"

    def __init__(self, n):
        self.ids = np.arange(n + 1, dtype=np.uint16) % 10

    def __len__(self):
        return len(self.ids) - 1

    def __getitem__(self, i):
        return torch.from_numpy(self.ids[i : i + 1]), torch.from_numpy(self.ids[i + 1 : i + 2])[0]


def tokens():
    return Tokens(64), Tokens(16)


class Words(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return "hello", i % 2


def words():
    return Words(), Words()


class FloatTokens(Tokens):
    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return x.float(), y  # uint16 labels, as a memmap of labels gives them


def float_tokens():
    return FloatTokens(64), FloatTokens(16)


class Bigram(torch.nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.embed = torch.nn.Embedding(10, num_classes)

    def forward(self, x):
        return self.embed(x)[:, 0]
"""


def test_uint16_class_labels_train(hpcdl, tmp_path) -> None:
    """Labels read from a uint16 memmap: the label range check raised torch's
    'aminmax_cpu not implemented for UInt16' (a traceback, exit 1); the task casts them."""
    (tmp_path / "lm.py").write_text(TOKENS)
    data = ["data=custom", "data.target=lm:float_tokens", "data.num_classes=10"]
    out = hpcdl(
        "train",
        "run_dir=run",
        *data,
        "data.num_workers=0",
        "trainer.max_epochs=1",
        env=user_env(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "run" / "summary.json").is_file()


@pytest.mark.parametrize(
    ("data", "hint"),
    [
        (
            "tokens",
            "(the batch holds torch.uint16 tensors: token ids and class labels must be "
            "torch.int64; cast them in data.target='lm:tokens'",
        ),
        (
            "words",
            "(the batch holds str values, not only tensors: make data.target='lm:words' "
            "return numbers or tensors, or set data.collate_fn",
        ),
    ],
)
def test_a_model_error_caused_by_the_samples_says_what_in_the_batch(hpcdl, tmp_path, data, hint):
    """uint16 token ids (from a memmap) or strings reach the model: its error was blamed on
    model.target alone; the line now says what in the batch caused it."""
    (tmp_path / "lm.py").write_text(TOKENS)
    overrides = [
        "model=custom",
        "model.target=lm:Bigram",
        "data=custom",
        f"data.target=lm:{data}",
        "data.num_classes=10",
        "data.num_workers=0",
    ]
    out = hpcdl("train", "run_dir=run", *overrides, env=user_env(tmp_path))
    assert_refused(out, tmp_path, "model.target='lm:Bigram': the first training batch failed")
    assert hint in out.stderr, out.stderr


def test_a_layer_sized_for_other_inputs_is_shown_the_batch_shapes() -> None:
    # getting-started's mymodels:Net on data=digits without data.as_images=false: torch's
    # "mat1 and mat2 shapes cannot be multiplied (256x8 and 64x64)" alone, no sample shape.
    import torch

    from hpcdl.cli.compose import compose_config
    from hpcdl.probe import batch_hint

    cfg = compose_config(["data=digits"])
    batch = (torch.zeros(32, 1, 8, 8), torch.zeros(32, dtype=torch.int64))
    error = RuntimeError("mat1 and mat2 shapes cannot be multiplied (256x8 and 64x64)")
    assert batch_hint(cfg, error, batch) == " (the batch's tensors have shapes [32, 1, 8, 8], [32])"
    assert batch_hint(cfg, RuntimeError("CUDA out of memory"), batch) == ""


MAPPED = """
import numpy as np
from torch.utils.data import Dataset


class Mapped(Dataset):
    classes = ["a", "b"]

    def __init__(self, path):
        self.x = np.load(path, mmap_mode="r")  # read-only pages of the file

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], i % 2


def build(path):
    return Mapped(path), Mapped(path)
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_memory_mapped_samples_train_without_torchs_not_writable_warning(
    hpcdl, tmp_path, workers
) -> None:
    # torch's default_collate copies them into the batch, yet warned that the array is not
    # writable ('... undefined behavior ...'), from the check before training and the job.
    (tmp_path / "mapped.py").write_text(MAPPED)
    np.save(tmp_path / "x.npy", np.random.default_rng(0).random((64, 4), dtype=np.float32))
    args = ["data=custom", "data.target=mapped:build", f"data.kwargs.path={tmp_path / 'x.npy'}"]
    args += [f"data.num_workers={workers}", "trainer.max_epochs=1"]
    out = hpcdl("train", "run_dir=run", *args, env=user_env(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "not writable" not in out.stderr + out.stdout


@pytest.mark.parametrize("hook", ["nosuch.mod:hook", "badcode:no_such_name"])
def test_a_step_hook_that_cannot_be_imported_is_one_line_and_no_run_dir(
    hpcdl, tmp_path, hook
) -> None:
    # It was found by the job, after the run dir was made: the same command, fixed, then
    # said 'already exists'.
    (tmp_path / "badcode.py").write_text(BAD_CODE)
    out = hpcdl("train", "run_dir=run", f"trainer.step_hooks=[{hook}]", env=user_env(tmp_path))
    assert_refused(out, tmp_path, f"trainer.step_hooks[0]={hook!r}")


def test_a_class_label_out_of_range_is_one_line_and_no_run_dir(hpcdl, tmp_path) -> None:
    (tmp_path / "badcode.py").write_text(BAD_CODE)
    out = hpcdl(
        "train", "run_dir=run", "data=custom", "data.target=badcode:labels", env=user_env(tmp_path)
    )
    assert_refused(out, tmp_path, "data.num_classes")
    assert "outside [0, 3)" in out.stderr


@pytest.mark.parametrize("workers", [0, 2])
def test_each_batchs_labels_are_checked_before_they_reach_the_device(
    hpcdl, tmp_path, workers
) -> None:
    # On a GPU, cross_entropy's check is a device-side assert that ends the process without
    # naming the label: the batch is checked on the host first (also when the probe's batch
    # happens to hold it, before the run dir exists).
    (tmp_path / "badcode.py").write_text(BAD_CODE)
    args = ["data=custom", "data.target=badcode:late_label", f"data.num_workers={workers}"]
    out = hpcdl("train", "run_dir=run", *args, env=user_env(tmp_path))
    assert out.returncode != 0
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: data.target='badcode:late_label': a batch holds label 3, outside [0, 3) "
        "classes; labels must be class indices (set data.num_classes if it is wrong)"
    ], out.stderr


def assert_refused(out: subprocess.CompletedProcess, cwd: Path, key: str) -> None:
    assert out.returncode == 2, out.stderr + out.stdout
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    assert key in lines[0], lines[0]
    assert not (cwd / "run").exists() and not (cwd / "outputs").exists()


SLOW_READS = """
import time
import torch


class SlowReads:
    '''64 samples, each read in 10 ms: an epoch of this data takes at least 0.64 s.'''

    classes = ["even", "odd"]

    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.full((4,), float(i % 2)), i % 2


def build():
    return SlowReads(), SlowReads()
"""


def test_an_epochs_time_counts_the_wait_for_its_data(hpcdl, tmp_path) -> None:
    # A data-bound run must look like one in metrics.csv (and the progress line): the
    # epoch's seconds used to count only the steps, from batch in hand to step done.
    (tmp_path / "slowreads.py").write_text(SLOW_READS)
    args = ["data=custom", "data.target=slowreads:build", "data.num_workers=0"]
    out = hpcdl("train", "run_dir=run", *args, "trainer.max_epochs=2", env=user_env(tmp_path))
    assert out.returncode == 0, out.stderr + out.stdout
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    # Epoch 2 reads its 64 training samples (its first batch may be read ahead, during
    # epoch 1's validation): at least 0.5 s, where its steps take a few milliseconds.
    assert float(rows[1]["seconds"]) >= 0.5, rows[1]


SHARDS = """
import torch


class Shards(torch.utils.data.Dataset):
    '''Samples from shards, its __len__ counting 5 more than they hold.'''

    def __init__(self, n):
        self.rows = [(torch.full((4,), float(i)), i % 2) for i in range(n)]

    def __len__(self):
        return len(self.rows) + 5

    def __getitem__(self, i):
        return self.rows[i]


class Tagged(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.zeros(4), i % 2


def too_long():
    return Shards(40), Shards(8)


def tuples():
    return Tagged(), Tagged()


def by_name(model, batch):
    return model(batch["x"]).sum(), {}


def pairs(samples):
    return torch.stack([s[0] for s in samples]), torch.tensor([s[1] for s in samples])
"""


def test_a_len_beyond_the_data_is_one_line_naming_the_split_and_index(hpcdl, tmp_path) -> None:
    """A __len__ 5 too large failed mid-epoch: a 70-line traceback from a DataLoader worker
    (IndexError), exit 1. Each split's last sample is read before training."""
    (tmp_path / "shards.py").write_text(SHARDS)
    data = ["data=custom", "data.target=shards:too_long", "data.num_classes=2"]
    out = hpcdl("train", "run_dir=run", *data, env=user_env(tmp_path))
    assert_refused(out, tmp_path, "data.target='shards:too_long': reading the train split's last")
    assert (
        "last sample (index 44; its __len__ is 45) failed: IndexError: list index out of range; "
        "is __len__ the number of samples __getitem__ can read?"
    ) in out.stderr


def test_a_step_reading_a_tuple_batch_by_name_is_told_what_made_it(hpcdl, tmp_path) -> None:
    (tmp_path / "shards.py").write_text(SHARDS)
    overrides = [
        "data=custom",
        "data.target=shards:tuples",
        "data.collate_fn=shards:pairs",
        "data.num_classes=2",
        "task=custom",
        "task.target=shards:by_name",
    ]
    out = hpcdl("train", "run_dir=run", *overrides, env=user_env(tmp_path))
    assert_refused(out, tmp_path, "task.target='shards:by_name': the first training batch failed")
    assert (
        "(the batch is a tuple of 2, not a dict: data.collate_fn='shards:pairs' made it; return "
        "a dict of name -> tensor from it, or index the batch by position)"
    ) in out.stderr, out.stderr
