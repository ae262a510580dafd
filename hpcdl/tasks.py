"""What is learned: a task turns (model, batch) into a loss and additive statistics.

The loop and evaluation only ever sum what a task returns, over batches and over ranks:
`loss_sum` (the sum of per-sample losses) and `stats` (sums such as the number of correct
predictions). `metrics(stats, num_samples)` turns those sums into the reported metrics,
so every metric is exactly weighted by samples however the data is split over ranks.

task=classification: cross-entropy on integer labels; metric accuracy.
task=regression: MSE or L1 on one numeric target; metrics mae, rmse, r2.
task=custom: the user's function(model, batch, **kwargs) -> (loss, {name: value}), both
means over the batch; hpcdl multiplies them by the batch's samples to get sums. Its optional
task.predict function(model, batch) gives `hpcdl predict` its per-sample outputs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hpcdl.config.metrics import TASK_METRICS
from hpcdl.config.schema import (
    ClassificationTaskConfig,
    CustomTaskConfig,
    RegressionLoss,
    RegressionTaskConfig,
    TaskConfig,
)
from hpcdl.errors import ConfigError, DataError, HpcdlError, did_you_mean, raised
from hpcdl.samples import first_array_shape, input_target_pair
from hpcdl.step_sums import Value
from hpcdl.targets import check_step_kwargs, resolve_callable


@dataclass
class BatchStats:
    loss_sum: torch.Tensor  # scalar, fp32 or fp64, carries the graph in training
    num_samples: int
    stats: dict[str, Value]  # scalar sums: detached tensors, or floats on the host
    outputs: torch.Tensor | None = None  # the model's outputs (classification: logits)
    targets: torch.Tensor | None = None  # the batch's labels, when the task knows them
    # What loss_sum sums over where that is not the samples: a custom step's own count (its
    # unpadded tokens), by which the loss is averaged over passes, ranks and batches.
    loss_count: Value | None = None

    @property
    def loss_weight(self) -> Value:
        """The count the loss is a mean over: the step's own, else the samples."""
        return float(self.num_samples) if self.loss_count is None else self.loss_count


class Task:
    name: str = ""
    # True: batch_loss leaves `stats` out and stats_of(outputs, targets) gives them, the same
    # sums for any grouping of batches (integer counts), so the trainer may count them a
    # chunk of steps at a time (hpcdl.deferred_stats) instead of a few tiny ops every step.
    defers_stats: bool = False

    def batch_stats(self, model: nn.Module, batch: Any) -> BatchStats:
        raise NotImplementedError

    def batch_loss(self, model: nn.Module, batch: Any) -> BatchStats:
        """batch_stats without `stats` (defers_stats tasks only)."""
        raise NotImplementedError

    def stats_of(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """The statistics of batches from their outputs and targets (defers_stats tasks only)."""
        raise NotImplementedError

    @property
    def stat_names(self) -> tuple[str, ...]:
        """The keys of BatchStats.stats, in a fixed order (known after the first batch for a
        custom task)."""
        raise NotImplementedError

    def metrics(
        self, stats: Mapping[str, float], num_samples: float, loss: float
    ) -> dict[str, float]:
        """The metrics of summed `stats` over `num_samples` samples whose mean loss is
        `loss` (a custom task's task.derived reads it)."""
        raise NotImplementedError

    @property
    def metric_names(self) -> tuple[str, ...]:
        raise NotImplementedError


class ClassificationTask(Task):
    name = "classification"
    defers_stats = True

    def __init__(self, num_classes: Optional[int] = None) -> None:
        self.num_classes = num_classes  # the data's: the model's outputs per sample

    def batch_stats(self, model: nn.Module, batch: Any) -> BatchStats:
        out = self.batch_loss(model, batch)
        assert out.outputs is not None and out.targets is not None
        out.stats.update(self.stats_of(out.outputs, out.targets))
        return out

    def batch_loss(self, model: nn.Module, batch: Any) -> BatchStats:
        x, labels = input_and_target(batch)
        y = class_indices(labels)
        logits = model(x)
        if logits.dim() != 2:
            raise ConfigError(
                f"task=classification: the model returned shape {tuple(logits.shape)}; it must "
                "return logits [batch, num_classes] (or use task=custom)"
            )
        if self.num_classes is not None and logits.shape[1] != self.num_classes:
            # More outputs trained, then failed the evaluation (a predicted class the data
            # does not have); fewer failed as "a label is outside".
            raise ConfigError(
                f"task=classification: the model gives {logits.shape[1]} outputs per sample "
                f"for data with {self.num_classes} classes; make its last layer "
                f"{self.num_classes} wide (a custom model gets num_classes={self.num_classes}), "
                "or set data.num_classes if that count is wrong"
            )
        try:
            # The loss in fp32 (bf16/fp16 logits); fp32 ones as they are, without a call a step.
            wide = logits if logits.dtype == torch.float32 else logits.float()
            loss_sum = F.cross_entropy(wide, y, reduction="sum")
        except (IndexError, RuntimeError) as exc:
            if "out of bounds" not in str(exc) and "out of range" not in str(exc):
                raise
            raise DataError(
                f"task=classification: a label is outside [0, {logits.shape[1]}) ({exc}); "
                "labels must be class indices below the model's number of outputs "
                "(data.num_classes)"
            ) from None
        return BatchStats(loss_sum, int(y.shape[0]), {}, logits, y)

    def stats_of(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"correct": (outputs.argmax(1) == targets).sum()}  # argmax records no graph

    @property
    def stat_names(self) -> tuple[str, ...]:
        return ("correct",)

    def metrics(
        self, stats: Mapping[str, float], num_samples: float, loss: float
    ) -> dict[str, float]:
        return {"accuracy": stats["correct"] / max(num_samples, 1)}

    @property
    def metric_names(self) -> tuple[str, ...]:
        return tuple(TASK_METRICS[self.name])


class RegressionTask(Task):
    """One numeric target per sample. The model learns (y - mean) / std when the target is
    standardized; losses are on that scale, metrics and outputs in the target's units."""

    name = "regression"

    def __init__(self, loss: RegressionLoss, mean: float = 0.0, std: float = 1.0) -> None:
        self.loss = loss
        self.mean = mean
        self.std = std

    def batch_stats(self, model: nn.Module, batch: Any) -> BatchStats:
        x, y = input_and_target(batch, task="regression")
        if not isinstance(y, torch.Tensor):
            raise DataError(
                f"task=regression: the targets of a batch are a {type(y).__name__} (text?), not "
                "a tensor of numbers; return one number per sample as the target (or use "
                "task=classification for class labels)"
            )
        out = model(x).float()
        if out.numel() != y.numel():
            raise ConfigError(
                f"task=regression: the model returned shape {tuple(out.shape)} for "
                f"{y.numel()} targets; it must return one value per sample ([batch] or [batch, 1])"
            )
        out = out.reshape(-1)
        target = y.reshape(-1).float()
        scaled_error = out - (target - self.mean) / self.std
        if self.loss == RegressionLoss.l1:
            loss_sum = scaled_error.abs().sum()
        else:
            loss_sum = scaled_error.square().sum()
        prediction = out.detach() * self.std + self.mean
        error = prediction - target
        stats = {
            "abs_err": error.abs().sum().double(),
            "sq_err": error.square().sum().double(),
            "y": target.sum().double(),
            "y2": target.double().square().sum(),
        }
        return BatchStats(loss_sum, int(target.numel()), stats, prediction, target)

    @property
    def stat_names(self) -> tuple[str, ...]:
        return ("abs_err", "sq_err", "y", "y2")

    def metrics(
        self, stats: Mapping[str, float], num_samples: float, loss: float
    ) -> dict[str, float]:
        n = max(num_samples, 1)
        total = stats["y2"] - stats["y"] ** 2 / n  # sum of squares about the mean
        return {
            "mae": stats["abs_err"] / n,
            "rmse": math.sqrt(max(stats["sq_err"], 0.0) / n),
            "r2": 1.0 - stats["sq_err"] / total if total > 0 else 0.0,
        }

    @property
    def metric_names(self) -> tuple[str, ...]:
        return tuple(TASK_METRICS[self.name])

    def predict(self, outputs: torch.Tensor) -> torch.Tensor:
        """Model outputs -> predictions in the target's units."""
        return outputs.float().reshape(-1) * self.std + self.mean


# A custom step's metric whose name starts so is a helper: summed and averaged like the
# others and given to task.derived, but not reported (per-class counts for a macro F1).
HELPER = "_"


class CustomTask(Task):
    """The user's step function; its metric names are fixed by its first call."""

    name = "custom"

    def __init__(
        self,
        target: str,
        fn: Callable[..., Any],
        derived: Optional[tuple[str, Callable[[dict[str, float]], Any]]] = None,
    ) -> None:
        self.target = target
        self.fn = fn
        self.derived = derived  # (task.derived, its function)
        self._names: tuple[str, ...] | None = None
        self._derived_names: tuple[str, ...] | None = None
        self._counted: bool | None = None  # whether the step returns a count (fixed by its first call)

    def batch_stats(self, model: nn.Module, batch: Any) -> BatchStats:
        where = f"task.target={self.target!r}"
        result = self.fn(model, batch)
        if not (isinstance(result, tuple) and len(result) in (2, 3)):
            raise ConfigError(
                f"{where}: returned a {type(result).__name__}; return (loss, {{metric: value}}), "
                "or (loss, {metric: value}, count) for a loss that is a mean over count items"
            )
        loss, metrics = result[:2]
        count = self._count(where, result[2]) if len(result) == 3 else None
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            # With a count (per-token losses, padding left out) the mean is over the counted
            # items: loss.mean() of an unreduced loss would count the padding too.
            mean = "loss.sum() / count" if count is not None else "loss.mean()"
            raise ConfigError(
                f"{where}: the loss is {shape}, not a scalar tensor; return the batch's mean "
                f"loss, e.g. {mean}"
            )
        if not isinstance(metrics, Mapping) or not all(isinstance(k, str) for k in metrics):
            raise ConfigError(
                f"{where}: the metrics are a {type(metrics).__name__}, not a dict of "
                "name -> value; return {} for none"
            )
        names = tuple(sorted(metrics))
        if self._names is None:
            reserved = [n for n in names if n == "loss"]
            if reserved:
                raise ConfigError(f"{where}: a metric may not be called 'loss' (it is logged)")
            self._names = names
            if self.derived is not None:  # its names, from the first batch's means (once)
                first = {n: float(_scalar(where, n, metrics[n])) for n in names}
                self._derive({"loss": float(loss.detach()), **first})
        elif names != self._names:
            raise ConfigError(
                f"{where}: returned metrics {list(names)} after {list(self._names)}; "
                "return the same metric names for every batch"
            )
        if self._counted is None:
            self._counted = count is not None
        elif self._counted != (count is not None):
            said = "no count after batches with one" if self._counted else "a count after none"
            raise ConfigError(
                f"{where}: returned {said} (the loss's count, a third value); return it for "
                "every batch or for none"
            )
        num_samples = _num_samples(batch)
        if num_samples == 0:
            raise ConfigError(
                f"{where}: cannot tell the batch's number of samples (no tensor with a batch "
                "dimension in it); put the inputs in tensors"
            )
        # A tensor metric stays where it was computed; a Python number stays on the host
        # (copying it to the device every step would wait for the queued kernels there).
        stats: dict[str, Value] = {}
        for name in names:
            value = _scalar(where, name, metrics[name])
            stats[name] = (
                value.to(torch.float64) * num_samples
                if isinstance(value, torch.Tensor)
                else value * num_samples
            )
        if count is None:
            return BatchStats(loss.reshape(()).float() * num_samples, num_samples, stats)
        return BatchStats(loss.reshape(()).float() * count, num_samples, stats, loss_count=count)

    def _count(self, where: str, value: Any) -> Value:
        """A step's third value: what its loss is a mean over (unpadded tokens), a number
        or a scalar tensor (left on its device: reading it would wait for the step)."""
        count = _scalar(where, "count", value, role="the loss's count")
        if not isinstance(count, torch.Tensor) and count < 0:
            raise ConfigError(
                f"{where}: the loss's count is {count:g}; return how many items (tokens) the "
                "loss is a mean over, 0 or more"
            )
        return count.to(torch.float64) if isinstance(count, torch.Tensor) else count

    @property
    def stat_names(self) -> tuple[str, ...]:
        return self._names or ()

    def metrics(
        self, stats: Mapping[str, float], num_samples: float, loss: float
    ) -> dict[str, float]:
        means = {name: stats[name] / max(num_samples, 1) for name in self.stat_names}
        every = (
            means if self.derived is None else {**means, **self._derive({"loss": loss, **means})}
        )
        return {name: value for name, value in every.items() if not name.startswith(HELPER)}

    @property
    def metric_names(self) -> tuple[str, ...]:
        """What is reported (metrics.csv, the progress line, summary.json, the plots):
        the step's metrics and task.derived's, without helpers (`_tp_3`)."""
        every = self.stat_names + (self._derived_names or ())
        return tuple(name for name in every if not name.startswith(HELPER))

    def _derive(self, means: dict[str, float]) -> dict[str, float]:
        """task.derived's metrics of a split's (or a batch's) means: what is no mean over
        the samples, e.g. a perplexity, exp of the mean loss."""
        assert self.derived is not None
        target, fn = self.derived
        where = f"task.derived={target!r}"
        try:
            result = fn(dict(means))
        except Exception as exc:
            said = str(exc).strip().splitlines()
            has = f" (means has {', '.join(means)}: one split's, without train_/val_)"
            raise ConfigError(
                f"{where}: raised {type(exc).__name__}{': ' + said[0] if said else ''}"
                f"{has if isinstance(exc, KeyError) else ''}"
            ) from exc
        if not isinstance(result, Mapping) or not all(isinstance(k, str) for k in result):
            raise ConfigError(
                f"{where}: returned a {type(result).__name__}; return a dict of name -> "
                "number, e.g. {'ppl': math.exp(means['loss'])}"
            )
        names = tuple(sorted(result))
        taken = [n for n in names if n == "loss" or n in self.stat_names]
        if taken:
            raise ConfigError(
                f"{where}: returned {taken[0]!r}, a name task.target's metrics (or the loss) "
                "have already; give it another name"
            )
        if self._derived_names is None:
            self._derived_names = names
        elif names != self._derived_names:
            raise ConfigError(
                f"{where}: returned {list(names)} after {list(self._derived_names)}; return "
                "the same names every time"
            )
        return {name: float(_scalar(where, name, result[name])) for name in names}


def class_indices(labels: Any) -> torch.Tensor:
    """A batch's labels as int64 class indices [batch]; refuses floats, text and several labels
    per sample in one line (cross_entropy's own errors name none of the fixes)."""
    where = "task=classification"
    if not isinstance(labels, torch.Tensor):
        raise DataError(
            f"{where}: the labels of a batch are a {type(labels).__name__} (text?), not a tensor; "
            "labels must be integer class indices: map class names to 0..num_classes-1 in your "
            "dataset"
        )
    if labels.dtype.is_floating_point or labels.dtype.is_complex:
        raise DataError(
            f"{where}: the labels are {str(labels.dtype).replace('torch.', '')} numbers; labels "
            "must be integer class indices (int, or a torch.long tensor, in each sample), or use "
            "task=regression for a numeric target"
        )
    if labels.dim() == 2 and labels.shape[1] == 1:
        labels = labels.reshape(-1)
    if labels.dim() != 1:
        raise DataError(
            f"{where}: the labels of a batch have shape {tuple(labels.shape)}; give one class "
            "index per sample (or use task=custom for several labels per sample)"
        )
    return labels if labels.dtype == torch.int64 else labels.long()


class CustomPrediction:
    """task.predict: the user's function(model, batch) -> a tensor or {name: tensor}, each
    with the batch's samples as its first dimension: the rows of `hpcdl predict` for a
    custom task. Names and per-sample shapes are fixed by the first batch."""

    def __init__(self, target: str, fn: Callable[..., Any]) -> None:
        self.target = target
        self.fn = fn
        self._shapes: dict[str, tuple[int, ...]] | None = None

    def outputs(self, model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        """name -> CPU tensor [samples, *per-sample shape]: float32/float64, or int64 for
        integer and bool outputs. A bare tensor is named 'predicted'."""
        where = f"task.predict={self.target!r}"
        try:
            result = self.fn(model, batch)
        except HpcdlError:
            raise
        except Exception as exc:  # the user's function, or the model it calls: one line
            raise ConfigError(
                f"{where}: {raised(exc)}; it is called as function(model, batch) with the "
                "batches task.target gets"
            ) from exc
        named = result if isinstance(result, Mapping) else {"predicted": result}
        if not named:
            raise ConfigError(f"{where}: returned {{}}; return a tensor or {{name: tensor}}")
        num_samples = _num_samples(batch)
        columns: dict[str, torch.Tensor] = {}
        for name, value in named.items():
            if not isinstance(name, str) or not name or name == "row":
                raise ConfigError(
                    f"{where}: output name {name!r}: use non-empty strings other than 'row'"
                )
            if not isinstance(value, (torch.Tensor, np.ndarray)):
                raise ConfigError(
                    f"{where}: output {name!r} is a {type(value).__name__}; return tensors with "
                    "one entry (or row) per sample of the batch"
                )
            value = torch.as_tensor(value)
            if value.dim() == 0 or (num_samples and value.shape[0] != num_samples):
                raise ConfigError(
                    f"{where}: output {name!r} has shape {tuple(value.shape)} for a batch of "
                    f"{num_samples} samples; return one entry (or row) per sample, the batch as "
                    "the first dimension"
                )
            columns[name] = _plain_values(where, name, value)
        if len({v.shape[0] for v in columns.values()}) > 1:
            sizes = {name: v.shape[0] for name, v in columns.items()}
            raise ConfigError(f"{where}: the outputs have different numbers of rows {sizes}")
        shapes = {name: tuple(v.shape[1:]) for name, v in columns.items()}
        if self._shapes is None:
            self._shapes = shapes
        elif shapes != self._shapes:
            ragged = [
                n
                for n, s in shapes.items()
                if s and s != self._shapes.get(n) and len(s) == len(self._shapes.get(n, ()))
            ]
            fix = (
                f"; a per-token output ({ragged[0]!r}: as long as each batch's padding) is "
                "padded to one fixed width, e.g. the data's longest sequence, with a fill "
                "value such as -1"
                if ragged
                else ""
            )
            raise ConfigError(
                f"{where}: returned per-sample shapes {shapes} after {self._shapes}; return the "
                f"same names and shapes for every batch{fix}"
            )
        return columns


def _plain_values(where: str, name: str, value: torch.Tensor) -> torch.Tensor:
    value = value.detach().cpu()
    if value.dtype.is_complex:
        raise ConfigError(f"{where}: output {name!r} is complex; return real numbers")
    if value.dtype.is_floating_point:
        return value if value.dtype == torch.float64 else value.float()
    return value.long()


def build_prediction(cfg: CustomTaskConfig) -> CustomPrediction:
    """task.predict, imported (the caller refuses a config that has none)."""
    if cfg.predict is None:
        raise ConfigError("task.predict is not set; name a function(model, batch) -> tensor")
    return CustomPrediction(cfg.predict, resolve_callable("task.predict", cfg.predict))


def input_and_target(batch: Any, task: str = "classification") -> tuple[torch.Tensor, torch.Tensor]:
    """The (x, y) of a batch given as a pair or as a dict with x/y or input/target keys."""
    pair = input_target_pair(batch)
    if pair is not None:
        return pair
    raise DataError(
        f"task={task}: a batch is a {type(batch).__name__}; the built-in tasks need "
        "(input, label) samples or dicts with 'x'/'y' keys (or use task=custom with your own step)"
    )


def _num_samples(batch: Any) -> int:
    """The leading size of the batch's first tensor (1 for a scalar; 0 for none)."""
    shape = first_array_shape(batch)
    if shape is None:
        return 0
    return shape[0] if shape else 1


def _scalar(where: str, name: str, value: Any, role: str = "") -> Any:
    what = role or f"metric {name!r}"
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ConfigError(
                f"{where}: {what} has shape {tuple(value.shape)}; return "
                f"{'one number' if role else 'the batch mean'} as a scalar"
            )
        return value.detach().reshape(())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if type(value).__module__ == "numpy" and getattr(value, "size", 0) == 1:
        kind = getattr(getattr(value, "dtype", None), "kind", "")
        if kind and kind in "iuf":  # a NumPy number (np.float32, a 0-d array), not a bool or string
            return float(value)
    raise ConfigError(f"{where}: {what} is {value!r}; return a number or scalar tensor")


def check_monitor(monitor: str, task: Task) -> None:
    """trainer.early_stopping.monitor must name a metric the task reports (a custom task's
    names are known once it has run on a batch)."""
    metric = monitor.partition("_")[2]
    names = task.metric_names
    if metric != "loss" and metric not in names:
        choices = [f"{s}_{m}" for s in ("val", "train") for m in ("loss", *names)]
        raise ConfigError(
            f"trainer.early_stopping.monitor={monitor!r}: {did_you_mean(monitor, choices)}"
            f"task={task.name} reports {', '.join(choices)}; choose one of those"
        )


def build_task(
    cfg: TaskConfig,
    target_stats: Optional[tuple[float, float]] = None,
    num_classes: Optional[int] = None,
) -> Task:
    """target_stats: (mean, std) of the training targets, for task=regression's
    standardize_target (the feed's; None for datasets, which are not standardized).
    num_classes: the data's, which a classifier's outputs must match (None: unchecked)."""
    if isinstance(cfg, ClassificationTaskConfig):
        return ClassificationTask(num_classes)
    if isinstance(cfg, RegressionTaskConfig):
        mean, std = target_stats if cfg.standardize_target and target_stats else (0.0, 1.0)
        return RegressionTask(cfg.loss, mean, std)
    if isinstance(cfg, CustomTaskConfig):
        fn = resolve_callable("task.target", cfg.target)
        if cfg.kwargs:
            check_step_kwargs("task", cfg.target, fn, dict(cfg.kwargs))
            fn = functools.partial(fn, **cfg.kwargs)
        derived = None
        if cfg.derived:
            derived = (cfg.derived, resolve_callable("task.derived", cfg.derived))
        return CustomTask(cfg.target, fn, derived)
    raise ConfigError(f"task.name={getattr(cfg, 'name', cfg)!r}: unknown task")
