"""DictConfig <-> typed Config: the one place OmegaConf is touched below the CLI.

A composed config is turned into dataclasses once; a misspelled key, a wrong type or an
unknown option raises ConfigError with one line naming the key.
"""

from __future__ import annotations

import copy
import difflib
import functools
import hashlib
import json
from collections.abc import Hashable
from dataclasses import asdict, fields, is_dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hpcdl.atomic import write_atomic
from hpcdl.config import schema
from hpcdl.errors import ConfigError

# Groups whose YAML `name` field picks the dataclass.
NAMED_GROUPS: dict[str, dict[str, type]] = {
    "model": schema.MODEL_SCHEMAS,
    "data": schema.DATA_SCHEMAS,
    "task": schema.TASK_SCHEMAS,
    "optim": schema.OPTIM_SCHEMAS,
}
FIXED_GROUPS: dict[str, type] = {
    "schedule": schema.ScheduleConfig,
    "trainer": schema.TrainerConfig,
    "cluster": schema.ClusterConfig,
    "logger": schema.LoggerConfig,
}
# Groups added after run dirs were first written: an old config.yaml gets this option.
GROUP_DEFAULTS = {"task": "classification"}
TOP_LEVEL_KEYS = ("run_dir", "init_from")
GROUPS = (*NAMED_GROUPS, *FIXED_GROUPS)


def to_config(cfg: DictConfig) -> schema.Config:
    """Validate a composed DictConfig against the schemas and return the typed Config."""
    container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)
    return from_dict(container)


def from_dict(raw: dict[Any, Any]) -> schema.Config:
    unknown = [
        k
        for k in raw
        if k not in GROUPS and k not in TOP_LEVEL_KEYS and k not in ("hydra", "script")
    ]
    if unknown:
        raise ConfigError(_unknown_key_message(unknown[0], [*GROUPS, *TOP_LEVEL_KEYS]))
    parts: dict[str, Any] = {}
    for group, options in NAMED_GROUPS.items():
        node = raw.get(group)
        if node is None and group in GROUP_DEFAULTS:  # a config saved before the group existed
            node = {"name": GROUP_DEFAULTS[group]}
        if not isinstance(node, dict):
            raise ConfigError(f"{group}: missing config group; choose one with {group}=<option>")
        name = node.get("name")
        if name not in options:
            raise ConfigError(
                f"{group}.name={name!r}: unknown option; choose one of {', '.join(sorted(options))}"
            )
        parts[group] = _typed(group, options[name], node)
    for group, cls in FIXED_GROUPS.items():
        parts[group] = _typed(group, cls, raw.get(group) or {})
    for key in TOP_LEVEL_KEYS:
        value = raw.get(key)
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{key}={value!r}: must be a path string or null")
        parts[key] = value
    script = raw.get("script")
    if script is not None:
        parts["script"] = _typed("script", schema.ScriptConfig, script)
    return schema.Config(**parts)


def model_from_dict(raw: dict[str, Any]) -> Any:
    """A model config stored in a checkpoint, back to its dataclass."""
    name = raw.get("name")
    if name not in schema.MODEL_SCHEMAS:
        raise ConfigError(f"model.name={name!r}: unknown model in checkpoint")
    return _typed("model", schema.MODEL_SCHEMAS[name], raw)


def _typed(group: str, cls: type, node: dict[str, Any]) -> Any:
    try:
        merged = OmegaConf.merge(OmegaConf.structured(cls), node)
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise ConfigError(_omegaconf_message(group, cls, err)) from None
    return obj


def _omegaconf_message(group: str, cls: type, err: OmegaConfBaseException) -> str:
    full_key = getattr(err, "full_key", None) or ""
    key = f"{group}.{full_key}" if full_key else group
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    if "not in" in text and "Key" in text:
        return _unknown_key_message(key, [f"{group}.{k}" for k in _field_names(cls)])
    if "missing mandatory value" in text.lower():
        return f"{key}: required value is missing; set it with {key}=..."
    return f"{key}: {text}"


def _field_names(cls: type, prefix: str = "") -> list[str]:
    names = []
    for f in fields(cls):
        default = f.default_factory() if callable(f.default_factory) else f.default
        if is_dataclass(default):
            names.extend(_field_names(type(default), f"{prefix}{f.name}."))
        else:
            names.append(f"{prefix}{f.name}")
    return names


def known_keys(group: str) -> list[str]:
    """Every dotted key a group can hold (over all its options)."""
    classes = list(NAMED_GROUPS[group].values()) if group in NAMED_GROUPS else [FIXED_GROUPS[group]]
    keys = {f"{group}.{name}" for cls in classes for name in _field_names(cls)}
    return sorted(keys)


def unknown_key_message(key: str) -> str:
    group = key.split(".", 1)[0]
    valid = known_keys(group) if group in GROUPS else [*GROUPS, *TOP_LEVEL_KEYS]
    return _unknown_key_message(key, valid)


def _unknown_key_message(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f"did you mean {close[0]}?" if close else f"valid keys: {', '.join(valid)}"
    return f"{key}: unknown key; {hint}"


def to_plain(cfg: schema.Config) -> dict[str, Any]:
    """The config as plain YAML/JSON-able data (enums as their values)."""
    return _plain(asdict(cfg))


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def to_yaml(cfg: schema.Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(to_plain(cfg)))


def save_config(cfg: schema.Config, path: Path) -> None:
    write_atomic(path, to_yaml(cfg))


def yaml_message(err: yaml.YAMLError) -> str:
    """One line for PyYAML's multi-line error: the file, line and column, and the problem."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or str(err)
    context = getattr(err, "context", None)
    what = " ".join((f"{context}: {problem}" if context else str(problem)).split())
    name = getattr(mark, "name", "") or ""
    if mark is None or name.startswith("<"):  # not read from a file
        where = name or "a config file"
    else:
        where = f"{name}, line {mark.line + 1}, column {mark.column + 1}"
    return f"{where}: invalid YAML ({what}); fix the syntax there"


def load_config(path: Path) -> schema.Config:
    try:
        raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except yaml.YAMLError as err:
        raise ConfigError(yaml_message(err)) from None
    except (OSError, OmegaConfBaseException) as err:
        raise ConfigError(
            f"{path}: cannot read the run's config ({err}); is this a run dir?"
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: not a config mapping")
    return from_dict(raw)


def config_hash(cfg: schema.Config) -> str:
    """Hash of what defines the learning problem (model + data), stored in checkpoints."""
    plain = to_plain(cfg)
    key = {"model": plain["model"], "data": plain["data"]}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
