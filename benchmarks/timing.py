"""Interleaved repeats and medians: how every figure of the suite is measured.

On a shared or noisy machine (2 cores here, other jobs beside us) a slow drift hits
whatever runs at that moment. Running the candidates in turn (A, B, A, B, ...) spreads the
drift over all of them alike; a figure is the median over rounds of each round's ratio,
which ignores the odd disturbed round.
The first rounds are warm-up (imports, page cache, first fork of DataLoader workers) and
are dropped.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

T = TypeVar("T")


def interleaved(
    candidates: Mapping[str, Callable[[], T]], repeats: int, warmup_rounds: int = 1
) -> dict[str, list[T]]:
    """Each candidate's results over `repeats` rounds; a round calls every candidate once,
    in the mapping's order. The first `warmup_rounds` rounds run but are not returned."""
    if repeats < 1:
        raise ValueError(f"--repeats {repeats}: must be >= 1")
    results: dict[str, list[T]] = {name: [] for name in candidates}
    for round_index in range(warmup_rounds + repeats):
        for name, call in candidates.items():
            value = call()
            if round_index >= warmup_rounds:
                results[name].append(value)
    return results


@dataclass(frozen=True)
class Summary:
    median: float
    low: float
    high: float
    values: tuple[float, ...]

    def as_dict(self, digits: int = 6) -> dict[str, Any]:
        out = asdict(self)
        out["values"] = [round(v, digits) for v in self.values]
        return {k: round(v, digits) if isinstance(v, float) else v for k, v in out.items()}


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        raise ValueError("no values to summarize")
    return Summary(statistics.median(values), min(values), max(values), tuple(values))


def paired_ratios(measured: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """measured[i] / baseline[i] per round: their spread shows how noisy the figure is."""
    return [m / b for m, b in zip(measured, baseline, strict=True)]


def median_ratio(measured: Sequence[float], baseline: Sequence[float]) -> float:
    """The figure a row reports: the median over rounds of each round's ratio. The two
    values of a round ran back to back, so a drift between rounds cancels in their ratio,
    which a ratio of the two medians (taken from different rounds) would not do."""
    return statistics.median(paired_ratios(measured, baseline))


def compared(measured: Sequence[float], baseline: Sequence[float]) -> dict[str, Any]:
    """A row's figure and details: the median round ratio, both sides' seconds, and every
    round's ratio (their spread shows how noisy the figure is)."""
    return {
        "ratio": median_ratio(measured, baseline),
        "measured_s": summarize(measured).as_dict(),
        "baseline_s": summarize(baseline).as_dict(),
        "round_ratios": [round(r, 4) for r in paired_ratios(measured, baseline)],
    }
