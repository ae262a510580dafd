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
from hpcdl.config.schema import ClassificationTaskConfig, Config
from hpcdl.data import Preprocessing, load_feature_rows
from hpcdl.data.feed import build_feed
from hpcdl.errors import ConfigError
from hpcdl.evaluation import evaluate, load_matching_weights
from hpcdl.models import build_model
from hpcdl.plots import plot_confusion_matrix
from hpcdl.rundir import RunDir
from hpcdl.tasks import build_task


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
    feed = build_feed(cfg.data, device, seed=cfg.trainer.seed)
    if feed.num_samples("test") == 0:
        raise ConfigError(
            f"hpcdl evaluate: {run_dir.path} has no test split (data.test_fraction=0, or no "
            "test dataset); nothing to evaluate"
        )
    # Build the model the run's config describes and refuse a checkpoint that does not fit.
    model = build_model(cfg.model, feed.input_shape, feed.num_classes)
    load_matching_weights(model, state["model"], str(path))
    batches = feed.eval_batches("test", 0, 1, device, cfg.trainer.batch_size)
    result = evaluate(model, batches, build_task(cfg.task), feed.num_classes, device)
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
    report["output_dir"] = str(run_dir.eval_dir(path.stem))
    return report


def predict_rows(run_dir: RunDir, input_path: str, which: str, output: Optional[str]) -> int:
    """Class predictions for raw rows, with the run's training preprocessing applied."""
    task = run_dir.load_config().task
    if not isinstance(task, ClassificationTaskConfig):
        raise ConfigError(
            f"hpcdl predict: {run_dir.path} was trained with task={task.name}; predict gives "
            "class predictions of task=classification runs only (use hpcdl evaluate, or load "
            "the checkpoint's 'model' weights in your own code)"
        )
    path = _checkpoint_for(run_dir, which)
    state = read_checkpoint(path)
    model = _model_from_checkpoint(state, str(path))
    info = state["data_info"]
    rows = load_feature_rows(input_path, tuple(info["input_shape"]))
    x = Preprocessing.from_state_dict(state["preprocessing"]).apply(rows)
    with torch.no_grad():
        probs = torch.softmax(model(x).float(), dim=1)
    names = list(info["class_names"])
    out = open(output, "w", newline="") if output else sys.stdout  # noqa: SIM115
    try:
        writer = csv.writer(out)
        writer.writerow(["row", "predicted", "class_name", "probability"])
        for i, p in enumerate(probs):
            k = int(p.argmax())
            writer.writerow([i, k, names[k] if k < len(names) else str(k), f"{float(p[k]):.6f}"])
    finally:
        if output:
            out.close()
    return len(probs)
