"""Models: build_model(cfg, input_shape, num_classes) -> nn.Module returning logits."""

from hpcdl.models.build import build_model

__all__ = ["build_model"]
