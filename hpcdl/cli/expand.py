"""`hpcdl train -m`: Hydra's sweep syntax -> one validated Config per trial.

Lists (a=1,2), range(0,5), choice(...), glob(*) on config groups: expanded with Hydra's
own parser, as Hydra's basic sweeper does. Every trial is composed and validated before
anything is created or submitted; a bad trial is refused naming the trial and the key.
Hydra composes once per distinct set of group choices (hpcdl.cli.compose.SweepComposer),
not once per trial.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from hpcdl.cli.compose import (
    SweepComposer,
    conf_dir,
    hydra_message,
    naming,
    refuse_hydra_settings,
    user_conf_dirs,
)
from hpcdl.config.convert import GROUPS, PRESET_GROUPS
from hpcdl.errors import ConfigError
from hpcdl.number_ranges import range_values
from hpcdl.sweep.plan import SweepPlan, Trial

SWEEP_DIR_KEY = "hydra.sweep.dir"


def _group_options(group: str, config_dirs: Optional[list[str]]) -> list[str]:
    dirs = [conf_dir(), *user_conf_dirs(config_dirs)]
    return sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml")})


@dataclass
class Expansion:
    sweep_dir: Optional[str]
    common: list[str]  # overrides shared by every trial
    swept_keys: list[str]
    combos: list[list[str]]  # per trial: every override, in the order given


def _every_trials(err: ConfigError, composer: SweepComposer, common: list[str]) -> bool:
    """Whether the shared overrides alone (no swept value) are refused the same way."""
    try:
        composer.config(common)
    except ConfigError as alone:
        return str(alone) == str(err)
    return False


def plan_sweep(overrides: list[str], config_dirs: Optional[list[str]] = None) -> SweepPlan:
    """One validated Config per trial, in the order of Hydra's basic sweeper."""
    expansion = expand_sweep(overrides, config_dirs)
    composer = SweepComposer(config_dirs)
    trials = []
    for index, combo in enumerate(expansion.combos):
        swept_part = [c for c in combo if c.split("=", 1)[0].lstrip("+~") in expansion.swept_keys]
        try:
            config = composer.config(combo)
        except ConfigError as err:
            if index == 0 and _every_trials(err, composer, expansion.common):
                raise  # a key every trial shares: no one trial's fault
            raise ConfigError(f"trial {index} ({' '.join(swept_part)}): {err}") from None
        trials.append(Trial(index=index, overrides=swept_part, config=config))
    return SweepPlan(
        sweep_dir=expansion.sweep_dir,
        common=expansion.common,
        swept_keys=expansion.swept_keys,
        trials=trials,
    )


def expand_sweep(overrides: list[str], config_dirs: Optional[list[str]] = None) -> Expansion:
    """The trials' override lists, before anything is composed."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob
    from hydra.errors import HydraException

    sweep_dir = None
    rest = []
    for text in overrides:
        if text.startswith(SWEEP_DIR_KEY + "="):
            sweep_dir = text.split("=", 1)[1]
        elif text.startswith("run_dir="):
            raise ConfigError(
                "run_dir: a sweep gives each trial its own run dir under the sweep dir; "
                f"set {SWEEP_DIR_KEY}=... instead"
            )
        else:
            rest.append(text)
    refuse_hydra_settings(rest, multirun=True)  # once, not as trial 0's
    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(rest)
    except HydraException as err:
        raise ConfigError(naming(hydra_message(err, rest), rest)) from None

    refuse_repeated_sweeps(parsed, rest)
    rewritten: list[str] = []
    swept: list[str] = []
    common: list[str] = []
    for ov, text in zip(parsed, rest, strict=True):
        key = ov.key_or_group
        if not ov.is_sweep_override():
            rewritten.append(text)
            common.append(text)
            continue
        if ov.is_interval_sweep():
            raise ConfigError(
                f"{text}: interval() is a range for an adaptive search to sample from, "
                "which hpcdl's sweeps do not do; give the values to try, e.g. "
                f"{key}=0.01,0.03,0.1 or tag(log,...) around such a list"
            )
        value = ov.value()
        if isinstance(value, Glob):
            if key not in GROUPS and key not in PRESET_GROUPS:
                groups = ", ".join((*GROUPS, *PRESET_GROUPS))
                raise ConfigError(f"{text}: glob() works on config groups ({groups})")
            matched = value.filter(_group_options(key, config_dirs))
            if not matched:
                raise ConfigError(f"{text}: the glob matches no {key} option")
            rewritten.append(f"{key}={','.join(matched)}")
        else:
            values = list(ov.sweep_string_iterator())
            decimal = decimal_range(value)
            if decimal is not None:
                values = decimal
            if not values:
                raise ConfigError(f"{text}: empty sweep for {key}; give at least one value")
            rewritten.append(text if decimal is None else f"{key}={_as_choice(value, decimal)}")
        swept.append(key)
    if not swept:
        lists = [t for ov, t in zip(parsed, rest, strict=True) if isinstance(ov.value(), list)]
        if lists:  # optim.lr=[0.1,0.01]: one value, a list
            name, listed = lists[0].split("=", 1)
            raise ConfigError(
                f"no swept key: {lists[0]} is one value (a list); to try each, write "
                f"{name}={listed.strip('[]')}"
            )
        # A value the single config refuses (`optim.lr=` alone) is the first thing to fix.
        SweepComposer(config_dirs).config(rest)
        raise ConfigError(
            "no swept key; give the values to try as a=1,2, range(0,5), choice(...) or glob(*)"
        )
    batches = BasicSweeper.split_arguments(parser.parse_overrides(rewritten), None)
    combos = [c for batch in batches for c in batch]
    return Expansion(sweep_dir=sweep_dir, common=common, swept_keys=swept, combos=combos)


def decimal_range(value: Any) -> Optional[list[str]]:
    """A range() with a float in it as people mean it (hpcdl.number_ranges.range_values:
    Hydra's gave 0.30000000000000004, and range(0.7,1.0,0.1) ended with 1.0, the stop), or
    None for any other sweep."""
    from hydra.core.override_parser.types import RangeSweep

    if not isinstance(value, RangeSweep):
        return None
    start, stop, step = value.start, value.stop, value.step
    if start is None or stop is None or not step:  # Hydra's own errors for these
        return None
    if not any(isinstance(v, float) for v in (start, stop, step)):
        return None
    return range_values(start, stop, step)


def _as_choice(value: Any, values: list[str]) -> str:
    """The range's values as an explicit sweep, with its shuffle() and tag()s."""
    text = f"choice({','.join(values)})"
    if value.shuffle:
        text = f"shuffle({text})"
    if value.tags:
        text = f"tag({','.join(sorted(value.tags))},{text})"
    return text


def refuse_repeated_sweeps(parsed: list[Any], texts: list[str]) -> None:
    """A swept key given twice (`optim.lr=0.1,0.2 optim.lr=0.3`: Hydra's basic sweeper
    keeps the last alone, silently) or a value twice in one sweep (`optim.lr=0.1,0.1`,
    `0.1,1e-1`: two trials alike), refused in one line. A key that is swept nowhere may
    repeat: the last value wins, as for a single run."""
    from hydra.core.override_parser.types import Glob

    given: dict[str, list[str]] = {}
    swept: set[str] = set()
    for ov, text in zip(parsed, texts, strict=True):
        key = ov.key_or_group
        given.setdefault(key, []).append(text)
        if not ov.is_sweep_override():
            continue
        swept.add(key)
        if ov.is_interval_sweep() or isinstance(ov.value(), Glob):
            continue
        values: dict[str, str] = {}
        repeat = None
        for value, shown in zip(ov.sweep_iterator(), ov.sweep_string_iterator(), strict=True):
            same = _comparable(value)
            if same in values and repeat is None:
                first = values[same]
                repeat = shown if first == shown else f"{first} and {shown} are one value;"
            values.setdefault(same, shown)
        if repeat is not None:
            what = repeat if repeat.endswith(";") else f"{repeat} is given twice;"
            raise ConfigError(
                f"{text}: {what} give each value of {key} once ({key}={','.join(values.values())})"
            )
    for key in swept:
        if len(given[key]) > 1:
            lists = [t.split("=", 1)[1] for t in given[key]]
            merged = "" if any("(" in v for v in lists) else f" ({key}={','.join(lists)})"
            times = "twice" if len(lists) == 2 else f"{len(lists)} times"
            raise ConfigError(
                f"{' '.join(given[key])}: {key} is given {times} (Hydra's sweep would keep the "
                f"last alone); give all its values in one override{merged}"
            )


def _comparable(value: Any) -> str:
    """A swept value as compared for repeats: 0.1 and 1e-1 alike, 1 and true not."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, (int, float)):
        return f"number {float(value)!r}"
    return repr(value)
