"""Tasks: classification, regression and custom steps; metrics as sample-weighted sums."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from hpcdl.config.schema import RegressionLoss
from hpcdl.errors import ConfigError, DataError
from hpcdl.tasks import ClassificationTask, CustomTask, RegressionTask, check_monitor


def test_regression_metrics_are_exact_over_batches() -> None:
    rng = np.random.default_rng(0)
    y = torch.tensor(rng.normal(50.0, 10.0, size=37), dtype=torch.float32)
    x = y + torch.tensor(rng.normal(0.0, 3.0, size=37), dtype=torch.float32)
    task = RegressionTask(RegressionLoss.mse, mean=50.0, std=10.0)
    model = lambda batch: (batch - 50.0) / 10.0  # noqa: E731 (predicts x exactly)
    sums: dict[str, float] = {}
    for part in (slice(0, 10), slice(10, 30), slice(30, 37)):  # uneven batches
        out = task.batch_stats(model, (x[part], y[part]))  # type: ignore[arg-type]
        for name in task.stat_names:
            sums[name] = sums.get(name, 0.0) + float(out.stats[name])
    metrics = task.metrics(sums, 37)
    err = (x - y).double().numpy()
    truth = y.double().numpy()
    assert metrics["mae"] == pytest.approx(np.abs(err).mean(), rel=1e-6)
    assert metrics["rmse"] == pytest.approx(math.sqrt((err**2).mean()), rel=1e-6)
    r2 = 1 - (err**2).sum() / ((truth - truth.mean()) ** 2).sum()
    assert metrics["r2"] == pytest.approx(r2, rel=1e-6)


def test_regression_loss_is_on_the_standardized_scale() -> None:
    task = RegressionTask(RegressionLoss.l1, mean=100.0, std=20.0)
    out = task.batch_stats(
        lambda b: torch.zeros(2, 1), (torch.zeros(2, 3), torch.tensor([120.0, 60.0]))
    )  # type: ignore[arg-type]
    assert float(out.loss_sum) == pytest.approx(1.0 + 2.0)  # |0 - 1| + |0 - (-2)|
    assert out.outputs is not None and out.outputs.tolist() == [100.0, 100.0]
    with pytest.raises(ConfigError, match="one value per sample"):
        task.batch_stats(lambda b: torch.zeros(2, 3), (torch.zeros(2, 3), torch.zeros(2)))  # type: ignore[arg-type]


def test_classification_refuses_labels_out_of_range_in_one_line() -> None:
    model = nn.Linear(3, 2)
    with pytest.raises(DataError, match=r"outside \[0, 2\)"):
        ClassificationTask().batch_stats(model, (torch.zeros(4, 3), torch.tensor([0, 1, 2, 1])))
    with pytest.raises(DataError, match="'x'/'y' keys"):
        ClassificationTask().batch_stats(model, [torch.zeros(4, 3)])


def custom(fn):
    return CustomTask("mylab.tasks:step", fn)


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (lambda m, b: torch.tensor(1.0), "return \\(loss, \\{metric: value\\}\\)"),
        (lambda m, b: (torch.ones(3), {}), "not a scalar tensor"),
        (lambda m, b: (torch.tensor(1.0), [0.5]), "not a dict"),
        (lambda m, b: (torch.tensor(1.0), {"loss": 1.0}), "may not be called 'loss'"),
        (lambda m, b: (torch.tensor(1.0), {"dice": "high"}), "metric 'dice' is 'high'"),
        (lambda m, b: (torch.tensor(1.0), {"dice": torch.ones(2)}), "metric 'dice' has shape"),
    ],
)
def test_custom_task_bad_returns_are_one_line_errors(returned, message) -> None:
    batch = (torch.zeros(4, 3), torch.zeros(4))
    with pytest.raises(ConfigError, match=message) as err:
        custom(returned).batch_stats(nn.Identity(), batch)
    assert "task.target='mylab.tasks:step'" in str(err.value) and "\n" not in str(err.value)


def test_custom_task_metrics_are_weighted_by_samples_and_names_are_fixed() -> None:
    task = custom(lambda m, b: (b[1].float().mean(), {"label_mean": b[1].float().mean()}))
    sums = {"label_mean": 0.0}
    total = 0
    for labels in ([1, 1, 1], [0]):  # batch means 1 and 0; the sample mean is 3/4
        out = task.batch_stats(nn.Identity(), (torch.zeros(len(labels), 2), torch.tensor(labels)))
        sums["label_mean"] += float(out.stats["label_mean"])
        total += out.num_samples
    assert task.metrics(sums, total) == {"label_mean": 0.75}
    renamed = lambda m, b: (torch.tensor(1.0), {"other": 1.0})  # noqa: E731
    task.fn = renamed
    with pytest.raises(ConfigError, match="same metric names"):
        task.batch_stats(nn.Identity(), (torch.zeros(1, 2), torch.zeros(1)))
    with pytest.raises(ConfigError, match="val_label_mean"):
        check_monitor("val_dice", task)
    check_monitor("train_label_mean", task)


def write_houses(path: Path, n: int = 300) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, 4))
    price = 200_000 + 40_000 * x[:, 0] - 10_000 * x[:, 2] + 5_000 * rng.normal(size=n)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["rooms", "age", "dist", "noise", "price"])
        for row, p in zip(x, price, strict=True):
            writer.writerow([*(f"{v:.5f}" for v in row), f"{p:.2f}"])


def test_regression_end_to_end(hpcdl, tmp_path: Path) -> None:
    write_houses(tmp_path / "houses.csv")
    out = hpcdl(
        "train",
        "task=regression",
        "data=files",
        "data.path=houses.csv",
        "data.label_column=price",
        "model.dropout=0.0",
        "trainer.max_epochs=20",
        "trainer.early_stopping.monitor=val_rmse",
        "run_dir=run",
    )
    assert out.returncode == 0, out.stderr
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["test_r2"] > 0.8 and 0 < summary["test_mae"] < 20_000
    assert summary["peak_rss_mb"] > 0
    assert (run / "predicted_vs_true.png").exists() and not (run / "confusion_matrix.png").exists()
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header[:7] == [
        "epoch",
        "step",
        "train_loss",
        "train_mae",
        "train_rmse",
        "train_r2",
        "val_loss",
    ]
    evaluated = hpcdl("evaluate", "run")
    assert evaluated.returncode == 0 and "test_rmse" in evaluated.stdout
    assert (run / "eval" / "best" / "predicted_vs_true.png").exists()
    predicted = hpcdl("predict", "run", "--split", "test")
    rows = list(csv.reader(predicted.stdout.splitlines()))
    assert rows[0] == ["row", "predicted", "true"] and len(rows) == 1 + 45
    errors = [abs(float(p) - float(t)) for _, p, t in rows[1:]]
    assert sum(errors) / len(errors) < 20_000  # in dollars: the target's own units


def test_regression_needs_numeric_targets(hpcdl, tmp_path: Path) -> None:
    out = hpcdl("train", "task=regression", "data=digits", "run_dir=run")
    assert out.returncode == 2 and "task=regression: data=digits holds class labels" in out.stderr
    assert not (tmp_path / "run").exists()  # refused by the config check, before anything
    (tmp_path / "t.csv").write_text("a,price\n1,cheap\n2,dear\n3,cheap\n4,dear\n")
    out = hpcdl(
        "train",
        "task=regression",
        "data=files",
        "data.path=t.csv",
        "data.label_column=price",
        "run_dir=run",
    )
    assert out.returncode == 2 and "task=regression needs numeric labels" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_custom_metric_is_the_sample_mean_across_ranks_and_short_batches(hpcdl, tmp_path) -> None:
    """A metric that is the batch's mean label must come out as the epoch's mean label: 2
    ranks, 399 training rows in batches of 32 (a short last batch of 15)."""
    from hpcdl.cli.compose import compose_config
    from hpcdl.data import build_data

    (tmp_path / "steps.py").write_text(
        "import torch.nn.functional as F\n"
        "def step(model, batch):\n"
        "    x, y = batch\n"
        "    return F.cross_entropy(model(x), y), {'label_mean': y.float().mean()}\n"
    )
    out = hpcdl(
        "train",
        "task=custom",
        "task.target=steps:step",
        "cluster=local",
        "cluster.tasks_per_node=2",
        "trainer.max_epochs=1",
        "run_dir=run",
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr + out.stdout
    row = next(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    data = build_data(compose_config([]).data)
    assert float(row["train_label_mean"]) == pytest.approx(
        data.y_train.double().mean().item(), abs=1e-9
    )
    assert float(row["val_label_mean"]) == pytest.approx(
        data.y_val.double().mean().item(), abs=1e-9
    )
