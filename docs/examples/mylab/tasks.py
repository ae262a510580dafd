"""Training steps: (model, batch) -> (mean loss, {metric: batch mean})."""

import torch
import torch.nn.functional as F


def segmentation_step(model, batch: dict, pos_weight: float = 1.0):
    """Binary segmentation: per-pixel BCE; Dice and pixel accuracy of the thresholded
    prediction (each sample's Dice, averaged over the batch)."""
    image, mask = batch["image"], batch["mask"]
    logits = model(image).float()
    weight = torch.tensor(pos_weight, device=logits.device)
    loss = F.binary_cross_entropy_with_logits(logits, mask, pos_weight=weight)
    with torch.no_grad():
        pred = (logits > 0).float()  # sigmoid(logits) > 0.5
        dims = tuple(range(1, pred.dim()))
        overlap = (pred * mask).sum(dims)
        total = pred.sum(dims) + mask.sum(dims)
        dice = ((2 * overlap + 1) / (total + 1)).mean()  # +1: an empty mask predicted empty is 1
        accuracy = (pred == mask).float().mean()
    return loss, {"dice": dice, "pixel_accuracy": accuracy}
