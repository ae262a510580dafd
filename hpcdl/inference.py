"""`hpcdl evaluate` and `hpcdl predict`: a model rebuilt from a checkpoint, no code by hand."""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from hpcdl.atomic import write_json_atomic
from hpcdl.checkpoint import read_checkpoint, resolve_checkpoint
from hpcdl.config.convert import model_from_dict
from hpcdl.config.schema import Config, CustomTaskConfig, RegressionTaskConfig
from hpcdl.data import Preprocessing, load_feature_rows
from hpcdl.data.feed import build_feed
from hpcdl.errors import ConfigError
from hpcdl.evaluation import evaluate, load_matching_weights
from hpcdl.models import build_model
from hpcdl.plots import plot_confusion_matrix, plot_predicted_vs_true
from hpcdl.rundir import RunDir
from hpcdl.tasks import RegressionTask, build_task, input_and_target


def _model_from_checkpoint(state: dict[str, Any], source: str) -> nn.Module:
    info = state["data_info"]
    model = build_model(
        model_from_dict(state["model_config"]), tuple(info["input_shape"]), int(info["num_classes"])
    )
    load_matching_weights(model, state["model"], source)
    model.eval()
    return model


def _checkpoint_for(run_dir: RunDir, which: str) -> Path:
    """--checkpoint best | last | PATH."""
    if which in ("best", "last"):
        return resolve_checkpoint(run_dir.path, which)
    return resolve_checkpoint(which)


def evaluate_checkpoint(cfg: Config, run_dir: RunDir, which: str) -> dict[str, Any]:
    """Test metrics and a confusion matrix for one checkpoint of a run."""
    path = _checkpoint_for(run_dir, which)
    state = read_checkpoint(path)
    device = torch.device("cpu")
    regression = isinstance(cfg.task, RegressionTaskConfig)
    feed = build_feed(cfg.data, device, seed=cfg.trainer.seed, regression=regression)
    if feed.num_samples("test") == 0:
        raise ConfigError(
            f"hpcdl evaluate: {run_dir.path} has no test split (data.test_fraction=0, or no "
            "test dataset); nothing to evaluate"
        )
    # Build the model the run's config describes and refuse a checkpoint that does not fit.
    model = build_model(cfg.model, feed.input_shape, feed.num_classes)
    load_matching_weights(model, state["model"], str(path))
    batches = feed.eval_batches("test", 0, 1, device, cfg.trainer.batch_size)
    task = build_task(cfg.task, feed.target_stats)
    result = evaluate(model, batches, task, feed.num_classes, device, keep_predictions=regression)
    report: dict[str, Any] = {
        "checkpoint": str(path),
        "test_loss": result.loss,
        **{f"test_{name}": value for name, value in result.metrics.items()},
        "num_test_samples": result.num_samples,
    }
    if result.confusion is not None:
        report["confusion_matrix"] = result.confusion.tolist()
        report["class_names"] = list(feed.class_names)
    write_json_atomic(run_dir.eval_metrics_file(path.stem), report)
    if result.confusion is not None:
        plot_confusion_matrix(
            result.confusion, list(feed.class_names), run_dir.eval_confusion_png(path.stem)
        )
    if result.predictions is not None:
        predicted, true = result.predictions
        plot_predicted_vs_true(predicted.reshape(-1), true, run_dir.eval_scatter_png(path.stem))
    report["output_dir"] = str(run_dir.eval_dir(path.stem))
    return report


def predict_rows(
    run_dir: RunDir,
    input_path: Optional[str],
    which: str,
    output: Optional[str],
    split: Optional[str] = None,
) -> int:
    """Predictions for raw rows (--input, with the run's training preprocessing applied) or
    for every sample of one of the run's splits (--split, with the true value beside it)."""
    cfg = run_dir.load_config()
    if isinstance(cfg.task, CustomTaskConfig):
        raise ConfigError(
            f"hpcdl predict: {run_dir.path} was trained with task=custom, whose outputs only "
            "your step function understands; use hpcdl evaluate, or load the checkpoint's "
            "'model' weights in your own code"
        )
    path = _checkpoint_for(run_dir, which)
    state = read_checkpoint(path)
    model = _model_from_checkpoint(state, str(path))
    info = state["data_info"]
    if input_path is not None:
        outputs, truth = _outputs_for_rows(model, state, input_path), None
    else:
        outputs, truth = _outputs_for_split(model, cfg, split or "test")
    if isinstance(cfg.task, RegressionTaskConfig):
        stats = (info.get("target_mean", 0.0), info.get("target_std", 1.0))
        task = build_task(cfg.task, stats)
        assert isinstance(task, RegressionTask)
        header, rows = _regression_rows(task, outputs)
    else:
        header, rows = _class_rows(outputs, list(info["class_names"]))
    if truth is not None:
        header.append("true")
        rows = [[*row, value] for row, value in zip(rows, truth.tolist(), strict=True)]
    out = open(output, "w", newline="") if output else sys.stdout  # noqa: SIM115
    try:
        writer = csv.writer(out)
        writer.writerow(header)
        writer.writerows(rows)
    finally:
        if output:
            out.close()
    return len(rows)


def _outputs_for_rows(model: nn.Module, state: dict[str, Any], input_path: str) -> torch.Tensor:
    if not state.get("preprocessing"):
        raise ConfigError(
            f"--input {input_path!r}: this run's data (data=custom or imagefolder) is not feature "
            "rows; predict on one of its splits with --split test|val|train"
        )
    rows = load_feature_rows(input_path, tuple(state["data_info"]["input_shape"]))
    x = Preprocessing.from_state_dict(state["preprocessing"]).apply(rows)
    with torch.no_grad():
        return model(x).float()


def _outputs_for_split(
    model: nn.Module, cfg: Config, split: str
) -> tuple[torch.Tensor, torch.Tensor]:
    device = torch.device("cpu")
    regression = isinstance(cfg.task, RegressionTaskConfig)
    feed = build_feed(cfg.data, device, seed=cfg.trainer.seed, regression=regression)
    if feed.num_samples(split) == 0:
        raise ConfigError(f"--split {split}: the run's {split} split is empty")
    outputs, truth = [], []
    with torch.no_grad():
        for batch in feed.eval_batches(split, 0, 1, device, cfg.trainer.batch_size):
            x, y = input_and_target(batch, task=cfg.task.name)
            outputs.append(model(x).float())
            truth.append(y.reshape(-1))
    return torch.cat(outputs), torch.cat(truth)


def _class_rows(outputs: torch.Tensor, names: list[str]) -> tuple[list[str], list[list[Any]]]:
    probs = torch.softmax(outputs, dim=1)
    rows = []
    for i, p in enumerate(probs):
        k = int(p.argmax())
        rows.append([i, k, names[k] if k < len(names) else str(k), f"{float(p[k]):.6f}"])
    return ["row", "predicted", "class_name", "probability"], rows


def _regression_rows(
    task: RegressionTask, outputs: torch.Tensor
) -> tuple[list[str], list[list[Any]]]:
    values = task.predict(outputs).tolist()
    return ["row", "predicted"], [[i, f"{v:.6g}"] for i, v in enumerate(values)]
