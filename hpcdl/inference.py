"""`hpcdl evaluate` and `hpcdl predict`: a model rebuilt from a checkpoint, no code by hand."""

from __future__ import annotations

import csv
import io
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from hpcdl.atomic import write_atomic, write_json_atomic
from hpcdl.checkpoint import read_checkpoint, resolve_checkpoint
from hpcdl.config.convert import model_from_dict
from hpcdl.config.schema import Config, CustomTaskConfig, RegressionTaskConfig
from hpcdl.data import Preprocessing, load_feature_rows
from hpcdl.data.feed import EVAL_BATCH_SIZE, build_feed
from hpcdl.errors import ConfigError, DataError, WriteError, os_error_reason
from hpcdl.evaluation import evaluate, load_matching_weights
from hpcdl.models import build_model
from hpcdl.plots import plot_confusion_matrix, plot_predicted_vs_true
from hpcdl.rundir import RUN_DIR_LAYOUT, RunDir
from hpcdl.tasks import (
    CustomPrediction,
    RegressionTask,
    build_prediction,
    build_task,
    input_and_target,
)


def _model_from_checkpoint(state: dict[str, Any], source: str) -> nn.Module:
    info = state["data_info"]
    model = build_model(
        model_from_dict(state["model_config"]), tuple(info["input_shape"]), int(info["num_classes"])
    )
    load_matching_weights(model, state["model"], source)
    model.eval()
    return model


def _checkpoint_for(run_dir: RunDir, which: str) -> Path:
    """--checkpoint best | last (or newest) | PATH, or the name of a file in the run's
    checkpoints/ folder (step_000000390.pt)."""
    if which in ("best", "last", "newest"):
        return resolve_checkpoint(run_dir.path, "best" if which == "best" else "last")
    in_run = run_dir.checkpoint_dir / which
    if not Path(which).expanduser().exists() and in_run.is_file():
        return in_run
    return resolve_checkpoint(Path(which).expanduser())


def load_model(cfg: Config, run_dir: RunDir, which: str, device: str | torch.device) -> nn.Module:
    """A run's model with one checkpoint's weights, in eval mode, on `device` (Job.load_model):
    built as `hpcdl predict` builds it, from the model config and data shape the checkpoint
    was saved with (a model=custom class imported from sys.path)."""
    if cfg.script is not None:
        raise ConfigError(
            f"{run_dir.path} is an `hpcdl run` run; its program keeps its own model and "
            "checkpoints, which hpcdl cannot rebuild: load them with your program"
        )
    path = _checkpoint_for(run_dir, which)
    model = _model_from_checkpoint(read_checkpoint(path, mmap=True), str(path))
    return model.to(device)


def evaluate_checkpoint(cfg: Config, run_dir: RunDir, which: str) -> dict[str, Any]:
    """Test metrics and a confusion matrix for one checkpoint of a run."""
    path = _checkpoint_for(run_dir, which)
    state = read_checkpoint(path, mmap=True)
    device = torch.device("cpu")
    regression = isinstance(cfg.task, RegressionTaskConfig)
    feed = build_feed(cfg.data, device, seed=cfg.trainer.seed, task=cfg.task)
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
    cfg: Config,
    run_dir: RunDir,
    input_path: Optional[str],
    which: str,
    output: Optional[str],
    split: Optional[str] = None,
) -> int:
    """Predictions for raw rows (--input, with the run's training preprocessing applied) or
    for every sample of one of the run's splits (--split, with the true value beside it).
    task=custom: the columns its task.predict function returns. Returns the number of rows."""
    source = f"--input {input_path}" if input_path is not None else f"--split {split or 'test'}"
    path = _checkpoint_for(run_dir, which)
    reads = {path: "the checkpoint"}
    if input_path is not None:
        reads[Path(input_path).expanduser()] = "the --input file"
    target = _output_file(output, run_dir, reads)
    state = read_checkpoint(path, mmap=True)
    if input_path is not None:
        _refuse_input_without_rows(state, input_path)  # before task.predict's advice names it
    prediction = _custom_prediction(cfg, run_dir, source)
    model = _model_from_checkpoint(state, str(path))
    if input_path is not None:
        batches = _row_batches(state, input_path)
    else:
        batches = _split_batches(cfg, split or "test")
    if prediction is not None:
        header, rows = _custom_rows(prediction, model, batches)
    else:
        header, rows = _builtin_rows(cfg, state, model, batches)
    _write_csv(header, rows, target)
    return len(rows)


def _custom_prediction(cfg: Config, run_dir: RunDir, source: str) -> Optional[CustomPrediction]:
    """task=custom: its task.predict function (refused in one line when unset); None for the
    built-in tasks, whose outputs hpcdl knows."""
    if not isinstance(cfg.task, CustomTaskConfig):
        return None
    if cfg.task.predict is None:
        raise ConfigError(
            f"task.predict is not set: {run_dir.path} was trained with task=custom, whose model "
            "outputs only your code understands; write a function (model, batch) -> tensor or "
            "{name: tensor} with one entry per sample and name it, e.g. "
            f"hpcdl predict {run_dir.path} task.predict=package.module:function {source}"
        )
    return build_prediction(cfg.task)


def _output_file(output: Optional[str], run_dir: RunDir, reads: dict[Path, str]) -> Optional[Path]:
    """--output, checked before anything is computed: not a folder, not a file this command
    reads, not one of the run dir's own records. Missing parent folders are made when it is
    written."""
    if output is None:
        return None
    path = Path(output).expanduser()
    if path.is_dir():
        raise ConfigError(
            f"--output {output!r} is a folder; give a file name, e.g. {path / 'predictions.csv'}"
        )
    for other, what in reads.items():
        if _same_file(path, other):
            raise ConfigError(
                f"--output {output!r} is {what} '{other}'; write the predictions to another file"
            )
    inside = _relative_to(path, run_dir.path)
    owned = {name.split("/")[0] for name, _ in RUN_DIR_LAYOUT}
    if inside is not None and inside.parts and inside.parts[0] in owned:
        raise ConfigError(
            f"--output {output!r} would overwrite the run's own {inside.parts[0]}; write the "
            f"predictions to another file, e.g. {run_dir.path / 'predictions.csv'}"
        )
    folder = next(p for p in (path.parent, *path.parent.parents) if p.exists())
    if not folder.is_dir():
        raise ConfigError(f"--output {output!r}: '{folder}' is a file, not a folder")
    return path


def _same_file(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return a.samefile(b)
    return a.resolve() == b.resolve()


def _relative_to(path: Path, folder: Path) -> Optional[Path]:
    try:
        return path.resolve().relative_to(folder.resolve())
    except ValueError:
        return None


def _refuse_input_without_rows(state: dict[str, Any], input_path: str) -> None:
    if not state.get("preprocessing"):
        raise ConfigError(
            f"--input {input_path!r}: this run's data (data=custom or imagefolder) is not feature "
            "rows; predict on one of its splits with --split test|val|train"
        )


def _row_batches(state: dict[str, Any], input_path: str) -> Iterator[tuple[torch.Tensor, None]]:
    """--input rows, prepared as the training rows were, as label-less (x, None) batches."""
    info = state["data_info"]
    # Checkpoints written before feature_columns was recorded give rows by position only.
    rows = load_feature_rows(
        input_path,
        tuple(info["input_shape"]),
        info.get("feature_columns"),
        info.get("label_column"),
    )
    if len(rows) == 0:
        raise DataError(f"--input {input_path!r}: no rows to predict")
    x = Preprocessing.from_state_dict(state["preprocessing"]).apply(rows)
    return ((part, None) for part in x.split(EVAL_BATCH_SIZE))


def _split_batches(cfg: Config, split: str) -> Iterator[Any]:
    """Every sample of one of the run's splits, rebuilt from its config, in order."""
    device = torch.device("cpu")
    feed = build_feed(cfg.data, device, seed=cfg.trainer.seed, task=cfg.task)
    if feed.num_samples(split) == 0:
        raise ConfigError(f"--split {split}: the run's {split} split is empty")
    return feed.eval_batches(split, 0, 1, device, cfg.trainer.batch_size)


def _builtin_rows(
    cfg: Config, state: dict[str, Any], model: nn.Module, batches: Iterable[Any]
) -> tuple[list[str], list[list[Any]]]:
    """task=classification (class, name, probability) or regression (value in the target's
    units), with a `true` column when the batches carry labels."""
    outputs, truth = [], []
    with torch.no_grad():
        for batch in batches:
            x, y = input_and_target(batch, task=cfg.task.name)
            outputs.append(model(x).float())
            if y is not None:
                truth.append(y.reshape(-1))
    info = state["data_info"]
    logits = torch.cat(outputs)
    if isinstance(cfg.task, RegressionTaskConfig):
        stats = (info.get("target_mean", 0.0), info.get("target_std", 1.0))
        task = build_task(cfg.task, stats)
        assert isinstance(task, RegressionTask)
        header, rows = _regression_rows(task, logits)
    else:
        header, rows = _class_rows(logits, list(info["class_names"]))
    if truth:
        header.append("true")
        rows = [[*row, value] for row, value in zip(rows, torch.cat(truth).tolist(), strict=True)]
    return header, rows


def _custom_rows(
    prediction: CustomPrediction, model: nn.Module, batches: Iterable[Any]
) -> tuple[list[str], list[list[Any]]]:
    """One row per sample: each output's values, flattened; a name with several values per
    sample becomes the columns name_0, name_1, ... (row-major)."""
    parts: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad():
        for batch in batches:
            for name, values in prediction.outputs(model, batch).items():
                parts.setdefault(name, []).append(values)
    header, cells = ["row"], []
    for name, chunks in parts.items():
        values = torch.cat(chunks)
        values = values.reshape(values.shape[0], -1)
        width = values.shape[1]
        header += [name] if width == 1 else [f"{name}_{i}" for i in range(width)]
        # numpy's str() is the shortest text that reads back as the same float32/float64.
        cells.append(values.numpy().astype(str))
    table = np.concatenate(cells, axis=1).tolist() if cells else []
    return header, [[i, *row] for i, row in enumerate(table)]


def _write_csv(header: list[str], rows: list[list[Any]], target: Optional[Path]) -> None:
    """To stdout, or to the --output file: written whole (a temporary name, then renamed),
    its missing parent folders made first."""
    if target is None:
        try:
            writer = csv.writer(sys.stdout)
            writer.writerow(header)
            writer.writerows(rows)
            sys.stdout.flush()
        except BrokenPipeError:
            # The reader has gone (`hpcdl predict ... | head`): stop quietly, as Unix tools
            # do; stdout to /dev/null so that the interpreter's last flush cannot fail too.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(header)
    writer.writerows(rows)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise WriteError(target.parent, os_error_reason(err)) from err
    write_atomic(target, text.getvalue())


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
