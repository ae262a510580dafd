"""What a sweep will run: one validated Config per trial (made by `hpcdl train -m`'s
expansion in hpcdl.cli.expand, consumed by hpcdl.sweep.launch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hpcdl.config.schema import Config


@dataclass
class Trial:
    index: int
    overrides: list[str]  # the swept overrides only, e.g. ["model=cnn", "optim.lr=0.1"]
    config: Config


@dataclass
class SweepPlan:
    sweep_dir: Optional[str]
    common: list[str]  # overrides shared by every trial
    swept_keys: list[str]
    trials: list[Trial]
