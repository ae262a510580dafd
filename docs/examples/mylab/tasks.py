"""Training steps: (model, batch) -> (mean loss, {metric: batch mean}); and what to
predict per image: (model, batch) -> {name: one value per image}."""

import torch
import torch.nn.functional as F


def dice_per_image(pred: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each image's Dice of a 0/1 prediction; +1 on both sides: an empty mask predicted
    empty is 1."""
    dims = tuple(range(1, pred.dim()))
    overlap = (pred * mask).sum(dims)
    total = pred.sum(dims) + mask.sum(dims)
    return (2 * overlap + 1) / (total + 1)


def segmentation_step(model, batch: dict, pos_weight: float = 1.0):
    """Binary segmentation: per-pixel BCE; Dice and pixel accuracy of the thresholded
    prediction (each sample's Dice, averaged over the batch)."""
    image, mask = batch["image"], batch["mask"]
    logits = model(image).float()
    weight = torch.tensor(pos_weight, device=logits.device)
    loss = F.binary_cross_entropy_with_logits(logits, mask, pos_weight=weight)
    with torch.no_grad():
        pred = (logits > 0).float()  # sigmoid(logits) > 0.5
        dice = dice_per_image(pred, mask).mean()
        accuracy = (pred == mask).float().mean()
    return loss, {"dice": dice, "pixel_accuracy": accuracy}


def cell_fractions(model, batch: dict):
    """Per image: the fraction of pixels predicted to be cell and the mean cell probability;
    with the true fraction and the Dice when the batch has masks (a labelled split)."""
    image = batch["image"]
    probability = torch.sigmoid(model(image).float())
    pred = (probability > 0.5).float()
    dims = tuple(range(1, pred.dim()))
    out = {"cell_fraction": pred.mean(dims), "mean_probability": probability.mean(dims)}
    if "mask" in batch:
        out["true_cell_fraction"] = batch["mask"].mean(dims)
        out["dice"] = dice_per_image(pred, batch["mask"])
    return out


def huber_step(model, batch, delta: float = 1.0):
    """A numeric target with your own loss (task.labels=numbers: y is float32 in the
    target's units): the Huber loss, and the mean absolute error as a metric."""
    x, y = batch
    pred = model(x).float().squeeze(-1)
    loss = F.huber_loss(pred, y, delta=delta)
    return loss, {"mae": (pred - y).abs().mean()}
