"""trainer.micro_batches: one optimizer step's batch run as K forward/backward passes of
about batch/K samples each (gradient accumulation), so a step needs the activation memory
of a K-th of its batch. The step, its sampler positions, flags, sums and checkpoints stay
the batch's: a resume is as exact as without, and the gradient is the batch's (the passes'
gradients add up to it; only the order of the float sums differs).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hpcdl.samples import first_array_shape
from hpcdl.tasks import BatchStats


def split_batch(batch: Any, parts: int) -> list[Any]:
    """The batch as up to `parts` micro-batches of near-equal sizes (fewer when it has
    fewer samples; empty ones are dropped). Every tensor, array or per-sample list whose
    leading size is the batch's number of samples (its first tensor's) is sliced; tuples,
    lists and dicts of them are followed; anything else goes whole into each part."""
    shape = first_array_shape(batch)
    n = (shape[0] if shape else 1) if shape is not None else 0
    if parts <= 1 or n <= 1:
        return [batch]
    size, extra = divmod(n, parts)
    bounds, start = [], 0
    for index in range(min(parts, n)):
        stop = start + size + (1 if index < extra else 0)
        bounds.append((start, stop))
        start = stop
    return [_sliced(batch, n, a, b) for a, b in bounds]


def _sliced(value: Any, n: int, start: int, stop: int) -> Any:
    shape = getattr(value, "shape", None)
    if shape is not None and not isinstance(value, (str, bytes)):
        return value[start:stop] if len(shape) >= 1 and shape[0] == n else value
    if isinstance(value, Mapping):
        return type(value)({k: _sliced(v, n, start, stop) for k, v in value.items()})  # type: ignore[call-arg]
    if isinstance(value, (tuple, list)):
        if value and not any(_holds_arrays(v) for v in value) and len(value) == n:
            return value[start:stop]  # per-sample leaves (file names, texts)
        items = [_sliced(v, n, start, stop) for v in value]
        return type(value)(items) if not hasattr(value, "_fields") else type(value)(*items)
    return value


def _holds_arrays(value: Any) -> bool:
    return first_array_shape(value) is not None


def combined(outs: list[BatchStats]) -> BatchStats:
    """The micro-batches' statistics as the batch's (their losses detached: each pass's
    graph is freed by its own backward)."""
    if len(outs) == 1:
        return outs[0]
    loss = torch.stack([o.loss_sum.detach().float() for o in outs]).sum()
    stats: dict[str, Any] = {}
    for out in outs:
        for name, value in out.stats.items():
            stats[name] = value if name not in stats else stats[name] + value
    counts = [o.loss_count for o in outs]
    outputs = [o.outputs for o in outs]
    targets = [o.targets for o in outs]
    return BatchStats(
        loss,
        sum(o.num_samples for o in outs),
        stats,
        torch.cat([t.detach() for t in outputs if t is not None])
        if all(t is not None for t in outputs)
        else None,
        torch.cat([t for t in targets if t is not None])
        if all(t is not None for t in targets)
        else None,
        loss_count=None if any(c is None for c in counts) else sum(counts),  # type: ignore[arg-type]
    )
