"""What every source reader returns: raw arrays before splitting and preprocessing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass
class RawData:
    x: np.ndarray  # [N, *input_shape]: raw values (uint8 pixels or float features)
    y: np.ndarray  # int64 [N], in [0, len(class_names)); float32 regression targets
    class_names: list[str]  # [] for regression targets
    # Multiplies raw values into model units: 1/255 for 8-bit pixels, 1/16 for digits.
    pixel_scale: float = 1.0
    # The official test split, for sources that ship one (mnist, cifar10).
    x_test: Optional[np.ndarray] = None
    y_test: Optional[np.ndarray] = None
    # A CSV's header: the feature columns' names (in x's order) and the label column's, so
    # that `hpcdl predict` can pick an input CSV's columns by name. None without a header.
    feature_columns: Optional[list[str]] = None
    label_column: Optional[str] = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.x.shape[1:])

    @property
    def is_regression(self) -> bool:
        return not self.class_names

    @property
    def has_official_test(self) -> bool:
        return self.x_test is not None
