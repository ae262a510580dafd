"""The forms of a sample (or a batch of them) that the built-in tasks understand."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

# Dict samples: the first pair of keys present names the input and the target.
PAIR_KEYS = (("x", "y"), ("input", "target"))


def input_target_pair(value: Any) -> Optional[tuple[Any, Any]]:
    """(input, target) of an (x, y) tuple/list or of a dict with x/y or input/target keys;
    None for any other form (a custom task may still use it)."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return value[0], value[1]
    if isinstance(value, Mapping):
        for x_key, y_key in PAIR_KEYS:
            if x_key in value and y_key in value:
                return value[x_key], value[y_key]
    return None


def first_array_shape(batch: Any) -> Optional[tuple[int, ...]]:
    """The shape of a batch's first tensor (or array), depth-first through tuples, lists and
    dict values: its leading size is what hpcdl counts as the batch's number of samples
    (hpcdl.tasks). None when the batch holds none."""
    shape = getattr(batch, "shape", None)
    if shape is not None and not isinstance(batch, (str, bytes)):
        return tuple(int(s) for s in shape)
    values = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(values, (tuple, list)) or isinstance(batch, Mapping):
        for value in values:
            found = first_array_shape(value)
            if found is not None:
                return found
    return None
