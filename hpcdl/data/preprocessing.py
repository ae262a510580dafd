"""The fitted input transform: pixel scaling, then standardization with train-split stats."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import torch

from hpcdl.errors import CheckpointError, DataError

StateValue = Union[torch.Tensor, int, float, str, list[int]]
# Samples per chunk when fitting: bounds the float64 copy (CIFAR: 4096 x 3072 x 8 B = 100 MB).
FIT_CHUNK_NUM_SAMPLES = 4096
# Samples with 3 dims are images [C, H, W], standardized per channel.
IMAGE_NUM_DIMS = 3


@dataclass
class Preprocessing:
    """model input = (raw * scale - mean) / std, with mean/std broadcast over the sample.

    Images [C, H, W] have per-channel mean/std of shape [C, 1, 1]; other inputs one per
    feature, of the per-sample shape. Without standardization mean is 0 and std is 1.
    """

    input_shape: tuple[int, ...]
    scale: float
    mean: torch.Tensor  # float32
    std: torch.Tensor  # float32

    @classmethod
    def fit(cls, x_train: np.ndarray, *, scale: float, standardize: bool) -> Preprocessing:
        input_shape = tuple(int(s) for s in x_train.shape[1:])
        stats_shape = per_channel_shape(input_shape) if is_image(input_shape) else input_shape
        mean = torch.zeros(stats_shape, dtype=torch.float64)
        std = torch.ones(stats_shape, dtype=torch.float64)
        if standardize and x_train.shape[0] > 0:
            mean, std = fit_mean_std(x_train, scale, stats_shape)
        return cls(input_shape, float(scale), mean.float(), std.float())

    def apply(self, x: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Raw samples [N, *input_shape] (or [N, num_features]) -> float32 model input."""
        tensor = to_tensor(x) if isinstance(x, np.ndarray) else x
        if tuple(tensor.shape[1:]) != self.input_shape:
            if tensor.dim() < 1 or tensor.shape[1:].numel() != int(np.prod(self.input_shape)):
                raise DataError(
                    f"features of shape {tuple(tensor.shape)} do not fit the model's "
                    f"input_shape {self.input_shape}"
                )
            tensor = tensor.reshape(-1, *self.input_shape)
        out = tensor.to(torch.float32) * self.scale  # a new tensor: the input stays untouched
        mean, std = self.mean.to(out.device), self.std.to(out.device)
        return out.sub_(mean).div_(std)

    def state_dict(self) -> dict[str, StateValue]:
        return {
            "input_shape": list(self.input_shape),
            "scale": self.scale,
            "mean": self.mean.clone(),
            "std": self.std.clone(),
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> Preprocessing:
        try:
            return cls(
                input_shape=tuple(int(s) for s in state["input_shape"]),
                scale=float(state["scale"]),
                mean=torch.as_tensor(state["mean"], dtype=torch.float32),
                std=torch.as_tensor(state["std"], dtype=torch.float32),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(
                f"checkpoint 'preprocessing' entry is incomplete ({exc!r}); "
                "use a checkpoint written by hpcdl train"
            ) from exc


def to_tensor(x: np.ndarray) -> torch.Tensor:
    x = np.ascontiguousarray(x)
    # torch warns on read-only arrays (np.frombuffer, np.load mmap); apply never writes to it.
    return torch.from_numpy(x if x.flags.writeable else x.copy())


def is_image(input_shape: tuple[int, ...]) -> bool:
    return len(input_shape) == IMAGE_NUM_DIMS


def per_channel_shape(input_shape: tuple[int, ...]) -> tuple[int, ...]:
    return (input_shape[0], *([1] * (len(input_shape) - 1)))


def fit_mean_std(
    x: np.ndarray, scale: float, stats_shape: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Population mean/std (ddof=0, as sklearn's StandardScaler) over the dims that
    stats_shape broadcasts, in float64 and two passes; a constant's std becomes 1."""
    dims = [0] + [d + 1 for d, size in enumerate(stats_shape) if size == 1 and x.shape[d + 1] != 1]
    count = x.shape[0] * int(np.prod([x.shape[d] for d in dims[1:]]))

    def chunks() -> Any:
        for start in range(0, x.shape[0], FIT_CHUNK_NUM_SAMPLES):
            chunk = to_tensor(x[start : start + FIT_CHUNK_NUM_SAMPLES])
            yield chunk.to(torch.float64) * scale

    total = torch.zeros(stats_shape, dtype=torch.float64)
    for chunk in chunks():
        total += chunk.sum(dim=dims, keepdim=True)[0]
    mean = total / count
    squares = torch.zeros(stats_shape, dtype=torch.float64)
    for chunk in chunks():
        squares += (chunk - mean).square().sum(dim=dims, keepdim=True)[0]
    std = (squares / count).sqrt()
    # A constant feature can get std ~1e-16 * |mean| from rounding; treat it as 0 as well.
    constant = std <= 10 * torch.finfo(torch.float64).eps * mean.abs()
    return mean, torch.where(constant, torch.ones_like(std), std)
