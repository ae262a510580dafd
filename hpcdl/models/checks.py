"""The data-shape check shared by the image model builders (value ranges live in
hpcdl.config.validate, which build_model runs first)."""

from __future__ import annotations

from hpcdl.errors import ConfigError


def require_image_shape(model_name: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ConfigError(
            f"model={model_name} needs image input [C, H, W], the data gives {input_shape}; "
            "use data with images, e.g. data.as_images=true (digits, mnist) or data=cifar10"
        )
    channels, height, width = input_shape
    return channels, height, width
