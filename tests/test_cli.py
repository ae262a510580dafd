"""The command line as users run it: training, bad input, warm start, evaluate, predict."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import run_without_torch


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


FAST = ["trainer.max_epochs=2"]
TRAINED = ["trainer.max_epochs=10"]


def test_bad_input_exits_2_with_one_line_and_touches_nothing(hpcdl, tmp_path: Path) -> None:
    existing = tmp_path / "exp1"
    existing.mkdir()
    (existing / "notes.txt").write_text("keep me")
    cases = [
        (["model=nope"], "model=nope: unknown option"),
        (["trainer.max_epochs=abc"], "trainer.max_epochs"),
        (["trainer.batch_size=-1"], "trainer.batch_size=-1: must be > 0"),
        (["data=mnist", "data.path=/no/such/dir"], "data.path='/no/such/dir'"),
        ([f"run_dir={existing}"], "is a folder with other files in it, not an hpcdl run;"),
        (["init_from=/no/such/ckpt.pt"], "init_from"),
    ]
    for overrides, expected in cases:
        out = hpcdl("train", *overrides)
        assert out.returncode == 2, (overrides, out.stdout, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (overrides, out.stderr)
    assert (existing / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in existing.iterdir()) == ["notes.txt"]
    assert not (tmp_path / "outputs").exists()


def test_resume_and_evaluate_refuse_non_run_dirs(hpcdl, tmp_path: Path) -> None:
    for verb in ("resume", "evaluate"):
        out = hpcdl(verb, str(tmp_path))
        assert out.returncode == 2
        assert "not an hpcdl run dir" in out.stderr
        # A folder that is not there is said to be missing (helper B: 'no config.yaml').
        out = hpcdl(verb, "runs/nope")
        assert out.returncode == 2
        assert out.stderr == f"error: runs/nope: no such folder (from {tmp_path}); pass the run_dir of a run\n"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import run_hpcdl

    root = tmp_path_factory.mktemp("trained")
    out = run_hpcdl("train", "run_dir=run", *TRAINED, cwd=root)
    assert out.returncode == 0, out.stderr
    return root / "run"


def test_run_dir_contents(trained: Path) -> None:
    for name in (
        "config.yaml",
        "metrics.csv",
        "summary.json",
        "learning_curves.png",
        "confusion_matrix.png",
    ):
        assert (trained / name).is_file(), name
    rows = read_csv(trained / "metrics.csv")
    assert [int(r["epoch"]) for r in rows] == list(range(1, 11))
    assert {
        "train_loss",
        "train_accuracy",
        "val_loss",
        "val_accuracy",
        "lr",
        "seconds",
        "samples_per_s",
    } <= set(rows[0])
    summary = json.loads((trained / "summary.json").read_text())
    for key in (
        "test_accuracy",
        "best_metric",
        "best_epoch",
        "steps",
        "epochs",
        "world_size",
        "wall_s",
        "samples_per_s",
        "versions",
        "weights_sha256",
    ):
        assert key in summary, key
    assert summary["steps"] == 130 and summary["world_size"] == 1
    assert len(summary["weights_sha256"]) == 64
    assert (trained / "checkpoints" / "best.pt").is_file()


def test_evaluate_best_last_and_path(hpcdl, trained: Path) -> None:
    for which in ("best", "last"):
        out = hpcdl("evaluate", str(trained), "--checkpoint", which)
        assert out.returncode == 0, out.stderr
        assert "test_accuracy" in out.stdout and "confusion matrix" in out.stdout
    last = sorted((trained / "checkpoints").glob("step_*.pt"))[-1]
    out = hpcdl("evaluate", str(trained), "--checkpoint", str(last))
    assert out.returncode == 0, out.stderr
    report = json.loads((trained / "eval" / last.stem / "metrics.json").read_text())
    summary = json.loads((trained / "summary.json").read_text())
    assert report["test_accuracy"] == pytest.approx(summary["test_accuracy"])
    assert sum(map(sum, report["confusion_matrix"])) == report["num_test_samples"] == 85


def test_predict_applies_training_preprocessing(hpcdl, trained: Path, tmp_path: Path) -> None:
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    np.save(tmp_path / "rows.npy", x)
    out = hpcdl(
        "predict",
        str(trained),
        "--input",
        str(tmp_path / "rows.npy"),
        "--output",
        str(tmp_path / "p.csv"),
    )
    assert out.returncode == 0, out.stderr
    preds = [int(r["predicted"]) for r in read_csv(tmp_path / "p.csv")]
    assert len(preds) == len(y)
    # Raw, unstandardized rows: only right if the training standardization was applied.
    assert (np.array(preds) == y).mean() > 0.9
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    out = hpcdl("predict", str(trained), "--input", str(bad))
    assert out.returncode == 2 and "expects 30 features" in out.stderr


def test_predict_picks_a_csvs_columns_by_its_header(hpcdl, tmp_path: Path) -> None:
    """A run trained on a CSV with a header: the training CSV itself predicts (its label
    column, not named `label`, dropped by name), the same rows with their columns in another
    order predict the same, and a missing column is refused in one line naming it."""
    x = np.random.default_rng(0).normal(size=(60, 3))
    species = np.where(x[:, 0] > 2 * x[:, 2], "setosa", "virginica")
    cells = [f"{a:.4f},{b:.4f},{s},{c:.4f}" for (a, b, c), s in zip(x, species, strict=True)]
    (tmp_path / "train.csv").write_text("\n".join(["a,b,species,c", *cells]) + "\n")
    (tmp_path / "reordered.csv").write_text(
        "\n".join(["c,a,b", *(f"{c:.4f},{a:.4f},{b:.4f}" for a, b, c in x)]) + "\n"
    )
    (tmp_path / "no_b.csv").write_text("a,c\n1,2\n")
    data = ["data=files", "data.path=train.csv", "data.label_column=species"]
    out = hpcdl("train", "run_dir=run", *data, "trainer.max_epochs=2")
    assert out.returncode == 0, out.stderr
    own = hpcdl("predict", "run", "--input", "train.csv")
    assert own.returncode == 0, own.stderr
    assert len(own.stdout.splitlines()) == 61
    reordered = hpcdl("predict", "run", "--input", "reordered.csv")
    assert reordered.returncode == 0, reordered.stderr
    assert reordered.stdout == own.stdout
    out = hpcdl("predict", "run", "--input", "no_b.csv")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "--input 'no_b.csv': no column 'b' in its header (a, c)" in out.stderr


def test_predict_decides_a_csvs_first_row_by_the_training_names(hpcdl, tmp_path: Path) -> None:
    """The rows of a run trained on a CSV with a header, given without a header, with extra
    columns, and after a first row of text that names no training column: the first two
    predict as the training CSV does (the extra columns named in one warning line), the last
    is refused in one line (exit 2) naming the file, its line 1 and the columns expected,
    and --output is not written."""
    x = np.random.default_rng(0).normal(size=(40, 2))
    kind = np.where(x[:, 0] > x[:, 1], "up", "down")
    rows = [f"{a:.4f},{b:.4f}" for a, b in x]
    (tmp_path / "train.csv").write_text(
        "\n".join(["a,b,kind", *(f"{r},{k}" for r, k in zip(rows, kind, strict=True))]) + "\n"
    )
    (tmp_path / "plain.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "extra.csv").write_text(
        "\n".join(["id,a,b,kind,note", *(f"{i},{r},?,x" for i, r in enumerate(rows))]) + "\n"
    )
    (tmp_path / "garbage.csv").write_text("\n".join(["up,0.5", *rows]) + "\n")
    data = ["data=files", "data.path=train.csv", "data.label_column=kind"]
    out = hpcdl("train", "run_dir=run", *data, "trainer.max_epochs=2")
    assert out.returncode == 0, out.stderr
    own = hpcdl("predict", "run", "--input", "train.csv")
    assert own.returncode == 0 and own.stdout.startswith("row,predicted,"), own.stderr
    assert [line.split(",")[0] for line in own.stdout.splitlines()[1:]] == [
        str(i) for i in range(40)
    ]
    plain = hpcdl("predict", "run", "--input", "plain.csv")
    assert plain.returncode == 0 and plain.stdout == own.stdout, plain.stderr
    extra = hpcdl("predict", "run", "--input", "extra.csv")
    assert extra.returncode == 0 and extra.stdout == own.stdout, extra.stderr
    assert extra.stderr.splitlines() == [
        "warning: --input 'extra.csv': columns 'id', 'note' not used, the model takes a, b; "
        "predicting without them (an ID column goes into the output with --id-column id)"
    ]
    # --id-column: the input's IDs beside the same predictions, and no warning for them.
    ided = hpcdl("predict", "run", "--input", "extra.csv", "--id-column", "id")
    assert ided.returncode == 0, ided.stderr
    assert "'id'" not in ided.stderr and "'note'" in ided.stderr
    own_rows = [line.split(",") for line in own.stdout.splitlines()]
    assert [line.split(",") for line in ided.stdout.splitlines()] == [
        [r[0], "id" if n == 0 else str(n - 1), *r[1:]] for n, r in enumerate(own_rows)
    ]
    folder = hpcdl("predict", "run", "--input", "run")  # was "unknown file type ''"
    assert folder.returncode == 2 and folder.stderr == (
        "error: --input 'run': a folder; a folder of images is predicted by data=imagefolder "
        "runs, this one takes rows: a .csv, .npy or .npz file\n"
    ), folder.stderr
    wrong = hpcdl("predict", "run", "--input", "plain.csv", "--id-column", "id")
    assert wrong.returncode == 2 and wrong.stderr == (
        "error: --id-column id: not a column of 'plain.csv' (it has no header row)\n"
    ), wrong.stderr
    out = hpcdl("predict", "run", "--input", "garbage.csv", "--output", "preds.csv")
    assert out.returncode == 2 and out.stderr.splitlines() == [
        "error: --input 'garbage.csv': line 1 (up, 0.5) is neither a header naming the "
        "training columns (a, b) nor numbers ('up' in column 1 is not a number); start the "
        "file with a header row naming those columns, or give numbers only"
    ]
    assert not (tmp_path / "preds.csv").exists()


def test_init_from_warm_starts_and_refuses_mismatch(hpcdl, trained: Path, tmp_path: Path) -> None:
    warm = hpcdl("train", "run_dir=warm", f"init_from={trained}", "trainer.max_epochs=1")
    assert warm.returncode == 0, warm.stderr
    assert f"init_from: the weights of {trained}/checkpoints/best.pt, saved after " in warm.stdout
    cold = hpcdl("train", "run_dir=cold", "trainer.max_epochs=1")
    assert cold.returncode == 0, cold.stderr

    def first_loss(run: str) -> float:
        return float(read_csv(tmp_path / run / "metrics.csv")[0]["train_loss"])

    assert first_loss("warm") < first_loss("cold")
    out = hpcdl("train", "run_dir=mismatch", f"init_from={trained}", "model.hidden_sizes=[16,60]")
    assert out.returncode == 2
    assert "parameter 'net.0.weight'" in out.stderr or "has shape" in out.stderr
    assert "(30, 30)" in out.stderr and "(16, 30)" in out.stderr
    assert out.stderr.rstrip().endswith("; it was saved with (model.hidden_sizes=[30, 60])")
    # Another model altogether: named, not only its first missing parameter.
    out = hpcdl("train", "run_dir=cnn", f"init_from={trained}", "model=cnn", "data=digits")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "saved by a model=mlp run and this run builds model=cnn" in out.stderr
    assert not (tmp_path / "cnn").exists()
    out = hpcdl("evaluate", str(trained), "--checkpoint", str(tmp_path / "mismatch" / "nothing.pt"))
    assert out.returncode == 2


def test_corrupt_checkpoint_is_skipped_on_resume(hpcdl, tmp_path: Path) -> None:
    out = hpcdl("train", "run_dir=run", *FAST)
    assert out.returncode == 0
    ckpts = sorted((tmp_path / "run" / "checkpoints").glob("step_*.pt"))
    newest = ckpts[-1]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    out = hpcdl("resume", str(tmp_path / "run"))
    assert out.returncode == 0, out.stderr
    # Warned about the truncated file in one line, not as file:line + source line.
    assert f"warning: skipping checkpoint: {newest}: truncated" in out.stderr
    assert "CheckpointWarning" not in out.stderr, out.stderr
    assert f"resumed from {ckpts[-2]}" in out.stdout
    # Its newest valid checkpoint is the last epoch's: nothing left, and it says so.
    out = hpcdl("resume", str(tmp_path / "run"), "trainer.max_epochs=1")
    assert out.returncode == 0, out.stderr
    assert "the run has trained 2 epochs, trainer.max_epochs=1: nothing to train" in out.stdout


def test_cfg_and_info_flags_run_nothing(hpcdl, tmp_path: Path) -> None:
    out = hpcdl("train", "--cfg", "job", "model=cnn", "data=digits")
    assert out.returncode == 0 and "name: cnn" in out.stdout
    out = hpcdl("train", "--info")
    assert out.returncode == 0 and "config search path" in out.stdout
    out = hpcdl("train", "--help")
    assert out.returncode == 0 and "cluster: " in out.stdout
    assert not (tmp_path / "outputs").exists()


def test_cfg_prints_a_config_train_would_refuse_then_refuses_it(hpcdl, tmp_path: Path) -> None:
    out = hpcdl("train", "experiment=cancer_mlp", "optim=adam", "--cfg", "job")
    assert out.returncode == 2
    assert "name: adam" in out.stdout  # the composed config, printed first
    assert out.stderr.strip().splitlines() == [
        "error: optim.momentum, optim.nesterov: not keys of optim=adam; experiment=cancer_mlp "
        "sets them for its own optim choice: drop them with '~optim.momentum' '~optim.nesterov'"
    ]
    assert not (tmp_path / "outputs").exists()


def test_bad_data_found_inside_local_ranks_is_one_line_exit_2(hpcdl, tmp_path: Path) -> None:
    np.savez(tmp_path / "bad.npz", x=np.zeros((40, 3)), y=np.zeros(30))  # read by the ranks
    out = hpcdl(
        "train", "cluster=local", "data=files", f"data.path={tmp_path / 'bad.npz'}", "run_dir=run"
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"error: data.path='{tmp_path / 'bad.npz'}': 40 feature rows but 30 labels; give one "
        "label per row"
    ]


def test_an_array_file_that_is_none_is_refused_on_the_login_node(hpcdl, tmp_path: Path) -> None:
    """A Slurm submission read nothing of data.path but its existence: a job waited in the
    queue to find an .npz without its x array, or no .npz at all."""
    np.savez(tmp_path / "upper.npz", X=np.zeros(3), y=np.zeros(3))
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    slurm = ["train", "cluster=slurm", "data=files", "--dry-run", "--no-preflight"]
    out = hpcdl(*slurm, "data.path=upper.npz")
    assert out.returncode == 2 and out.stderr == (
        "error: data.path='upper.npz': no array 'x' (has ['X', 'y']); save with "
        "np.savez(path, x=features, y=labels)\n"
    )
    out = hpcdl(*slurm, "data.path=junk.npy", "data.labels_path=junk.npy")
    assert out.returncode == 2 and out.stderr == (
        "error: data.path: cannot read 'junk.npy' as .npy: not a NumPy file (neither .npy nor "
        "a zip of arrays); save it with np.save\n"
    )


def test_dict_keys_can_be_added_from_the_command_line(hpcdl) -> None:
    out = hpcdl(
        "train",
        "model=custom",
        "model.target=pkg.mod:build",
        "model.kwargs.depth=4",
        "cluster=local",
        "cluster.env.NCCL_DEBUG=INFO",
        "--cfg",
        "job",
    )
    assert out.returncode == 0, out.stderr
    assert "depth: 4" in out.stdout and "NCCL_DEBUG: INFO" in out.stdout


USER_MODELS = """
from torch import nn


class Net(nn.Module):
    # An existing model class: its own constructor, no input_shape or num_classes.
    def __init__(self, width=8, depth=2):
        super().__init__()
        hidden = [layer for _ in range(depth - 1) for layer in (nn.Linear(width, width), nn.ReLU())]
        self.net = nn.Sequential(nn.Linear(64, width), nn.ReLU(), *hidden, nn.Linear(width, 10))

    def forward(self, x):
        return self.net(x)


def broken(input_shape, num_classes):
    raise ValueError("no layer fits\\nsecond line")


def not_a_model(input_shape, num_classes):
    return [input_shape, num_classes]
"""
DIGITS_FLAT = ["data=digits", "data.as_images=false", "trainer.max_epochs=1"]


@pytest.fixture
def user_models(tmp_path: Path) -> dict[str, str]:
    """A module `mymod` in tmp_path, and the environment that makes it importable."""
    (tmp_path / "mymod.py").write_text(USER_MODELS)
    return {"PYTHONPATH": str(tmp_path)}


def test_existing_model_class_trains_unchanged(hpcdl, user_models, tmp_path: Path) -> None:
    from hpcdl.checkpoint import read_checkpoint

    out = hpcdl(
        "train",
        "model=custom",
        "model.target=mymod:Net",
        "model.kwargs.width=16",
        *DIGITS_FLAT,
        "run_dir=run",
        env=user_models,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "run" / "summary.json").is_file()
    weights = read_checkpoint(tmp_path / "run" / "checkpoints" / "best.pt")["model"]
    assert tuple(weights["net.0.weight"].shape) == (16, 64)  # model.kwargs.width reached Net


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["model.target=mymod:broken"],
            "error: model.target='mymod:broken': raised ValueError: no layer fits",
        ),
        (
            ["model.target=mymod:not_a_model"],
            "error: model.target='mymod:not_a_model': returned a list, not a torch.nn.Module",
        ),
        (
            ["model.target=mymod:Net", "model.kwargs.widht=16"],
            "error: model.target='mymod:Net': Net takes no model.kwargs.widht; "
            "its parameters: width, depth",
        ),
        (
            ["model.target=mymod:broken", "cluster=local", "cluster.tasks_per_node=2"],
            "error: model.target='mymod:broken': raised ValueError: no layer fits",
        ),
    ],
)
def test_broken_model_target_is_refused_before_the_run_dir(
    hpcdl, user_models, tmp_path: Path, overrides: list[str], expected: str
) -> None:
    out = hpcdl("train", "model=custom", *overrides, *DIGITS_FLAT, "run_dir=run", env=user_models)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip().splitlines() == [expected]
    assert "run dir" not in out.stdout
    assert not (tmp_path / "run").exists()


def test_resume_refuses_a_broken_model_override_before_saving_it(
    hpcdl, user_models, tmp_path: Path
) -> None:
    train = ["model=custom", "model.target=mymod:Net", *DIGITS_FLAT, "run_dir=run"]
    out = hpcdl("train", *train, env=user_models)
    assert out.returncode == 0, out.stderr
    run = tmp_path / "run"
    before = {name: (run / name).read_text() for name in ("config.yaml", "commands.log")}
    resume = ["model.target=mymod:broken", "trainer.max_epochs=2"]
    out = hpcdl("resume", str(run), *resume, env=user_models)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip().splitlines() == [
        "error: model.target='mymod:broken': raised ValueError: no layer fits"
    ]
    assert {name: (run / name).read_text() for name in before} == before


def test_resume_refuses_another_optimizer_before_saving_it(hpcdl, tmp_path: Path) -> None:
    """A run's checkpoints hold SGD's momentum buffers: Adam cannot continue from them (the
    job used to fail on its first step with KeyError: 'step'). Refused in one line,
    config.yaml as it was; the job refuses a hand-edited config.yaml too."""
    out = hpcdl("train", "run_dir=run", "trainer.max_epochs=1")
    assert out.returncode == 0, out.stderr
    run = tmp_path / "run"
    before = (run / "config.yaml").read_text()
    out = hpcdl("resume", "run", "optim=adam", "trainer.max_epochs=2")
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip().splitlines() == [
        f"error: optim=adam: {run}'s checkpoints hold optim=sgd state, which adam cannot "
        f"continue from; resume with optim=sgd, or start a new run from its weights: "
        f"hpcdl train init_from={run} optim=adam"
    ]
    assert (run / "config.yaml").read_text() == before
    edited = yaml.safe_load(before)  # optim switched by hand: the job refuses it
    edited["optim"] = {"name": "adam", "lr": 0.001}
    (run / "config.yaml").write_text(yaml.safe_dump(edited))
    out = hpcdl("resume", "run", "trainer.max_epochs=2")
    assert out.returncode != 0
    assert "holds sgd optimizer state, and this run's Adam keeps adam state" in out.stderr


def test_resume_with_another_lr_uses_it_and_another_model_is_one_line(
    hpcdl, tmp_path: Path
) -> None:
    """The config is what runs: optim.lr changed on resume takes effect from the next step
    (torch's load_state_dict would have restored the old lr). A model the checkpoint does
    not fit is one line naming the checkpoint and what to do."""
    out = hpcdl("train", "run_dir=run", "trainer.max_epochs=1")
    assert out.returncode == 0, out.stderr
    out = hpcdl("resume", "run", "optim.lr=0.003", "trainer.max_epochs=2")
    assert out.returncode == 0, out.stderr
    assert [row["lr"] for row in read_csv(tmp_path / "run" / "metrics.csv")] == ["0.01", "0.003"]
    config = (tmp_path / "run" / "config.yaml").read_text()
    out = hpcdl("resume", "run", "model.hidden_sizes=[10]", "trainer.max_epochs=3")
    assert out.returncode == 2
    error = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "does not fit this run's model" in error[0], out.stderr
    assert "resume with the model and data config it was saved with" in error[0]
    assert "(model.hidden_sizes=[30, 60])" in error[0]  # what it was saved with
    # Refused by the job: config.yaml stays as it was, and a plain resume works.
    assert (tmp_path / "run" / "config.yaml").read_text() == config
    assert "config.yaml: left as it was, without these overrides" in out.stdout
    assert hpcdl("resume", "run").returncode == 0


def test_resume_mid_epoch_with_another_batch_size_goes_on_at_the_same_sample(
    hpcdl, tmp_path: Path
) -> None:
    """A smaller batch after running out of memory: 5 steps of 32 are 10 of 16. Batches of 48
    cannot start at sample 160: one line, exit 2, the checkpoint kept for the next try."""
    out = hpcdl("train", "run_dir=run", "trainer.max_steps=5")
    assert out.returncode == 0, out.stderr
    assert "epoch 1/1: train_loss" in out.stdout  # the epochs max_steps reaches, not 30
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000000005.pt"
    saved = checkpoint.read_bytes()
    out = hpcdl("resume", "run", "trainer.batch_size=48", "trainer.max_steps=null")
    assert out.returncode == 2, out.stdout + out.stderr
    error = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert error == [
        f"error: {checkpoint} was saved 160 samples into epoch 1 with trainer.batch_size=32; "
        "batches of 48 cannot start there (samples would be skipped or repeated): resume "
        "with trainer.batch_size=32 or 40 or 80, and change it when the epoch is over "
        "(trainer.max_epochs=1, then resume again)"
    ], out.stderr
    assert checkpoint.read_bytes() == saved
    assert "batch_size: 32" in (tmp_path / "run" / "config.yaml").read_text()  # as it was
    out = hpcdl(
        "resume", "run", "trainer.batch_size=16", "trainer.max_steps=null", "trainer.max_epochs=1"
    )
    assert out.returncode == 0, out.stderr
    assert "epoch 1 goes on at the same sample, step 10 of the epoch" in out.stdout
    steps = json.loads((tmp_path / "run" / "summary.json").read_text())["steps"]
    assert steps == 5 + (25 - 10)  # 398 samples: 25 steps of 16, the first 10 done before


def test_slurm_profiles_leave_the_model_check_to_the_job(tmp_path: Path) -> None:
    # The login node never imports torch: a model=custom target is not even imported there.
    code = (
        "from hpcdl.cli.compose import compose_config\n"
        "from hpcdl.probe import probe_user_code\n"
        "cfg = compose_config(['cluster=slurm', 'model=custom', 'model.target=no_such_mod:m'])\n"
        "probe_user_code(cfg)\n"
        "print('no torch')\n"
    )
    out = run_without_torch(code, cwd=tmp_path)
    assert out.stdout == "no torch\n"


def test_version_names_hpcdl_and_python_without_importing_torch(tmp_path: Path) -> None:
    code = (
        "from hpcdl.cli.main import main\n"
        "try:\n"
        "    main(['--version'])\n"
        "except SystemExit as done:\n"
        "    assert done.code == 0\n"
    )
    out = run_without_torch(code, cwd=tmp_path)
    import platform

    import hpcdl

    assert out.stdout == f"hpcdl {hpcdl.__version__} (Python {platform.python_version()})\n"


def test_completion_script_is_bash_that_completes_group_options(hpcdl, tmp_path: Path) -> None:
    script = hpcdl("completion", "bash")
    assert script.returncode == 0, script.stderr
    assert 'eval "$(hpcdl completion bash)"' in script.stdout
    (tmp_path / "hpcdl.bash").write_text(script.stdout)
    syntax = subprocess.run(["bash", "-n", str(tmp_path / "hpcdl.bash")], capture_output=True)
    assert syntax.returncode == 0, syntax.stderr
    # What bash does on TAB after `hpcdl train model=` (`=` is a word break: the word is "").
    session = (
        f'hpcdl() {{ {sys.executable} -m hpcdl.cli.main "$@"; }}\n'
        'eval "$(hpcdl completion bash)"\n'
        'COMP_LINE="hpcdl train model="; COMP_POINT=${#COMP_LINE}\n'
        "COMP_WORDS=(hpcdl train model =); COMP_CWORD=3\n"
        '_hpcdl_complete hpcdl "" =\n'
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    out = subprocess.run(["bash", "-c", session], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert {"mlp", "cnn"} <= set(out.stdout.split()) and "model=mlp" not in out.stdout


def test_completion_candidates(tmp_path: Path) -> None:
    from hpcdl.cli.completion import candidates

    assert {"train", "sweep", "completion"} <= set(candidates("hpcdl "))
    assert candidates("hpcdl tr") == ["train"]
    assert candidates("hpcdl train model=c") == ["cnn", "custom"]
    assert "model=mlp" in candidates("hpcdl train model=", wordbreaks=" ")  # `=` no break
    assert candidates("hpcdl train -m model=mlp,c") == ["mlp,cnn", "mlp,custom"]
    assert candidates("hpcdl train tr") == ["trainer.", "trainer="]
    assert "trainer.max_epochs=" in candidates("hpcdl train trainer.max")
    assert "cluster.timeout_min=" in candidates("hpcdl resume runs/x cluster.")
    assert candidates("hpcdl train cluster.launcher=") == ["debug", "local", "slurm"]
    assert "--dry-run" in candidates("hpcdl train --d")
    assert candidates("hpcdl sweep s") == ["status", "summary"]
    assert candidates("hpcdl train --cfg ") == ["all", "job"]
    assert candidates("hpcdl train run_dir=") == []  # a path: bash completes file names
    assert candidates("hpcdl resume ") == []
    mine = tmp_path / "conf" / "model"
    mine.mkdir(parents=True)
    (mine / "tinynet.yaml").write_text("# hpcdl train -cd conf model=tinynet\nname: mlp\n")
    assert "tinynet" in candidates(f"hpcdl train --config-dir {tmp_path / 'conf'} model=")
    assert "tinynet" not in candidates("hpcdl train model=")


def test_train_into_a_closed_pipe_stops_quietly_and_resumes(tmp_path: Path) -> None:
    # `hpcdl train | head -1`: the reader goes away; no traceback; the run saves and stops
    # at its next step as on a hangup (exit 3, as cluster=local does; it ended at the write
    # with exit 141, recorded as failed, its steps since the last checkpoint lost), and
    # continues later.
    from hpcdl.rundir import RunDir
    from tests.conftest import run_hpcdl

    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpcdl.cli.main", "train", f"run_dir={run_dir}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # as `head -1` does once it has its line
    assert proc.wait(timeout=300) == 3
    assert "Traceback" not in proc.stderr.read()
    run = RunDir(run_dir)
    assert run.read_attempts()[-1]["reason"] == "interrupted"
    record = json.loads(run.checkpoint_record_file.read_text())
    assert record["checkpoint"] == run.newest_checkpoint().name  # saved at the stop
    out = run_hpcdl("resume", str(run_dir), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (run_dir / "summary.json").exists()


def test_resume_refuses_another_split_before_saving_it(hpcdl, tmp_path: Path) -> None:
    """Continued on another split, rows the checkpoints were trained on would be validation
    and test rows (its test_accuracy silently measured on training rows): refused in one
    line naming the old and new values, config.yaml and checkpoints as they were. Keys that
    only say how the data is read still change."""
    out = hpcdl("train", "run_dir=run", "trainer.max_epochs=1")
    assert out.returncode == 0, out.stderr
    run = tmp_path / "run"
    before = {p: p.read_bytes() for p in [run / "config.yaml", *run.glob("checkpoints/*")]}
    out = hpcdl("resume", "run", "data.split_seed=3", "trainer.max_epochs=2")
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip().splitlines() == [
        f"error: data.split_seed=3: {run}'s checkpoints were trained on the training rows of "
        "data.split_seed=0, some of which would be validation and test rows with "
        "data.split_seed=3; resume with data.split_seed=0, or start a new run: the command "
        f"that made this one ({run / 'commands.log'}) with data.split_seed=3 (init_from={run} "
        "for its weights only)"
    ]
    for overrides, named in [
        (["data.val_fraction=0.3", "data.fold=0"], "data.val_fraction=0.3: "),
        (["data.num_folds=5", "data.fold=1"], "data.num_folds=5 data.fold=1: "),
        (["data.standardize=false"], "with data.standardize=true, unlike data.standardize"),
        (["data=digits"], "trained on data=breast_cancer, another dataset; resume with"),
    ]:
        out = hpcdl("resume", "run", *overrides)
        assert out.returncode == 2, out.stdout + out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and named in lines[0], (overrides, lines)
    assert {p: p.read_bytes() for p in before} == before
    assert "resume" not in (run / "commands.log").read_text()
    # The job's warning names what changed.
    out = hpcdl("resume", "run", "data.num_workers=0", "data.in_memory=false", *FAST)
    assert out.returncode == 0, out.stderr
    assert (
        "step_000000013.pt: data.in_memory true -> false, data.num_workers 2 -> 0 changed "
        "since this checkpoint was saved\n" in out.stdout
    )


def test_resume_of_an_early_stopped_run_trains_on_only_with_other_early_stopping(
    hpcdl, tmp_path: Path
) -> None:
    """More epochs alone cannot undo an early stop: one line says why the run stopped and
    which override trains on. patience=0 (off) trains on from the checkpoint."""
    stop_at_2 = ["trainer.early_stopping.patience=1", "trainer.early_stopping.min_delta=100"]
    out = hpcdl("train", "run_dir=run", "trainer.max_epochs=30", *stop_at_2)
    assert out.returncode == 0, out.stderr
    run = tmp_path / "run"
    assert len(read_csv(run / "metrics.csv")) == 2
    best = float(read_csv(run / "metrics.csv")[0]["val_loss"])
    assert (  # the run says why it ended before trainer.max_epochs
        f"stopping early after epoch 2: val_loss did not improve on epoch 1's {best:.4g} in 1 "
        "evaluation, trainer.early_stopping.patience=1; best.pt holds epoch 1" in out.stdout
    ), out.stdout
    out = hpcdl("resume", "run", "trainer.max_epochs=50")
    assert out.returncode == 0, out.stderr
    assert (
        f"step_000000026.pt: the run stopped early after epoch 2 (val_loss did not improve on "
        f"epoch 1's {best:.4g} in 1 evaluation, trainer.early_stopping.patience=1): nothing "
        "to train; to train on, resume with trainer.early_stopping.patience=0 (off) or a "
        "larger patience\n" in out.stdout
    ), out.stdout
    assert len(read_csv(run / "metrics.csv")) == 2
    out = hpcdl("resume", "run", "trainer.max_epochs=4", "trainer.early_stopping.patience=0")
    assert out.returncode == 0, out.stderr
    assert (
        "step_000000026.pt: stopped early after epoch 2; trainer.early_stopping changed "
        "(patience 1 -> 0): training goes on\n" in out.stdout
    ), out.stdout
    assert [row["epoch"] for row in read_csv(run / "metrics.csv")] == ["1", "2", "3", "4"]
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["epochs"], summary["early_stopped"]) == (4, False)


def test_resume_with_another_cpu_thread_count_warns_that_results_differ(
    hpcdl, tmp_path: Path
) -> None:
    """A CPU op's sums are split over its threads: resumed with another count (a Slurm run
    with OMP_NUM_THREADS=1 continued on cluster=local), the weights differ from an
    uninterrupted run's, as with another rank count; the same count says nothing."""
    out = hpcdl("train", "run_dir=run", "trainer.max_epochs=1", env={"OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    out = hpcdl("resume", "run", *FAST, env={"OMP_NUM_THREADS": "2"})
    assert out.returncode == 0, out.stderr
    assert (
        "step_000000013.pt: saved with 1 CPU thread per rank, resumed with 2: sums run in "
        "another order, so results will differ from those of 1 thread throughout (set "
        "OMP_NUM_THREADS=1 to match)\n" in out.stdout
    ), out.stdout
    out = hpcdl("resume", "run", "trainer.max_epochs=3", env={"OMP_NUM_THREADS": "2"})
    assert out.returncode == 0, out.stderr
    assert "CPU threads" not in out.stdout

    # Matching it with more ranks than CPUs / threads oversubscribes the CPUs: said so.
    cpus = len(os.sched_getaffinity(0))
    out = hpcdl(
        "train", "run_dir=wide", "trainer.max_epochs=1", env={"OMP_NUM_THREADS": str(cpus)}
    )
    assert out.returncode == 0, out.stderr
    out = hpcdl("resume", "wide", *FAST, "cluster=local", "cluster.tasks_per_node=2")
    assert out.returncode == 0, out.stderr
    assert (
        f"step_000000013.pt: saved with {cpus} CPU thread{'s' * (cpus != 1)} per rank, "
        f"resumed with {max(1, cpus // 2)}: sums run in another order, so results will "
        f"differ from those of {cpus} thread{'s' * (cpus != 1)} throughout (set "
        f"OMP_NUM_THREADS={cpus} to match, which puts "
        f"{2 * cpus} threads on {cpus} CPUs: slower)\n" in out.stdout
    ), out.stdout


def test_a_typo_in_a_profile_of_ones_own_names_the_file(hpcdl, tmp_path: Path) -> None:
    """As a user meets it: one line naming the file and the key, exit status 2, nothing
    created, for train, train -m and a --config-dir that is not there."""
    profile = tmp_path / "myconf" / "cluster" / "mycluster.yaml"
    profile.parent.mkdir(parents=True)
    profile.write_text(
        "# hpcdl train --config-dir myconf cluster=mycluster\n"
        "name: mycluster\nlauncher: slurm\ngpus_per_nod: 4\n"
    )
    typo = (
        "myconf/cluster/mycluster.yaml: cluster.gpus_per_nod: unknown key; "
        "did you mean cluster.gpus_per_node?"
    )
    cases = [
        (["--config-dir", "myconf", "cluster=mycluster", "--dry-run"], f"error: {typo}"),
        (
            ["-m", "--config-dir", "myconf", "cluster=local,mycluster", "--dry-run"],
            f"error: trial 1 (cluster=mycluster): {typo}",
        ),
        (["-cd", "myconf", "cluster=mycluster"], f"error: {typo}"),
        (
            ["--config-dir", "nodir", "cluster=local"],
            f"error: --config-dir {tmp_path / 'nodir'}: no such folder; give the folder",
        ),
    ]
    for args, expected in cases:
        out = hpcdl("train", *args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(expected), (args, out.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["myconf"]


def test_a_model_whose_code_changed_shape_is_named_as_a_code_change(
    hpcdl, tmp_path: Path
) -> None:
    """The same config building another model (the user's module edited, e.g. taken up by
    --fresh-code): the refusal names the code, not a config to resume with or an init_from
    that needs the same shapes too."""
    net = "from torch import nn\ndef build(input_shape, num_classes):\n    return {}\n"
    (tmp_path / "edited_net.py").write_text(net.format("nn.Linear(input_shape[0], num_classes)"))
    env = {"PYTHONPATH": str(tmp_path)}
    train = ["run_dir=run", "model=custom", "model.target=edited_net:build"]
    out = hpcdl("train", *train, "trainer.max_epochs=1", env=env)
    assert out.returncode == 0, out.stderr
    (tmp_path / "edited_net.py").write_text(net.format(
        "nn.Sequential(nn.Linear(input_shape[0], 8), nn.Linear(8, num_classes))"))  # fmt: skip
    out = hpcdl("resume", "run", "trainer.max_epochs=2", env=env)
    assert out.returncode == 2
    error = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1, out.stderr
    assert (
        "built from the config it was saved with: your model's or data's code changed "
        "since; resume with the code it was saved by" in error[0]
    ), error
    assert "init_from" not in error[0]
