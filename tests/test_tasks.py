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
from hpcdl.tasks import (
    ClassificationTask,
    CustomPrediction,
    CustomTask,
    RegressionTask,
    check_monitor,
)


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
    metrics = task.metrics(sums, 37, 0.0)
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


def test_a_classifier_with_other_than_one_output_per_class_is_one_line() -> None:
    # Before: 5 outputs for 2 classes trained, then the evaluation failed with a traceback
    # ("preds holds a class outside [0, 2)"); 1 output failed as "a label is outside".
    batch = (torch.zeros(4, 3), torch.tensor([0, 1, 1, 0]))
    for width in (5, 1):
        with pytest.raises(ConfigError) as info:
            ClassificationTask(num_classes=2).batch_stats(nn.Linear(3, width), batch)
        assert str(info.value) == (
            f"task=classification: the model gives {width} outputs per sample for data with 2 "
            "classes; make its last layer 2 wide (a custom model gets num_classes=2), or set "
            "data.num_classes if that count is wrong"
        )
    ClassificationTask(num_classes=2).batch_stats(nn.Linear(3, 2), batch)


def custom(fn):
    return CustomTask("mylab.tasks:step", fn)


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (lambda m, b: torch.tensor(1.0), "return \\(loss, \\{metric: value\\}\\)"),
        (lambda m, b: (torch.ones(3), {}), r"not a scalar tensor; .*e\.g\. loss\.mean\(\)$"),
        # With a count, mean() of an unreduced per-token loss would count the padding too.
        (lambda m, b: (torch.ones(3), {}, 2), r"e\.g\. loss\.sum\(\) / count$"),
        (lambda m, b: (torch.tensor(1.0), [0.5]), "not a dict"),
        (lambda m, b: (torch.tensor(1.0), {"loss": 1.0}), "may not be called 'loss'"),
        (lambda m, b: (torch.tensor(1.0), {"dice": "high"}), "metric 'dice' is 'high'"),
        (lambda m, b: (torch.tensor(1.0), {"dice": torch.ones(2)}), "metric 'dice' has shape"),
        (lambda m, b: (torch.tensor(1.0), {}, torch.ones(4)), "the loss's count has shape"),
        (lambda m, b: (torch.tensor(1.0), {}, "many"), "the loss's count is 'many'"),
        (lambda m, b: (torch.tensor(1.0), {}, -3), "the loss's count is -3; return how many"),
        (lambda m, b: (torch.tensor(1.0), {}, 1, 2), r"or \(loss, \{metric: value\}, count\)"),
    ],
)
def test_custom_task_bad_returns_are_one_line_errors(returned, message) -> None:
    batch = (torch.zeros(4, 3), torch.zeros(4))
    with pytest.raises(ConfigError, match=message) as err:
        custom(returned).batch_stats(nn.Identity(), batch)
    assert "task.target='mylab.tasks:step'" in str(err.value) and "\n" not in str(err.value)


def test_custom_task_metrics_may_be_numpy_numbers() -> None:
    # Before: "metric 'acc' is np.float32(0.5); return a number or scalar tensor".
    values = {"acc": np.float32(0.5), "hits": np.int64(3), "auc": np.array(0.25)}
    task = custom(lambda m, b: (torch.tensor(1.0), values))
    out = task.batch_stats(nn.Identity(), (torch.zeros(4, 3), torch.zeros(4)))
    assert {k: float(v) for k, v in out.stats.items()} == {"acc": 2.0, "hits": 12.0, "auc": 1.0}
    for bad in (np.bool_(True), np.array([0.5, 0.5]), np.str_("high")):
        with pytest.raises(ConfigError, match="metric 'acc' is"):
            custom(lambda m, b, v=bad: (torch.tensor(1.0), {"acc": v})).batch_stats(
                nn.Identity(), (torch.zeros(4, 3), torch.zeros(4))
            )


def test_custom_task_metrics_are_weighted_by_samples_and_names_are_fixed() -> None:
    task = custom(lambda m, b: (b[1].float().mean(), {"label_mean": b[1].float().mean()}))
    sums = {"label_mean": 0.0}
    total = 0
    for labels in ([1, 1, 1], [0]):  # batch means 1 and 0; the sample mean is 3/4
        out = task.batch_stats(nn.Identity(), (torch.zeros(len(labels), 2), torch.tensor(labels)))
        sums["label_mean"] += float(out.stats["label_mean"])
        total += out.num_samples
    assert task.metrics(sums, total, 0.5) == {"label_mean": 0.75}
    renamed = lambda m, b: (torch.tensor(1.0), {"other": 1.0})  # noqa: E731
    task.fn = renamed
    with pytest.raises(ConfigError, match="same metric names"):
        task.batch_stats(nn.Identity(), (torch.zeros(1, 2), torch.zeros(1)))
    with pytest.raises(ConfigError, match="val_label_mean"):
        check_monitor("val_dice", task)
    check_monitor("train_label_mean", task)


def test_a_custom_loss_with_its_count_is_averaged_over_the_counts_across_batches() -> None:
    """A per-token mean loss with its token count: the split's loss is the mean over its
    tokens (batches of 1 and 3 tokens: (1*4 + 3*2) / 4), its metrics stay sample means."""
    from hpcdl.evaluation import evaluate

    def step(model, batch):
        x, tokens = batch
        return x.mean() * 0 + x[0, 0], {"first": float(x[0, 0])}, tokens.sum()

    batches = [
        (torch.full((2, 1), 4.0), torch.tensor([1, 0])),
        (torch.full((1, 1), 2.0), torch.tensor([3])),
    ]
    result = evaluate(nn.Identity(), batches, custom(step), 0, torch.device("cpu"))
    assert result.loss == pytest.approx(10 / 4)
    assert result.metrics == {"first": pytest.approx((4 * 2 + 2) / 3)}
    assert result.num_samples == 3
    task = custom(step)
    task.batch_stats(nn.Identity(), batches[0])
    task.fn = lambda m, b: (torch.tensor(1.0), {"first": 1.0})
    with pytest.raises(ConfigError, match="returned no count after batches with one"):
        task.batch_stats(nn.Identity(), batches[1])


def test_a_checkpoint_saved_before_counts_reads_its_samples_as_the_loss_count() -> None:
    from hpcdl.state import Progress

    old = Progress.from_dict({"epoch": 1, "epoch_loss_sum": 6.0, "epoch_count": 3.0})
    assert old.epoch_loss_count == 3.0  # a mid-epoch resume logs the same train_loss
    assert Progress.from_dict(Progress(epoch_count=3.0, epoch_loss_count=40.0).to_dict()) == (
        Progress(epoch_count=3.0, epoch_loss_count=40.0)
    )


def test_custom_task_derived_metrics_come_from_the_means_and_bad_ones_are_one_line() -> None:
    step = lambda m, b: (torch.tensor(2.0), {"acc": 0.5})  # noqa: E731
    task = CustomTask(
        "lab:step", step, ("lab:derive", lambda means: {"ppl": math.exp(means["loss"])})
    )
    task.batch_stats(nn.Identity(), (torch.zeros(4, 3), torch.zeros(4)))  # names known now
    assert task.metric_names == ("acc", "ppl")
    assert task.metrics({"acc": 3.0}, 4, 1.5) == {"acc": 0.75, "ppl": math.exp(1.5)}
    for derive, message in [
        (lambda means: [1.0], "returned a list; return a dict of name -> number"),
        (lambda means: {"acc": 1.0}, "returned 'acc', a name task.target's metrics"),
        (lambda means: {"ppl": "high"}, "metric 'ppl' is 'high'"),
        (
            lambda means: {"ppl": means["los"]},
            r"raised KeyError: 'los' \(means has loss, acc: one split's, without train_/val_\)$",
        ),
    ]:
        bad = CustomTask("lab:step", step, ("lab:derive", derive))
        with pytest.raises(ConfigError, match=f"^task.derived='lab:derive': {message}"):
            bad.batch_stats(nn.Identity(), (torch.zeros(4, 3), torch.zeros(4)))


def test_custom_task_numbers_stay_on_the_host_and_tensors_where_they_were_computed() -> None:
    """A Python-number metric is never copied to the device each step (on a GPU that copy
    would wait for the kernels queued before it); a tensor metric is never read on the host."""
    task = custom(lambda m, b: (b[1].float().mean(), {"n": 2, "t": b[1].float().mean()}))
    out = task.batch_stats(nn.Identity(), (torch.zeros(4, 2), torch.tensor([1, 1, 1, 0])))
    assert out.stats["n"] == 8.0 and type(out.stats["n"]) is float
    assert isinstance(out.stats["t"], torch.Tensor) and out.stats["t"].dtype == torch.float64
    assert float(out.stats["t"]) == 3.0 and not out.stats["t"].requires_grad


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (torch.tensor([0.0, 1.0, 1.0, 0.0]), "the labels are float32 numbers; .* task=regression"),
        (torch.zeros(4, 2, dtype=torch.long), r"shape \(4, 2\); give one class index per sample"),
        (["a", "b", "a", "b"], "the labels of a batch are a list"),
    ],
    ids=["float", "two-per-sample", "text"],
)
def test_classification_refuses_labels_that_are_not_class_indices(labels, message) -> None:
    with pytest.raises(DataError, match=message) as err:
        ClassificationTask().batch_stats(nn.Linear(3, 2), (torch.zeros(4, 3), labels))
    assert "\n" not in str(err.value)
    # One label per sample as [batch, 1] is fine.
    labels = torch.ones(4, 1, dtype=torch.long)
    out = ClassificationTask().batch_stats(nn.Linear(3, 2), (torch.zeros(4, 3), labels))
    assert out.targets is not None and out.targets.tolist() == [1, 1, 1, 1]


def predictor(fn):
    return CustomPrediction("mylab.tasks:predict", fn)


def test_custom_prediction_names_and_types_its_outputs() -> None:
    batch = (torch.arange(6.0).reshape(3, 2), None)  # --input rows: no labels
    bare = predictor(lambda m, b: m(b[0]).sum(1)).outputs(nn.Identity(), batch)
    assert list(bare) == ["predicted"] and bare["predicted"].tolist() == [1.0, 5.0, 9.0]
    named = predictor(
        lambda m, b: {"scores": b[0].half(), "top": b[0].argmax(1) > 0, "n": np.arange(3)}
    ).outputs(nn.Identity(), batch)
    assert named["scores"].dtype == torch.float32 and named["scores"].shape == (3, 2)
    assert named["top"].dtype == torch.int64 and named["n"].tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (lambda m, b: b[0].mean(), r"output 'predicted' has shape \(\) for a batch of 4"),
        (lambda m, b: {"p": b[0][:2]}, r"output 'p' has shape \(2, 3\) for a batch of 4"),
        (lambda m, b: {"p": b[0].tolist()}, "output 'p' is a list; return tensors"),
        (lambda m, b: {}, "returned {}; return a tensor"),
        (lambda m, b: {"row": b[0]}, "other than 'row'"),
    ],
)
def test_custom_prediction_bad_returns_are_one_line_errors(returned, message) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        predictor(returned).outputs(nn.Identity(), (torch.zeros(4, 3), torch.zeros(4)))
    assert "task.predict='mylab.tasks:predict'" in str(err.value) and "\n" not in str(err.value)


def test_custom_prediction_keeps_the_first_batchs_names() -> None:
    calls = iter([{"a": torch.zeros(2)}, {"b": torch.zeros(2)}])
    prediction = predictor(lambda m, b: next(calls))
    prediction.outputs(nn.Identity(), (torch.zeros(2, 1), None))
    with pytest.raises(ConfigError, match=r"same names and shapes for every batch$"):
        prediction.outputs(nn.Identity(), (torch.zeros(2, 1), None))
    # A tagger's per-token output, as long as each batch's padding: told to pad it.
    calls = iter([{"tags": torch.zeros(2, 37)}, {"tags": torch.zeros(2, 40)}])
    prediction = predictor(lambda m, b: next(calls))
    prediction.outputs(nn.Identity(), (torch.zeros(2, 1), None))
    with pytest.raises(ConfigError) as ragged:
        prediction.outputs(nn.Identity(), (torch.zeros(2, 1), None))
    assert str(ragged.value).endswith(
        "returned per-sample shapes {'tags': (40,)} after {'tags': (37,)}; return the same "
        "names and shapes for every batch; a per-token output ('tags': as long as each "
        "batch's padding) is padded to one fixed width, e.g. the data's longest sequence, "
        "with a fill value such as -1"
    )


STEPS = """
import torch.nn.functional as F


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y), {}


def logits(model, batch):
    x, _ = batch  # (rows, None) for --input rows
    out = model(x)
    return {"logit": out, "margin": out[:, 1] - out[:, 0]}
"""


def test_custom_task_predicts_input_rows_and_never_overwrites_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """task=custom on feature rows, trained in this process: `hpcdl predict --input` gives
    task.predict's columns for each row (training preprocessing applied); --output never
    replaces the input or the run's own files, and a missing folder for it is made."""
    from hpcdl.checkpoint import read_checkpoint
    from hpcdl.cli.main import main
    from hpcdl.config.convert import model_from_dict
    from hpcdl.data import Preprocessing, load_feature_rows
    from hpcdl.models import build_model

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "steps.py").write_text(STEPS)
    x = np.random.default_rng(0).normal(3.0, 2.0, size=(60, 2))
    lines = ["a,b,label", *(f"{u:.4f},{v:.4f},{int(u > 3)}" for u, v in x)]
    (tmp_path / "rows.csv").write_text("\n".join(lines) + "\n")
    task = ["task=custom", "task.target=steps:step", "task.predict=steps:logits"]
    code = main(["train", "run_dir=run", "data=files", "data.path=rows.csv", *task])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    before = (tmp_path / "rows.csv").read_bytes()

    def refused(output: str) -> str:
        code = main(["predict", "run", "--input", "rows.csv", "--output", output])
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        return err

    assert "--output 'rows.csv' is the --input file 'rows.csv'" in refused("rows.csv")
    assert "is the --input file 'rows.csv'" in refused(str(tmp_path / "rows.csv"))
    assert (tmp_path / "rows.csv").read_bytes() == before
    assert "would overwrite the run's own config.yaml" in refused("run/config.yaml")
    assert "is the checkpoint" in refused("run/checkpoints/best.pt")
    assert "is a folder; give a file name" in refused("run")

    code = main(["predict", "run", "--input", "rows.csv", "--output", "out/new/preds.csv"])
    assert code == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out) == {"rows": 60, "output": "out/new/preds.csv"}
    rows = list(csv.DictReader((tmp_path / "out" / "new" / "preds.csv").open()))
    assert list(rows[0]) == ["row", "logit_0", "logit_1", "margin"] and len(rows) == 60
    state = read_checkpoint(tmp_path / "run" / "checkpoints" / "best.pt")
    model = build_model(model_from_dict(state["model_config"]), (2,), 2)
    model.load_state_dict(state["model"])
    model.eval()
    raw = load_feature_rows("rows.csv", (2,))
    with torch.no_grad():
        expected = model(Preprocessing.from_state_dict(state["preprocessing"]).apply(raw))
    got = torch.tensor([[float(r["logit_0"]), float(r["logit_1"])] for r in rows])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    margin = torch.tensor([float(r["margin"]) for r in rows])
    torch.testing.assert_close(margin, expected[:, 1] - expected[:, 0], rtol=1e-5, atol=1e-6)


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
    # The targets as the shortest text of their float32, like the predictions (they were
    # written as the float32's exact value: 234567.89 as 234567.890625).
    targets = [t for *_, t in rows[1:]]
    shortest = [np.format_float_positional(np.float32(t), unique=True, trim="0") for t in targets]
    assert targets == shortest
    assert sum(errors) / len(errors) < 20_000  # in dollars: the target's own units


HUBER = """
import torch
import torch.nn.functional as F


def huber(model, batch):
    x, y = batch
    assert y.dtype == torch.float32, y.dtype  # the values as they are, not class indices
    pred = model(x).float().squeeze(-1)
    return F.huber_loss(pred / 1000, y / 1000), {"mean_target": y.mean()}
"""


def test_a_custom_loss_on_a_numeric_csv_target_with_task_labels_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """task=custom reads data=files labels as class indices unless task.labels=numbers: then
    the step gets the float targets in their own units, and the model one output."""
    from hpcdl.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "huber_steps.py").write_text(HUBER)  # a name no other test imports
    write_houses(tmp_path / "houses.csv")
    common = ["data=files", "data.path=houses.csv", "data.label_column=price"]
    task = ["task=custom", "task.target=huber_steps:huber", "trainer.max_epochs=2"]
    assert main(["train", "run_dir=classes", *common, *task]) == 2
    err = capsys.readouterr().err
    assert "non-integer numbers" in err and "task.labels=numbers" in err
    assert not (tmp_path / "classes" / "checkpoints").exists()
    assert main(["train", "run_dir=digits", "data=digits", *task, "task.labels=numbers"]) == 2
    assert "task.labels=numbers: data=digits holds class labels" in capsys.readouterr().err

    assert main(["train", "run_dir=run", *common, *task, "task.labels=numbers"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    prices = np.loadtxt(tmp_path / "houses.csv", delimiter=",", skiprows=1)[:, -1]
    assert abs(summary["test_mean_target"] - prices.mean()) < 3 * prices.std() / np.sqrt(45)
    from hpcdl.checkpoint import read_checkpoint

    state = read_checkpoint(tmp_path / "run" / "checkpoints" / "best.pt")
    assert state["data_info"]["num_classes"] == 1 and state["data_info"]["class_names"] == []
    assert main(["evaluate", "run"]) == 0
    assert "test_mean_target" in capsys.readouterr().out


def test_predictions_csv_floats_read_back_as_the_values_computed() -> None:
    # hpcdl predict's CSV: the shortest text that reads back as the same float32, not
    # 6 significant digits (1201113.5 was written 1.20111e+06) or 6 decimals.
    from hpcdl.inference import _class_rows, _regression_rows

    outputs = torch.tensor([0.0, 1.2345678, -0.3, 3e-7])
    regression = _regression_rows(RegressionTask(RegressionLoss.mse, 1201113.5, 1000.0), outputs)
    texts = [row[1] for row in regression.csv_rows()]
    assert texts[0] == "1201113.5"
    assert [np.float32(t) for t in texts] == [np.float32(r[1]) for r in regression.rows]
    logits = torch.tensor([[0.0, 1e-6], [3.0, -2.0], [0.1, 0.2]])
    classes = _class_rows(logits, ["no", "yes"])
    texts = [row[3] for row in classes.csv_rows()]
    assert texts[0] != "0.500000" and np.float32(texts[0]) == np.float32(0.50000025)
    assert [np.float32(t) for t in texts] == [np.float32(r[3]) for r in classes.rows]


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
    ranks, 399 training rows in batches of 32 (a short last batch of 15). task.derived's
    perplexity is exp of each split's mean loss (exp(loss) per batch, averaged, was not)."""
    from hpcdl.cli.compose import compose_config
    from hpcdl.data import build_data

    (tmp_path / "steps.py").write_text(
        "import math\n"
        "import torch.nn.functional as F\n"
        "def step(model, batch):\n"
        "    x, y = batch\n"
        "    return F.cross_entropy(model(x), y), {'label_mean': y.float().mean()}\n"
        "def derive(means):\n"
        "    return {'ppl': math.exp(means['loss']), 'twice': 2 * means['label_mean']}\n"
    )
    out = hpcdl(
        "train",
        "task=custom",
        "task.target=steps:step",
        "task.derived=steps:derive",
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
    for split in ("train", "val"):
        assert float(row[f"{split}_ppl"]) == pytest.approx(math.exp(float(row[f"{split}_loss"])))
        assert float(row[f"{split}_twice"]) == pytest.approx(2 * float(row[f"{split}_label_mean"]))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["test_ppl"] == pytest.approx(math.exp(summary["test_loss"]), rel=1e-12)
    evaluated = hpcdl("evaluate", "run", env={"PYTHONPATH": str(tmp_path)})
    assert evaluated.returncode == 0, evaluated.stderr
    assert "test_ppl" in evaluated.stdout, evaluated.stdout


def test_helper_metrics_feed_task_derived_and_are_not_reported(hpcdl, tmp_path) -> None:
    """Per-class counts for a macro F1 filled the progress line, metrics.csv, summary.json
    and 16 plot panels; a name starting with `_` is a helper: averaged, given to
    task.derived, not reported."""
    step = lambda m, b: (torch.tensor(1.0), {"acc": 0.5, "_tp": 0.25, "_fp": 0.25})  # noqa: E731
    derive = lambda means: {"precision": means["_tp"] / (means["_tp"] + means["_fp"])}  # noqa: E731
    task = CustomTask("lab:step", step, ("lab:derive", derive))
    task.batch_stats(nn.Identity(), (torch.zeros(4, 3), torch.zeros(4)))
    assert task.stat_names == ("_fp", "_tp", "acc") and task.metric_names == ("acc", "precision")
    assert task.metrics({"_fp": 1.0, "_tp": 3.0, "acc": 2.0}, 4, 0.5) == {
        "acc": 0.5,
        "precision": 0.75,
    }
    with pytest.raises(ConfigError, match="val_acc, val_precision"):
        check_monitor("val__tp", task)

    (tmp_path / "f1.py").write_text(
        "import torch.nn.functional as F\n"
        "def step(model, batch):\n"
        "    x, y = batch\n"
        "    hit = (model(x).argmax(1) == y).float()\n"
        "    return F.cross_entropy(model(x), y), {'_hits': hit.mean(), 'acc': hit.mean()}\n"
        "def derive(means):\n"
        "    return {'hit_pct': 100 * means['_hits']}\n"
    )
    out = hpcdl(
        "train",
        "task=custom",
        "task.target=f1:step",
        "task.derived=f1:derive",
        "trainer.max_epochs=1",
        "run_dir=run",
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr + out.stdout
    row = next(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    assert "val_hit_pct" in row and not [k for k in row if "hits" in k], list(row)
    assert float(row["val_hit_pct"]) == pytest.approx(100 * float(row["val_acc"]))
    assert (
        "hits" not in out.stdout and "hits" not in (tmp_path / "run" / "summary.json").read_text()
    )
