"""Value checks shared by the model builders; each error names the config key."""

from __future__ import annotations

from collections.abc import Sequence

from hpcdl.errors import ConfigError


def require_positive(key: str, value: int) -> None:
    if value <= 0:
        raise ConfigError(f"{key}={value}: must be > 0")


def require_positive_list(key: str, values: Sequence[int]) -> None:
    for i, value in enumerate(values):
        require_positive(f"{key}[{i}]", value)


def require_dropout(key: str, value: float) -> None:
    if not 0 <= value < 1:
        raise ConfigError(f"{key}={value}: must be in [0, 1)")


def require_image_shape(model_name: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ConfigError(
            f"model={model_name} needs image input [C, H, W], the data gives {input_shape}; "
            "use data with images, e.g. data.as_images=true (digits, mnist) or data=cifar10"
        )
    channels, height, width = input_shape
    return channels, height, width
