"""Evaluation on a split, and loading weights into a model with a clear shape check."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hpcdl.dist import all_reduce_sum
from hpcdl.errors import CheckpointError

# Samples per forward pass during evaluation, per rank.
EVAL_BATCH_SIZE = 512


@dataclass
class EvalResult:
    loss: float
    accuracy: float
    num_samples: int
    confusion: torch.Tensor  # [true, predicted], int64, summed over ranks


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    *,
    rank: int = 0,
    world_size: int = 1,
    autocast_dtype: torch.dtype | None = None,
) -> EvalResult:
    """Each rank evaluates samples rank::world_size; sums are reduced over ranks.

    Call with the plain (un-wrapped) model: DDP's forward is a collective and ranks may run
    a different number of batches here.
    """
    was_training = model.training
    model.eval()
    device = x.device
    idx = torch.arange(rank, x.shape[0], world_size, device=device)
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, count
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64, device=device)
    for start in range(0, idx.numel(), EVAL_BATCH_SIZE):
        batch = idx[start : start + EVAL_BATCH_SIZE]
        xb, yb = x[batch], y[batch]
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logits = model(xb)
        sums[0] += F.cross_entropy(logits.float(), yb, reduction="sum").double()
        sums[1] += yb.numel()
        confusion += confusion_matrix(logits.argmax(dim=1), yb, num_classes)
    all_reduce_sum(sums)
    all_reduce_sum(confusion)
    model.train(was_training)
    count = int(sums[1].item())
    matrix = confusion.cpu()
    correct = int(matrix.diagonal().sum().item())
    return EvalResult(
        loss=float(sums[0].item()) / max(count, 1),
        accuracy=correct / max(count, 1),
        num_samples=count,
        confusion=matrix,
    )


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
