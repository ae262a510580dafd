"""`hpcdl run [overrides] -- COMMAND...` and `hpcdl run entry=pkg.mod:fn`: the user's own
program through the same run dir, snapshot, sbatch, preflight, submission and sweep
machinery as `hpcdl train` (hpcdl.cli.main). Never imports torch.

Overrides besides the config's (cluster=..., cluster.nodes=2, run_dir=...): launcher=srun|
torchrun, entry=package.module:function, entry.kwargs.NAME=VALUE, metrics_file=PATH,
stall_timeout_s=SECONDS.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import math
import os
import re
import warnings
from dataclasses import replace
from typing import Any

from hpcdl.config.schema import Config, ScriptConfig, ScriptLauncher
from hpcdl.errors import ConfigError, HpcdlWarning
from hpcdl.number_ranges import range_values

# Keys of `hpcdl run` itself; everything else goes to the config.
RUN_KEYS = ("launcher", "entry", "metrics_file", "stall_timeout_s")
# The config's keys that a script run uses; hpcdl train's (model, trainer, ...) would be
# composed into its config.yaml and read by nothing (hpcdl.config.convert names them all).
CONFIG_KEYS = ("cluster", "run_dir", "hydra")
BRACES = re.compile(r"\{([^{}]*)\}")
RANGE = re.compile(r"^range\((.*)\)$")
HYDRA_LIST = re.compile(r"^([A-Za-z_+~][\w.+~/-]*)=([^=]*,[^=]*)$")


def run_program(args: argparse.Namespace) -> int:
    from hpcdl.cli.main import dry_run, launch_new, launch_sweep

    cfg, overrides = compose_program(
        args.overrides, list(args.program), args.config_dir, args.multirun
    )
    if args.multirun:
        return launch_sweep(program_sweep(cfg, overrides), args)
    if args.dry_run:
        return dry_run(cfg, args.no_preflight)
    cfg, run_dir = start_program(cfg, args.no_preflight)
    return launch_new(cfg, run_dir)


def compose_program(
    overrides: list[str], command: list[str], config_dirs: list[str], multirun: bool
) -> tuple[Config, list[str]]:
    """`hpcdl run`'s config (and hpcdl.submit_program's): composed, and for a single run its
    program checked; the overrides left for the config (without hpcdl run's own keys)."""
    from hpcdl.cli.compose import compose_config
    from hpcdl.config.validate import check_script

    script, rest = script_from(overrides, command)
    cfg = compose_config(rest, config_dirs, script=script, multirun=multirun)
    if not multirun:
        check_script(script, cfg.cluster)
    note = shared_gpu_note(cfg)
    if note is not None:
        warnings.warn(HpcdlWarning(note), stacklevel=1)
    return cfg, rest


def shared_gpu_note(cfg: Config) -> str | None:
    """More ranks on a node than GPUs: hpcdl gives rank r HPCDL_DEVICE=cuda:(r mod GPUs),
    so two ranks get one GPU, which NCCL refuses at the program's first collective
    ("Duplicate GPU detected"). Said at launch, not refused: a program on gloo, or one
    whose ranks share a GPU on purpose, runs so. torchrun gives its workers no device."""
    from hpcdl.config.schema import tasks_per_node

    assert cfg.script is not None
    gpus, ranks = cfg.cluster.gpus_per_node, tasks_per_node(cfg.cluster)
    if cfg.script.launcher == ScriptLauncher.torchrun or not 0 < gpus < ranks:
        return None
    return (
        f"cluster.tasks_per_node={ranks} ranks share cluster.gpus_per_node={gpus} "
        f"GPU{'s' if gpus > 1 else ''} on each node (HPCDL_DEVICE=cuda:0 for ranks 0 and "
        f"{gpus}): NCCL refuses two ranks on one GPU ('Duplicate GPU detected'); set "
        f"cluster.tasks_per_node={gpus}, or cluster.gpus_per_node={ranks}"
    )


def program_sweep(cfg: Config, overrides: list[str]) -> Any:
    """`hpcdl run -m`'s plan, each trial's program checked as it runs it, and the note when
    the trials share the working directory."""
    from hpcdl.config.validate import check_script

    assert cfg.script is not None
    plan = plan_program_sweep(cfg, overrides)
    for trial in plan.trials:  # as each trial runs it: a list may name the script
        check_script(trial.config.script, cfg.cluster)
    if not mentions_run_dir(cfg.script.command):
        warnings.warn(HpcdlWarning(shared_workdir_note(len(plan.trials))), stacklevel=1)
    return plan


def start_program(cfg: Config, skip_preflight: bool) -> tuple[Config, Any]:
    """A composed program run up to its launch: preflight, the run dir created."""
    from hpcdl.cli.main import preflight
    from hpcdl.rundir import create_run_dir

    preflight(cfg, skip_preflight)
    cfg, run_dir = create_run_dir(cfg)
    print(f"run dir: {run_dir.path}", flush=True)
    return cfg, run_dir


def mentions_run_dir(command: list[str]) -> bool:
    """Whether the command names the run dir ($HPCDL_RUN_DIR), so each trial writes its own."""
    return any("HPCDL_RUN_DIR" in token for token in command)


def shared_workdir_note(num_trials: int) -> str:
    """A sweep's trials all start in this folder: said once, at submission, when the command
    does not give them the run dir. Whether the program writes outputs relative to it (a
    default `--out out`, often not in the command at all) cannot be known from here; if it
    does, every trial resumes from or overwrites the others' files."""
    return (
        f"the {num_trials} trials all run in {os.getcwd()} (the working directory, not their "
        "run dirs): an output path relative to it, in the command or the script's defaults "
        "(--out out), is the same folder for every trial, each resuming from or overwriting "
        "the others' files; give each trial its own with '$HPCDL_RUN_DIR' in the command, "
        "single-quoted (--out '$HPCDL_RUN_DIR/out': hpcdl puts the trial's run dir there), or "
        "write under hpcdl.api.run_dir() in the script (docs/scripts.md#sweeps)"
    )


def script_from(overrides: list[str], command: list[str]) -> tuple[ScriptConfig, list[str]]:
    """Split `hpcdl run`'s own keys out of the overrides."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    entry, launcher, metrics_file, stall_timeout_s = None, ScriptLauncher.srun, None, None
    kwargs: dict[str, Any] = {}
    rest = []
    for text in overrides:
        key, sep, value = text.partition("=")
        if sep:
            refuse_foreign_key(key.lstrip("+~"))
        if not sep or key.split(".", 1)[0] not in RUN_KEYS:
            rest.append(text)
        elif key == "launcher":
            if value not in ScriptLauncher.__members__:
                raise ConfigError(f"launcher={value!r}: unknown; choose srun or torchrun")
            launcher = ScriptLauncher(value)
        elif key == "entry":
            entry = value
        elif key.startswith("entry.kwargs."):
            kwargs[key.removeprefix("entry.kwargs.")] = (
                OverridesParser.create().parse_override(text).value()
            )
        elif key == "metrics_file":
            metrics_file = value
        elif key == "stall_timeout_s":
            stall_timeout_s = seconds_of(key, value)
        else:
            raise ConfigError(f"{key}: unknown key of hpcdl run; use entry.kwargs.NAME=VALUE")
    script = ScriptConfig(
        command=command,
        entry=entry,
        entry_kwargs=kwargs,
        launcher=launcher,
        metrics_file=metrics_file,
        stall_timeout_s=stall_timeout_s,
    )
    return script, rest


def seconds_of(key: str, value: str) -> float:
    """A positive, finite number of seconds, or one line naming the key and the fix."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(
            f"{key}={value!r}: give the seconds a rank's program may go without output or an "
            f"hpcdl.api call before it is ended, a number > 0 ({key}=1800), or leave {key} out"
        )
    return seconds


def refuse_foreign_key(key: str) -> None:
    """A key before `--` that `hpcdl run` does not use: one of `hpcdl train`'s sections
    (trainer.max_epochs=3 would change nothing: the program reads its own arguments), or a
    typo, offered the nearest of hpcdl run's keys rather than hpcdl train's."""
    from hpcdl.config.convert import GROUPS, PRESET_GROUPS, RECORDED_KEYS, TOP_LEVEL_KEYS

    top = key.split(".", 1)[0]
    if top in (*RUN_KEYS, *CONFIG_KEYS, *RECORDED_KEYS):  # workdir: compose's own message
        return
    own = f"hpcdl run's keys: cluster=..., cluster.*, run_dir, {', '.join(RUN_KEYS)}"
    if top in (*GROUPS, *TOP_LEVEL_KEYS, *PRESET_GROUPS):
        raise ConfigError(
            f"{key}: hpcdl train's key, unused by hpcdl run (your program reads its own "
            f"arguments: give them after --); {own}"
        )
    close = difflib.get_close_matches(top, [*RUN_KEYS, *CONFIG_KEYS], n=1)
    if close:
        raise ConfigError(f"{key}: unknown key of hpcdl run; did you mean {close[0]}?")
    raise ConfigError(f"{key}: unknown key of hpcdl run; {own}")


def expand_token(token: str) -> list[str]:
    """`--lr={0.1,0.03}` -> two tokens; `{range(0,3)}` -> 0, 1, 2; `lr=0.1,0.03` (a Hydra
    app's list) -> two tokens; anything else -> itself."""
    match = HYDRA_LIST.match(token)
    if match and "{" not in token:
        values = match.group(2).split(",")
        refuse_repeated_values(token, values)
        return [f"{match.group(1)}={v}" for v in values]
    options: list[list[str]] = []
    for inner in BRACES.findall(token):
        span = RANGE.match(inner.strip())
        if span:
            options.append(range_in_braces(token, span.group(1)))
        elif "," in inner:
            options.append([v.strip() for v in inner.split(",")])
            refuse_repeated_values(token, options[-1])
        else:
            options.append(["{" + inner + "}"])
    if not options:
        return [token]
    parts = BRACES.split(token)  # literal, inner, literal, inner, ..., literal
    expanded = []
    for choice in itertools.product(*options):
        pieces = [p if i % 2 == 0 else choice[i // 2] for i, p in enumerate(parts)]
        expanded.append("".join(pieces))
    return expanded


def range_in_braces(token: str, arguments: str) -> list[str]:
    """`{range(0,6,2)}`, `{range(3)}`, `{range(0.1,0.5,0.1)}` (0.1 0.2 0.3 0.4, rounded to
    the decimals given: hpcdl.number_ranges.range_values) -> the values' text."""
    usage = "range(stop), range(start, stop) or range(start, stop, step), numbers"
    try:
        numbers = [_number(a) for a in arguments.split(",")]
        if not 1 <= len(numbers) <= 3:
            raise ValueError(f"range() takes 1 to 3 numbers, not {len(numbers)}")
        start, stop, step = ([0, *numbers, 1] if len(numbers) == 1 else [*numbers, 1])[:3]
        values = range_values(start, stop, step)
    except ValueError as err:
        raise ConfigError(f"{token}: {err}; write {usage}") from None
    if not values:
        raise ConfigError(f"{token}: range({arguments}) is empty; give at least one value")
    return values


def _number(text: str) -> float:
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None


def refuse_repeated_values(token: str, values: list[str]) -> None:
    """A value twice in one list of the command (`--lr={0.1,0.1}`, `{0.1,1e-1}`): two trials
    alike, refused in one line, as `hpcdl train -m` refuses them."""
    seen: dict[str, str] = {}
    for value in values:
        try:
            same = f"number {float(value)!r}"
        except ValueError:
            same = value
        if same in seen:
            what = value if seen[same] == value else f"{seen[same]} and {value} are one value;"
            what += "" if what.endswith(";") else " is given twice;"
            unique = ",".join(dict.fromkeys(seen.values()))
            raise ConfigError(f"{token}: {what} give each value once ({{{unique}}})")
        seen[same] = value


def plan_program_sweep(cfg: Config, overrides: list[str]) -> Any:
    """One trial per combination of the command's lists; Hydra sweeps of the config itself
    are not combined with them (one kind per sweep)."""
    from hpcdl.sweep.plan import SweepPlan, Trial

    assert cfg.script is not None
    command = cfg.script.command
    choices = [expand_token(t) for t in command]
    swept = [i for i, c in enumerate(choices) if len(c) > 1 or c[0] != command[i]]
    if not swept:
        raise ConfigError(
            "-m: no list in the command; write e.g. '--lr={0.1,0.03}' or seed=1,2, quoted "
            "(the shell expands unquoted braces itself)"
        )
    sweep_dir = None
    for text in overrides:
        if text.startswith("hydra.sweep.dir="):
            sweep_dir = text.split("=", 1)[1]
        elif text.startswith("run_dir="):
            raise ConfigError(
                "run_dir: a sweep gives each trial its own run dir; set hydra.sweep.dir=..."
            )
    keys = [_key_of(command, i) for i in swept]
    trials = []
    for index, combo in enumerate(itertools.product(*choices)):
        script = replace(cfg.script, command=list(combo))
        shown = [_shown(combo[i], keys[n]) for n, i in enumerate(swept)]
        trials.append(Trial(index=index, overrides=shown, config=replace(cfg, script=script)))
    return SweepPlan(sweep_dir=sweep_dir, common=overrides, swept_keys=keys, trials=trials)


def _key_of(command: list[str], position: int) -> str:
    """A swept token's name: its own `key=` or `--flag=`, the option flag before it
    (`--lr {0.1,0.2}`), or its position (arg3)."""
    token = command[position]
    name = token.split("=", 1)[0] if "=" in token else ""
    if name and "{" not in name:
        return name
    previous = command[position - 1] if position > 0 else ""
    if previous.startswith("-") and "=" not in previous and "{" not in previous:
        return previous
    return f"arg{position}"


def _shown(value: str, key: str) -> str:
    return value if value.startswith(key + "=") else f"{key}={value}"
