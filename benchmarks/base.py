"""What a benchmark gets (Settings) and what it returns (Rows)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TextIO


@dataclass(frozen=True)
class Settings:
    smoke: bool  # tiny sizes: checks that the benchmark runs, measures nothing
    repeats: int  # measured rounds, after the warm-up rounds
    warmup_rounds: int  # rounds run first and dropped (imports, page cache, first fork)
    work_dir: Path  # scratch space: data files, run dirs
    log: TextIO  # hpcdl's console output goes here, not to the terminal


@dataclass
class Row:
    """One figure: `ratio` = what hpcdl takes / what the baseline takes, both measured in
    the same run (1.0 = as fast; lower is better)."""

    id: str
    what: str  # what is timed, for hpcdl
    baseline: str  # what the ratio divides by
    ratio: float
    goal: Optional[float]  # the ratio should be <= goal; None: reported, without a goal
    details: dict[str, Any] = field(default_factory=dict)  # seconds, sizes, per-round ratios

    @property
    def meets_goal(self) -> Optional[bool]:
        return None if self.goal is None else self.ratio <= self.goal


Benchmark = Callable[[Settings], list[Row]]
