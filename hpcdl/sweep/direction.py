"""Which way a sweep's metric ranks: lowest first (min) or highest first (max).

In order: `--mode`; the trials' trainer.early_stopping.mode (auto resolved) when the metric
is their monitor (on any split, or summary.json's best_metric); the built-in metrics'
(hpcdl.config.metrics); else a guess from the name. Stdlib only (login node)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from hpcdl.config.metrics import builtin_mode, guessed_mode, monitor_mode, unprefixed
from hpcdl.config.schema import Mode
from hpcdl.errors import HpcdlError
from hpcdl.rundir import RunDir
from hpcdl.sweep.ledger import Ledger

# summary.json's best value of each trial's trainer.early_stopping.monitor.
BEST_METRIC = "best_metric"


@dataclass(frozen=True)
class Direction:
    mode: Mode  # min: the lowest value ranks first
    reason: str  # where the mode comes from, for the summary's first line

    @property
    def lower_is_better(self) -> bool:
        return self.mode == Mode.min

    def header(self, metric: str) -> str:
        """The line above the summary table: the direction, why, and how to change it."""
        first = "lowest" if self.lower_is_better else "highest"
        other = Mode.max if self.lower_is_better else Mode.min
        return (
            f"ranked by {metric}, {first} first ({self.reason}); --mode {other.value} reverses it"
        )


def parse_mode(mode: Union[str, Mode, None]) -> Optional[Mode]:
    """`--mode` / Sweep.summary(mode=...): 'min', 'max' or None."""
    if mode is None or isinstance(mode, Mode):
        return mode
    try:
        return Mode(mode)
    except ValueError:
        raise HpcdlError(f"mode={mode!r}: choose 'min' (lowest first) or 'max'") from None


def direction(ledger: Ledger, metric: str, mode: Union[str, Mode, None] = None) -> Direction:
    """The direction `metric` ranks the sweep's trials in; refuses (one line asking for
    --mode) when it is the trials' early-stopping monitor and their modes disagree."""
    chosen = parse_mode(mode)
    if metric == BEST_METRIC:
        refuse_mixed_monitors(ledger)
    if chosen is not None:
        return Direction(chosen, f"--mode {chosen.value}")
    monitored = early_stopping_direction(ledger, metric)
    if monitored is not None:
        return monitored
    builtin = builtin_mode(metric)
    if builtin is not None:
        better = "lower" if builtin == Mode.min else "higher"
        return Direction(builtin, f"{unprefixed(metric)}: {better} is better")
    if metric in OWN_DURATIONS:  # hpcdl's own: summary.json's wall times
        return Direction(Mode.min, f"{metric}: hpcdl's wall time, lower is better")
    guessed = guessed_mode(metric)
    return Direction(guessed, "a metric hpcdl does not define: guessed from its name")


# summary.json's own durations, which a sweep of `hpcdl run` programs without a metrics
# file is ranked by.
OWN_DURATIONS = ("wall_s", "wall_s_total")


def refuse_mixed_monitors(ledger: Ledger) -> None:
    """best_metric is each trial's trainer.early_stopping.monitor: trials that monitor
    different metrics (a sweep of the monitor) hold values that do not compare, whatever
    --mode says."""
    monitors: dict[str, list[int]] = {}
    for index, monitor, _ in _early_stoppings(ledger):
        monitors.setdefault(monitor, []).append(index)
    if len(monitors) > 1:
        raise HpcdlError(
            f"{BEST_METRIC}: the trials' best_metric is not one metric, they monitor different "
            f"ones (trainer.early_stopping.monitor: {_by_trials(monitors)}); rank by one of "
            f"those with --metric {min(monitors)}"
        )


def _early_stoppings(ledger: Ledger) -> Iterator[tuple[int, str, Optional[Mode]]]:
    """(index, trainer.early_stopping's monitor and mode) of each trial trained by hpcdl's
    trainer whose config reads (an `hpcdl run` program stops itself; an unreadable trial
    leaves it to the others). Read as plain YAML where config.yaml has both keys as hpcdl
    writes them: the typed conversion of each config.yaml took a minute on 2000 trials."""
    for t in ledger.trials:
        run_dir = RunDir(Path(t.run_dir))
        plain = _plain_early_stopping(run_dir.read_plain_config())
        if plain is not None:
            if plain != _PROGRAM:
                yield (t.index, *plain)
            continue
        try:
            cfg = run_dir.load_config()
        except HpcdlError:
            continue
        if cfg.script is None:
            yield t.index, cfg.trainer.early_stopping.monitor, cfg.trainer.early_stopping.mode


_PROGRAM = ("", None)  # a trial of an `hpcdl run` program: no early stopping
_MODES = {None: None, "auto": None, "min": Mode.min, "max": Mode.max}


def _plain_early_stopping(raw: Optional[dict[str, Any]]) -> Optional[tuple[str, Optional[Mode]]]:
    """monitor and mode as the typed config has them (mode=auto: None), _PROGRAM for a
    program's trial; None where the plain data cannot tell (load_config decides)."""
    if raw is None:
        return None
    if raw.get("script") is not None:
        return _PROGRAM
    trainer = raw.get("trainer")
    stopping = trainer.get("early_stopping") if isinstance(trainer, dict) else None
    if not isinstance(stopping, dict) or not {"monitor", "mode"} <= stopping.keys():
        return None
    monitor, mode = stopping["monitor"], stopping["mode"]
    if not isinstance(monitor, str) or not isinstance(mode, (str, type(None))):
        return None
    if mode not in _MODES:
        return None
    return monitor, _MODES[mode]


def _by_trials(groups: Mapping[Any, list[int]]) -> str:
    """'min in trials 0, 2; max in trials 1'."""
    return "; ".join(
        f"{getattr(key, 'value', key)} in trials {', '.join(map(str, ids))}"
        for key, ids in sorted(groups.items())
    )


def early_stopping_direction(ledger: Ledger, metric: str) -> Optional[Direction]:
    """The trials' trainer.early_stopping.mode, when `metric` is what they monitor (auto:
    the mode it stands for, as the trials' trainer decided best.pt)."""
    modes: dict[Mode, list[int]] = {}
    monitors: set[str] = set()
    auto = True  # no trial set the mode: the reason says so
    for index, monitor, mode in _early_stoppings(ledger):
        if metric == BEST_METRIC or unprefixed(metric) == unprefixed(monitor):
            modes.setdefault(monitor_mode(monitor, mode), []).append(index)
            monitors.add(monitor)
            auto = auto and mode is None
    if not modes:
        return None
    if len(modes) > 1:
        raise HpcdlError(
            f"{metric}: the trials monitor it with different trainer.early_stopping.mode "
            f"({_by_trials(modes)}); choose the ranking with --mode min (lowest first) or --mode max"
        )
    (only,) = modes
    reason = f"the trials' trainer.early_stopping.mode{', auto: ' if auto else '='}{only.value}"
    if monitors != {metric}:  # test_dist, best_metric: what the mode was set for
        reason += f" for {', '.join(sorted(monitors))}"
    return Direction(only, reason)
