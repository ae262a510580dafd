"""A trial's swept overrides as its config.yaml has them. The documented fix of a failed
trial is an edit of its config.yaml before `sweep rerun --failed` (or, for a program, a
resume with another command): status, summary, CSV and plot then show the value the trial
runs with, not the one the sweep planned.
Login path: no torch."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml

_MISSING = object()


def as_run(planned: list[str], config: Mapping[str, Any]) -> list[str]:
    """`planned` ("optim.lr=1e-3") with each key's value from `config` (the plain config)
    where the two differ; the planned text where they agree. A config group's choice
    (model=cnn) is no value in config.yaml: it stays as planned. An `hpcdl run` trial's
    ("--lr=0.1") come from the command in its config.yaml, which `hpcdl resume SWEEP_DIR/N
    -- COMMAND...` replaces."""
    script = config.get("script")
    command = script.get("command") if isinstance(script, Mapping) else None
    if command:
        return [_in_command(override, [str(t) for t in command]) for override in planned]
    return [_as_run(override, config) for override in planned]


def agrees(planned: list[str], config: Mapping[str, Any]) -> bool:
    """Whether `config` (a config.yaml as written, not converted to a typed config) has
    each of `planned` as planned: then as_run() of the typed config gives `planned` too. A
    key it lacks (a default), or a value that differs (an edit), says no: the typed config
    then decides."""
    if as_run(planned, config) != planned:
        return False
    script = config.get("script")
    if isinstance(script, Mapping) and script.get("command"):
        return True
    keys = (o.partition("=")[0].lstrip("+~") for o in planned)
    return all(_lookup(config, key) is not _MISSING for key in keys)


def _in_command(override: str, command: list[str]) -> str:
    """A program sweep's swept argument as `command` has it, shown as the sweep shows it
    (hpcdl.cli.run): `KEY=VALUE` for a token `KEY=VALUE`, for `KEY VALUE` (an option and
    its value) and for `argN=VALUE` (the token at position N); as planned when `command`
    has no such argument."""
    key, _, planned = override.partition("=")
    if key.startswith("arg") and key[3:].isdigit():
        position = int(key[3:])
        if position >= len(command) or "/" + planned == command[position][-len(planned) - 1 :]:
            return override  # gone, or the script itself (its path now the frozen copy's)
        return f"{key}={command[position]}"
    for i, token in enumerate(command):
        if token.startswith(key + "="):
            return token
        if token == key and i + 1 < len(command):
            return f"{key}={command[i + 1]}"
    return override


def _as_run(override: str, config: Mapping[str, Any]) -> str:
    key, sep, text = override.partition("=")
    key = key.lstrip("+~")
    value = _lookup(config, key)
    if not sep or value is _MISSING or isinstance(value, dict) or _same(text, value):
        return override
    return f"{key}={_text(value)}"


def _lookup(config: Mapping[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _same(text: str, value: Any) -> bool:
    text = text.strip()
    if value is None:
        return text.lower() in ("null", "none", "~")
    if isinstance(value, bool):
        return text.lower() == str(value).lower()
    if isinstance(value, (int, float)):
        try:
            return float(text) == float(value)
        except ValueError:
            return False
    if isinstance(value, str):
        return text.strip("'\"") == value
    try:
        return bool(yaml.safe_load(text) == value)
    except yaml.YAMLError:
        return False


def _text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)
