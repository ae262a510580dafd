"""mylab: a small cell-segmentation project (models, data on disk, a training step)."""
