"""`hpcdl completion bash`: a bash completion script, and the candidates it asks for.

    eval "$(hpcdl completion bash)"      # in ~/.bashrc

On TAB the script calls `hpcdl completion bash --line=<the line up to the cursor>`, which
prints one candidate per line: subcommands and flags (read from the argparse parser
itself), config groups and their options (conf/, ~/.config/hpcdl and any --config-dir on
the line), each group's dotted keys (trainer.max_epochs=) and the values of its enum and
bool keys. Nothing is offered for paths: bash then completes file names. No torch, no Hydra.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import typing
from pathlib import Path
from typing import Any, Optional

# bash's default COMP_WORDBREAKS (less the blanks); the script passes the real one.
DEFAULT_WORDBREAKS = "\"'><=;|&(:"

# Overrides that are no config group key: hydra.sweep.dir for `train -m`, `hpcdl run`'s own.
EXTRA_KEYS = {
    "train": ["hydra.sweep.dir="],
    "run": ["launcher=", "entry=", "metrics_file=", "stall_timeout_s="],
}
# Commands that take one key only.
ONLY_KEYS = {"predict": ["task.predict="]}

BASH_SCRIPT = """\
# bash completion for hpcdl. Enable it with:  eval "$(hpcdl completion bash)"
_hpcdl_complete() {
    local candidate
    mapfile -t COMPREPLY < <("$1" completion bash --line="${COMP_LINE:0:COMP_POINT}" \\
        --wordbreaks="$COMP_WORDBREAKS" 2>/dev/null)
    for candidate in "${COMPREPLY[@]}"; do
        case "$candidate" in  # a key still to be finished: no space after it
            *= | *.) compopt -o nospace 2>/dev/null; break ;;
        esac
    done
}
complete -o default -F _hpcdl_complete hpcdl
"""


def bash_script() -> str:
    return BASH_SCRIPT


def candidates(line: str, wordbreaks: Optional[str] = None) -> list[str]:
    """What may follow `line` (the command line up to the cursor) in its last word, as bash
    wants it: only the part after the word's last word-break character (`model=` is two
    words to bash, so `model=m` gets `mlp`, not `model=mlp`)."""
    words = line.split()
    current = "" if not line or line[-1].isspace() else words.pop()
    full = [c for c in _complete(words[1:], current) if c.startswith(current)]
    breaks = DEFAULT_WORDBREAKS if wordbreaks is None else wordbreaks
    cut = max((current.rfind(ch) for ch in breaks if ch.strip()), default=-1) + 1
    return sorted(c[cut:] for c in full)


def _complete(words: list[str], current: str) -> list[str]:
    """Every candidate for the current word, given the words before it (program excluded)."""
    from hpcdl.cli.main import build_parser

    parser = build_parser()
    path: list[str] = []  # subcommands so far: ["sweep", "status"]
    config_dirs: list[str] = []
    num_positionals = 0
    pending: Optional[argparse.Action] = None  # an option waiting for its value
    for word in words:
        if pending is not None:
            if pending.dest == "config_dir":
                config_dirs.append(word)
            pending = None
            continue
        if word.startswith("-"):
            name, sep, value = word.partition("=")
            action = _option(parser, name)
            if action is not None and action.nargs != 0 and not sep:
                pending = action
            elif action is not None and action.dest == "config_dir":
                config_dirs.append(value)
            continue
        subparsers = _subcommands(parser)
        if subparsers and word in subparsers:
            parser, num_positionals = subparsers[word], 0
            path.append(word)
        else:
            num_positionals += 1
    if pending is not None:  # `--checkpoint <TAB>`, `--format <TAB>`: choices, else paths
        return [str(c) for c in pending.choices or ()]
    if current.startswith("-"):
        return [s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings]
    subparsers = _subcommands(parser)
    if subparsers:
        return list(subparsers)
    positionals = [a for a in parser._actions if not a.option_strings]
    if num_positionals < len(positionals) and positionals[num_positionals].dest != "overrides":
        return [str(c) for c in positionals[num_positionals].choices or ()]  # else paths
    if any(a.dest == "overrides" for a in positionals):
        return _overrides(current, path[0], config_dirs)
    return []


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _option(parser: argparse.ArgumentParser, name: str) -> Optional[argparse.Action]:
    return next((a for a in parser._actions if name in a.option_strings), None)


def _overrides(current: str, command: str, config_dirs: list[str]) -> list[str]:
    """`group=option` (comma lists for sweeps), `group.key=`, enum values, top-level keys."""
    from hpcdl.config.convert import GROUPS, PRESET_GROUPS, TOP_LEVEL_KEYS, known_keys
    from hpcdl.config.schema import ScriptLauncher

    if command in ONLY_KEYS:
        return ONLY_KEYS[command]
    key, sep, value = current.partition("=")
    bare = key.lstrip("+~")
    if sep:
        head = value[: value.rfind(",") + 1]  # `model=mlp,c`: complete after the comma
        if command == "run" and bare == "launcher":
            return [f"launcher={head}{launcher.value}" for launcher in ScriptLauncher]
        if bare in GROUPS or bare in PRESET_GROUPS:
            return [f"{key}={head}{option}" for option in _group_options(bare, config_dirs)]
        return [f"{key}={head}{v}" for v in _key_values(bare)]
    group = bare.split(".", 1)[0]
    if "." in bare and group in GROUPS:
        return [f"{key[: len(key) - len(bare)]}{k}=" for k in known_keys(group)]
    keys = [f"{g}{end}" for g in GROUPS for end in ("=", ".")]
    if command in ("train", "bench"):  # not resume: config.yaml holds the experiment's values
        keys += [f"{g}=" for g in PRESET_GROUPS]
    return [*keys, *(f"{k}=" for k in TOP_LEVEL_KEYS), *EXTRA_KEYS.get(command, [])]


def _group_options(group: str, config_dirs: list[str]) -> list[str]:
    from hpcdl.cli.expand import _group_options as options
    from hpcdl.errors import HpcdlError

    existing = [d for d in config_dirs if Path(d).expanduser().is_dir()]
    try:
        return options(group, existing)
    except HpcdlError:
        return []


def _key_values(key: str) -> list[str]:
    """The values of an enum or bool key (cluster.launcher, trainer.precision), else none."""
    from hpcdl.config.convert import FIXED_GROUPS, NAMED_GROUPS

    group, *fields = key.split(".")
    classes = list(NAMED_GROUPS[group].values()) if group in NAMED_GROUPS else []
    classes += [FIXED_GROUPS[group]] if group in FIXED_GROUPS else []
    values: set[str] = set()
    for cls in classes:
        kind: Any = cls
        for name in fields:
            if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
                kind = None
                break
            kind = typing.get_type_hints(kind).get(name)
        for arg in (*typing.get_args(kind), kind):  # Optional[X] too
            if isinstance(arg, type) and issubclass(arg, enum.Enum):
                values.update(str(m.value) for m in arg)
            elif arg is bool:
                values.update(("true", "false"))
    return sorted(values)
