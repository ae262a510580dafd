"""Evaluation on a split, and loading weights into a model with a clear shape check."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from hpcdl.dist import all_gather_objects, all_reduce_sum
from hpcdl.errors import CheckpointError
from hpcdl.step_sums import Value, mean_of
from hpcdl.tasks import ClassificationTask, Task


@dataclass
class EvalResult:
    loss: float
    metrics: dict[str, float]  # the task's metrics, e.g. {"accuracy": 0.97}
    num_samples: int
    confusion: Optional[torch.Tensor] = None  # classification: [true, predicted], int64
    # With keep_predictions, on every rank: (predictions, targets) of all ranks' samples.
    predictions: Optional[tuple[torch.Tensor, torch.Tensor]] = None

    @property
    def accuracy(self) -> Optional[float]:
        return self.metrics.get("accuracy")


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[Any],
    task: Task,
    num_classes: int,
    device: torch.device,
    *,
    autocast_dtype: torch.dtype | None = None,
    keep_predictions: bool = False,
) -> EvalResult:
    """Sums over this rank's batches, reduced over ranks (the feed gives each rank its
    share of the split).

    Call with the plain (un-wrapped) model: DDP's forward is a collective and ranks may run
    a different number of batches here.
    """
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    stats: dict[str, Value] = {}
    count = 0
    loss_count = torch.zeros((), dtype=torch.float64, device=device)  # samples, or the step's count
    classify = isinstance(task, ClassificationTask)
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64, device=device)
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    for batch in batches:
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            out = task.batch_stats(model, batch)
        loss_sum += out.loss_sum.double()
        count += out.num_samples
        loss_count += out.loss_weight
        for name in task.stat_names:
            value = out.stats[name]
            stats[name] = stats.get(name, 0.0) + (
                value.double() if isinstance(value, torch.Tensor) else value
            )
        if classify and out.outputs is not None and out.targets is not None:
            confusion += confusion_matrix(out.outputs.argmax(dim=1), out.targets, num_classes)
        if keep_predictions and out.outputs is not None and out.targets is not None:
            kept.append((out.outputs.detach().float().cpu(), out.targets.float().cpu()))
    names = task.stat_names
    packed = torch.stack(
        [
            loss_sum,
            torch.tensor(float(count), dtype=torch.float64, device=device),
            loss_count,
            *[
                torch.as_tensor(stats.get(n, 0.0), dtype=torch.float64, device=device)
                for n in names
            ],
        ]
    )
    all_reduce_sum(packed)
    if classify:
        all_reduce_sum(confusion)
    model.train(was_training)
    predictions = _gathered(kept) if keep_predictions else None
    values = packed.tolist()
    total = values[1]
    loss = mean_of(values[0], values[2])
    return EvalResult(
        loss=loss,
        metrics=task.metrics(dict(zip(names, values[3:], strict=True)), total, loss),
        num_samples=int(total),
        confusion=confusion.cpu() if classify else None,
        predictions=predictions,
    )


def _gathered(
    kept: list[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's (predictions, targets), concatenated over all ranks."""
    local = (
        torch.cat([p.reshape(len(p), -1) for p, _ in kept]) if kept else torch.empty(0, 1),
        torch.cat([t.reshape(-1) for _, t in kept]) if kept else torch.empty(0),
    )
    parts = all_gather_objects(local)
    return torch.cat([p for p, _ in parts]), torch.cat([t for _, t in parts])


def confusion_matrix(preds: torch.Tensor, targets: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Counts indexed [true class, predicted class], int64, on the inputs' device."""
    preds = preds.reshape(-1).long()
    targets = targets.reshape(-1).long()
    if preds.shape != targets.shape:
        raise ValueError(f"preds has {preds.numel()} values but targets has {targets.numel()}")
    for name, values in (("preds", preds), ("targets", targets)):
        if values.numel() and (values.min() < 0 or values.max() >= num_classes):
            raise ValueError(f"{name} holds a class outside [0, {num_classes})")
    counts = torch.bincount(targets * num_classes + preds, minlength=num_classes * num_classes)
    return counts.reshape(num_classes, num_classes)


def load_matching_weights(model: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Load `state` into `model`, refusing (naming the first mismatch) unless every key and
    shape matches."""
    own = model.state_dict()
    for key, tensor in own.items():
        if key not in state:
            raise CheckpointError(f"{source}: model does not match: parameter {key!r} is missing")
        if tuple(state[key].shape) != tuple(tensor.shape):
            raise CheckpointError(
                f"{source}: model does not match: parameter {key!r} has shape "
                f"{tuple(state[key].shape)} in the checkpoint but {tuple(tensor.shape)} in the model"
            )
    extra = [k for k in state if k not in own]
    if extra:
        raise CheckpointError(
            f"{source}: model does not match: checkpoint has parameter {extra[0]!r} "
            "that the model lacks"
        )
    model.load_state_dict(dict(state))
