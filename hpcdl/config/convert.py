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
import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, fields, is_dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Optional, TypeVar

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
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
# Top-level keys a run records when it is created (hpcdl.rundir), not composed: a resume
# may change them, as any key of config.yaml.
RECORDED_KEYS = ("workdir",)
GROUPS = (*NAMED_GROUPS, *FIXED_GROUPS)
# Groups that only choose other groups' options and set their values: conf/experiment/*.yaml
# (`# @package _global_`, a whole setup in one file). Hydra composes them away, so they
# never reach the typed config or a run's config.yaml.
PRESET_GROUPS = ("experiment",)


# A shell variable in a line of shell (cluster.setup, cluster.env): `${USER}`, which
# OmegaConf would take for an interpolation of a config key that does not exist.
_SHELL_VARIABLE = re.compile(r"(?<!\\)\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def keep_shell_variables(cfg: DictConfig) -> None:
    """cluster.setup's and cluster.env's `${NAME}` (no config key of that name) kept as the
    shell's, escaped for OmegaConf (`\\${USER}`): the batch script gets `${USER}` as written.
    A site's `export SCRATCH=/scratch/${USER}` failed with OmegaConf's traceback."""
    cluster = cfg._get_node("cluster") if "cluster" in cfg else None
    if not isinstance(cluster, DictConfig):
        return
    for key in ("setup", "env"):
        node = cluster._get_node(key) if key in cluster else None
        if not isinstance(node, (DictConfig, ListConfig)) or node._is_none():
            continue
        items: list[Any] = list(node.keys() if isinstance(node, DictConfig) else range(len(node)))
        for item in items:
            raw = node._get_node(item)._value()  # type: ignore[union-attr]
            if not isinstance(raw, str):
                continue
            kept = _SHELL_VARIABLE.sub(
                lambda m: m.group(0) if m.group(1) in cfg else "\\" + m.group(0), raw
            )
            if kept != raw:
                node[item] = kept


def to_config(cfg: DictConfig) -> schema.Config:
    """Validate a composed DictConfig against the schemas and return the typed Config."""
    keep_shell_variables(cfg)
    container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)
    return from_dict(container)


def from_dict(raw: dict[Any, Any]) -> schema.Config:
    unknown = [
        k
        for k in raw
        if k not in (*GROUPS, *TOP_LEVEL_KEYS, *RECORDED_KEYS) and k not in ("hydra", "script")
    ]
    if unknown:
        raise ConfigError(_unknown_key_message(unknown[0], [*GROUPS, *TOP_LEVEL_KEYS]))
    for group in GROUPS:
        _refuse_shapeless(group, raw.get(group))
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
        parts[group] = _typed(group, cls, _auto_mode(group, raw.get(group) or {}))
    for key in (*TOP_LEVEL_KEYS, *RECORDED_KEYS):
        value = raw.get(key)
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{key}={value!r}: must be a path string or null")
        parts[key] = value
    script = raw.get("script")
    if script is not None:
        parts["script"] = _typed("script", schema.ScriptConfig, script)
    return schema.Config(**parts)


def _auto_mode(group: str, node: dict[str, Any]) -> dict[str, Any]:
    """trainer.early_stopping.mode=auto, the word the docs use for null, read as null."""
    stopping = node.get("early_stopping") if group == "trainer" else None
    if not isinstance(stopping, dict) or stopping.get("mode") != "auto":
        return node
    return {**node, "early_stopping": {**stopping, "mode": None}}


# Groups whose file must set keys: without `name` a named group has no schema, and an empty
# cluster profile would silently run in-process (launcher: debug) instead of where it should.
# trainer/schedule/logger files may be empty: they take the defaults (logger=csv is empty).
_NON_EMPTY_GROUPS = {**{g: "name" for g in NAMED_GROUPS}, "cluster": "launcher"}


def _refuse_shapeless(group: str, node: Any) -> None:
    """A group's YAML that is not a mapping of keys (a list, a scalar), or an empty one
    where keys are needed. The message starts with the group, so compose names the file."""
    if node is not None and not isinstance(node, dict):
        kind = "a list" if isinstance(node, list) else f"the value {node!r}"
        raise ConfigError(
            f"{group}: holds {kind}, not a mapping of keys; write one `key: value` per line, "
            f"as conf/{group}/*.yaml do"
        )
    if node == {} and group in _NON_EMPTY_GROUPS:
        raise ConfigError(
            f"{group}: sets no keys; write at least `{_NON_EMPTY_GROUPS[group]}: ...`, "
            f"as conf/{group}/*.yaml do"
        )


def model_from_dict(raw: dict[str, Any]) -> Any:
    """A model config stored in a checkpoint, back to its dataclass."""
    name = raw.get("name")
    if name not in schema.MODEL_SCHEMAS:
        raise ConfigError(f"model.name={name!r}: unknown model in checkpoint")
    return _typed("model", schema.MODEL_SCHEMAS[name], raw)


T = TypeVar("T")

# Groups already typed, by schema class and values: a sweep's trials share most of their
# groups (100 trials of model=mlp,cnn x 5 lr x 10 seeds: 2 models, 5 optims, 10 trainers,
# one of each other group), and OmegaConf's merge into a schema costs 2-5 ms a group on a
# 2-core VM.
_TYPED: dict[tuple[type, Hashable], Any] = {}
# A group's entry in config.yaml, by name and values (see to_yaml).
_ENTRY_YAML: dict[tuple[str, Hashable], str] = {}
# Both are emptied when full: a long-lived process (the Python API, tests) sees many configs.
_CACHE_MAX_ENTRIES = 512


def _remembered(cache: dict[Any, T], key: Hashable, make: Callable[[], T]) -> T:
    """cache[key], made by make() the first time (a make() that raises stores nothing)."""
    value = cache.get(key)
    if value is None:
        value = make()
        if len(cache) >= _CACHE_MAX_ENTRIES:
            cache.clear()
        cache[key] = value
    return value


def _typed(group: str, cls: type, node: dict[str, Any]) -> Any:
    """The group's dataclass; a fresh copy each call, so a caller may change its config
    without reaching any other trial's."""
    values = _frozen(node)
    if values is None:  # not plain YAML data: converted as it is, not cached
        return _converted(group, cls, node)
    return copy.deepcopy(_remembered(_TYPED, (cls, values), lambda: _converted(group, cls, node)))


def _converted(group: str, cls: type, node: dict[str, Any]) -> Any:
    try:
        merged = OmegaConf.merge(OmegaConf.structured(cls), _literal(node))
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise ConfigError(_omegaconf_message(group, cls, err, node)) from None
    return obj


def _literal(value: Any) -> Any:
    """Resolved values as OmegaConf must take them again: a `${` left in a string is text
    (a shell's `${USER}`, kept by keep_shell_variables), escaped so it stays text."""
    if isinstance(value, str):
        return value.replace("${", "\\${") if "${" in value else value
    if isinstance(value, dict):
        return {k: _literal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_literal(v) for v in value]
    return value


_PLAIN_SCALARS = (str, int, float, bool, type(None))


def _frozen(value: Any) -> Optional[Hashable]:
    """Plain YAML data as a hashable key that tells apart all OmegaConf does: 1, 1.0, True
    and '1' (by type), 0.0 and -0.0 (by repr), the order of a dict's keys. None for any
    other type (a tuple, an Enum, a Path), which is then never cached."""
    kind = type(value)
    if kind in _PLAIN_SCALARS:
        return (kind, repr(value))
    if kind is dict:
        items = []
        for k, v in value.items():
            frozen_k, frozen_v = _frozen(k), _frozen(v)
            if frozen_k is None or frozen_v is None:
                return None
            items.append((frozen_k, frozen_v))
        return (dict, tuple(items))
    if kind is list:
        frozen = [_frozen(v) for v in value]
        return None if any(f is None for f in frozen) else (list, tuple(frozen))
    return None


# OmegaConf's type names in "could not be converted to X", as a user reads them.
_KINDS = {"Integer": "a whole number", "Float": "a number", "Boolean": "true or false"}


def _omegaconf_message(
    group: str, cls: type, err: OmegaConfBaseException, node: dict[str, Any]
) -> str:
    full_key = getattr(err, "full_key", None) or ""
    key = f"{group}.{full_key}" if full_key else group
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    if "not in" in text and "Key" in text:
        return _other_options_key(group, cls, key) or _unknown_key_message(
            key, [f"{group}.{k}" for k in _field_names(cls)]
        )
    if "missing mandatory value" in text.lower():
        return f"{key}: required value is missing; set it with {key}=..."
    converted = re.match(r"Value '(.*)' of type '\w+' could not be converted to (\w+)", text)
    if converted and converted.group(2) in _KINDS:
        if key == "cluster.timeout_min":  # sbatch's --time takes "1:30:00" and "2h" does not
            minutes = slurm_minutes(converted.group(1))
            example = f"{minutes} for {converted.group(1)}" if minutes else "90 for 1:30:00"
            return f"{key}={converted.group(1)}: must be a whole number of minutes, e.g. {example}"
        return f"{key}={converted.group(1)}: must be {_KINDS[converted.group(2)]}"
    if "Cannot merge DictConfig with ListConfig" in text:  # OmegaConf names no key here
        shaped = _misshaped(cls, node)
        if shaped is not None:
            name, mapping = shaped
            line = f"{group}.{name}={_shown(node[name])}"
            return shape_message(line, f"{group}.{name}", mapping)
    if re.match(r"Cannot assign \w+ to Dict\[", text):  # cluster.env=5
        value = node.get(full_key, "") if isinstance(node, dict) else ""
        return shape_message(f"{key}={value!r}", key, mapping=True)
    if "is not a ListConfig, list or tuple" in text:  # OmegaConf names its node classes
        value = node.get(full_key, "") if isinstance(node, dict) else ""
        example = ",".join(str(v) for v in _default_of(cls, full_key) or []) or "..."
        return f"{key}={value!r} is not a list; give one in brackets, e.g. {key}=[{example}]"
    if key == "trainer.early_stopping.mode":
        text += ", or auto (null): the monitored metric's own direction"
    return f"{key}: {text}"


def slurm_minutes(text: str) -> Optional[int]:
    """Slurm's time formats (MM:SS, HH:MM:SS, D-HH[:MM[:SS]]) as whole minutes, rounded
    up (None: not one of them)."""
    days, _, rest = text.rpartition("-") if "-" in text else ("0", "", text)
    parts = rest.split(":")
    if not days.isdigit() or not all(p.isdigit() for p in parts) or len(parts) > 3:
        return None
    numbers = [int(p) for p in parts]
    if "-" in text:  # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = [*numbers, 0, 0][:3]
    elif len(numbers) == 3:
        hours, minutes, seconds = numbers
    elif len(numbers) == 2:
        hours, minutes, seconds = 0, *numbers
    else:
        return None
    total = ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    return -(-total // 60) or None


def shape_message(line: str, key: str, mapping: bool) -> str:
    """A list given where a mapping goes (cluster.env), or a mapping for a list."""
    if mapping:
        return f"{line}: must be a mapping; give one in braces, e.g. {key}={{NAME:value}}"
    return f"{line}: must be a list; give one in brackets, e.g. {key}=[...]"


def _misshaped(cls: type, node: dict[str, Any]) -> Optional[tuple[str, bool]]:
    """The first key of `node` holding a list where `cls` has a mapping, or a mapping where it
    has a list, and whether a mapping is wanted; None when none does."""
    for f in fields(cls):
        default = f.default_factory() if callable(f.default_factory) else f.default
        value = node.get(f.name) if isinstance(node, dict) else None
        if isinstance(default, dict) and isinstance(value, list):
            return f.name, True
        if isinstance(default, list) and isinstance(value, dict):
            return f.name, False
    return None


def _shown(value: Any) -> str:
    """A list or mapping as an override writes it: [a,b], {a:1}."""
    if isinstance(value, list):
        return "[" + ",".join(_shown(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_shown(v)}" for k, v in value.items()) + "}"
    return str(value)


def _default_of(cls: type, dotted: str) -> Any:
    """The dataclass default of a dotted key, or None."""
    head, _, rest = dotted.partition(".")
    for f in fields(cls):
        if f.name == head:
            default = f.default_factory() if callable(f.default_factory) else f.default
            if rest:
                return _default_of(type(default), rest) if is_dataclass(default) else None
            return default
    return None


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


def unknown_key_message(key: str, chosen: Optional[str] = None) -> str:
    """chosen: the group's option the command line picked (model=custom), if any: its keys
    are the ones to suggest (model.width is resnet18's, not custom's)."""
    if key in RECORDED_KEYS:  # `hpcdl train workdir=...`
        return (
            f"{key}: recorded when the run is created, the folder hpcdl runs in; cd to the "
            "folder the run should start in (hpcdl resume RUN_DIR workdir=FOLDER moves it)"
        )
    group, _, name = key.partition(".")
    options = NAMED_GROUPS.get(group, {})
    if chosen in options and "kwargs" in _field_names(options[chosen]):
        head, _, rest = name.partition(".")
        if rest and head != "kwargs" and difflib.get_close_matches(head, ["kwargs"], n=1):
            name = rest  # model.kwarg.width: meant model.kwargs.width
        fields = _field_names(options[chosen])
        meant = _word_match(name, fields) if "." not in name else None
        if meant is not None:  # data.collate: meant data.collate_fn, not an argument
            return f"{key}: unknown key; did you mean {group}.{meant}?"
        if name.split(".")[0] not in fields:
            return (
                f"{key}: not a key of {group}={chosen}; arguments for your code go in "
                f"{group}.kwargs: {group}.kwargs.{name}=..."
            )
    if chosen in options:
        valid = [f"{group}.{field}" for field in _field_names(options[chosen])]
    else:
        valid = known_keys(group) if group in GROUPS else [*GROUPS, *TOP_LEVEL_KEYS]
    return _unknown_key_message(key, valid)


# sbatch's names for what cluster.* keys set: an HPC user types these first.
SBATCH_NAMES = {
    "cluster.time": "cluster.timeout_min (minutes)",
    "cluster.t": "cluster.timeout_min (minutes)",
    "cluster.gpus": "cluster.gpus_per_node",
    "cluster.gres": "cluster.gpus_per_node and cluster.gpu_type",
    "cluster.gpus_per_task": "cluster.gpus_per_node (one rank per GPU: tasks_per_node)",
    "cluster.ntasks_per_node": "cluster.tasks_per_node",
    "cluster.ntasks": "cluster.tasks_per_node (per node) and cluster.nodes",
    "cluster.mem": "cluster.mem_gb (GB per node)",
    "cluster.cpus": "cluster.cpus_per_task",
    "cluster.c": "cluster.cpus_per_task",
    "cluster.n": "cluster.tasks_per_node (per node) and cluster.nodes",
    "cluster.N": "cluster.nodes",
    "cluster.p": "cluster.partition",
    "cluster.A": "cluster.account",
    "cluster.C": "cluster.constraint",
    "cluster.q": "cluster.qos",
}


def _other_options_key(group: str, cls: type, key: str) -> Optional[str]:
    """A key of other options of the group than the chosen one (`data.path` with the default
    data=breast_cancer): name the options that have it, as the fix is choosing one."""
    name = key.split(".")[1] if key.count(".") >= 1 else ""
    options = NAMED_GROUPS.get(group, {})
    having = [option for option, other in options.items() if name in _field_names(other)]
    chosen = next((option for option, other in options.items() if other is cls), "?")
    if not having or chosen in having:
        return None
    return (
        f"{key}: not a key of {group}={chosen}; it is one of {group}="
        f"{', '.join(having)}: choose one first (e.g. {group}={having[0]} {key}=...)"
    )


def _unknown_key_message(key: str, valid: list[str]) -> str:
    if key.split(".")[0] == "experiment" or "@experiment." in key:  # under its group's name
        return (
            f"{key}: unknown key; experiment is a group (experiment=NAME), whose files set "
            "keys of the whole config: make `# @package _global_` an experiment file's first "
            "line (conf/experiment/*.yaml start so)"
        )
    ours = SBATCH_NAMES.get(key) or SBATCH_NAMES.get(key.replace("-", "_"))
    if ours is not None:
        name = key.partition(".")[2]
        option = f"-{name}" if len(name) == 1 else f"--{name.replace('_', '-')}"
        return f"{key}: unknown key; sbatch's {option} is set by {ours}"
    leaves = {k.rsplit(".", 1)[-1] for k in valid}
    moved = _in_another_group(key) if key.rsplit(".", 1)[-1] not in leaves else None
    group = key.rpartition(".")[0]
    word = _word_match(key.rsplit(".", 1)[-1], [k.rsplit(".", 1)[-1] for k in valid])
    if moved is None and word is not None and f"{group}.{word}" in valid:
        moved = f"{group}.{word}"  # data.flip: data.random_flip, not data.fold
    close = [moved] if moved else difflib.get_close_matches(key, valid, n=1)
    hint = f"did you mean {close[0]}?" if close else f"valid keys: {', '.join(valid)}"
    return f"{key}: unknown key; {hint}"


def _word_match(typed: str, names: Sequence[str]) -> Optional[str]:
    """The one name that has `typed` as one of its words (flip: random_flip; collate:
    collate_fn), if exactly one has."""
    found = {n for n in names if n != typed and typed in n.split("_")}
    return found.pop() if len(found) == 1 else None


# What people call hpcdl's keys elsewhere (Lightning, Keras, argparse scripts).
KEY_ALIASES = {
    "learning_rate": "lr",
    "epochs": "max_epochs",
    "num_epochs": "max_epochs",
    "n_epochs": "max_epochs",
    "bs": "batch_size",
    "accumulate_grad_batches": "micro_batches",  # gradient accumulation
    "gradient_accumulation_steps": "micro_batches",
    "grad_accum_steps": "micro_batches",
    "accumulation_steps": "micro_batches",
}


def _in_another_group(key: str) -> Optional[str]:
    """trainer.lr -> optim.lr, max_epochs -> trainer.max_epochs, optim.learning_rate ->
    optim.lr: the one key of any group with that last name (or its usual alias)."""
    leaf = key.rsplit(".", 1)[-1]
    leaf = KEY_ALIASES.get(leaf, leaf)
    found = {k for group in GROUPS for k in known_keys(group) if k.rsplit(".", 1)[-1] == leaf}
    return found.pop() if len(found) == 1 and key not in found else None


def to_plain(cfg: schema.Config) -> dict[str, Any]:
    """The config as plain YAML/JSON-able data (enums as their values). An unrecorded
    workdir is left out: a run created before it existed may be resumed on Slurm with the
    hpcdl frozen in its code/, which refuses a key it does not know."""
    plain: dict[str, Any] = _plain(asdict(cfg))
    if plain.get("workdir") is None:
        plain.pop("workdir", None)
    return plain


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _is_yaml_data(value: Any) -> bool:
    """Dicts with str keys, lists and plain scalars, no string with an interpolation
    (`${`): data OmegaConf.create and to_container give back unchanged."""
    kind = type(value)
    if kind is str:
        return "${" not in value
    if kind is dict:
        return all(type(k) is str and "${" not in k and _is_yaml_data(v) for k, v in value.items())
    if kind is list:
        return all(_is_yaml_data(v) for v in value)
    return kind in _PLAIN_SCALARS


@functools.cache
def _yaml_dumper() -> type:
    from omegaconf._utils import get_omega_conf_dumper

    class PlainDumper(get_omega_conf_dumper()):  # type: ignore[misc]
        """OmegaConf's dumper (quotes strings that would read back as numbers or bools).
        No anchors: OmegaConf copies every node, so its YAML never has any."""

        def ignore_aliases(self, data: Any) -> bool:
            return True

    return PlainDumper


def to_yaml(cfg: schema.Config) -> str:
    """The config as OmegaConf.to_yaml writes it, byte for byte (tests/test_config.py
    compares them), without building an OmegaConf tree first. Data OmegaConf would check
    or change (an interpolation) takes its way.

    A block mapping's YAML is its entries' YAML one after another, so each group's entry
    is written once per distinct group: a sweep's 100 configs share most of theirs (about
    3 ms a config, 100 times a sweep, down to a few tenths of a ms)."""
    plain = to_plain(cfg)
    if not _is_yaml_data(plain):
        return OmegaConf.to_yaml(OmegaConf.create(plain))
    return "".join(_entry_yaml(key, value) for key, value in plain.items())


def _entry_yaml(key: str, value: Any) -> str:
    if type(value) is not dict:  # run_dir, init_from: one of a kind, not worth keeping
        return _dumped({key: value})
    return _remembered(_ENTRY_YAML, (key, _frozen(value)), lambda: _dumped({key: value}))


def _dumped(data: dict[str, Any]) -> str:
    # OmegaConf.to_yaml's own arguments (omegaconf 2.3).
    text: str = yaml.dump(
        data,
        Dumper=_yaml_dumper(),
        default_flow_style=False,
        allow_unicode=True,
        sort_keys=False,
    )
    return text


# The config of an `hpcdl run` run holds every section, as every run's does; this says which
# of them its job reads.
SCRIPT_RUN_HEADER = (
    "# hpcdl run: the job is the program in `script`, on the resources in `cluster`; the model,\n"
    "# data, task, optim, schedule and trainer sections are hpcdl train's and unused here\n"
)


def save_config(cfg: schema.Config, path: Path) -> None:
    header = SCRIPT_RUN_HEADER if cfg.script is not None else ""
    write_atomic(path, header + to_yaml(cfg))


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


@functools.cache
def _yaml_loader() -> type:
    """OmegaConf's YAML loader on libyaml's parser where PyYAML has it (about 10x faster):
    OmegaConf's scalar rules (its float pattern, no timestamps) and its refusal of a key
    given twice, so a file reads as OmegaConf.load reads it."""
    from omegaconf._utils import get_yaml_loader

    omegaconf_loader: Any = get_yaml_loader()
    if not getattr(yaml, "__with_libyaml__", False):
        return omegaconf_loader

    class ConfigLoader(yaml.CSafeLoader):
        yaml_implicit_resolvers = omegaconf_loader.yaml_implicit_resolvers

        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Any:
            keys = set()
            for key_node, _ in node.value:
                if key_node.tag != yaml.resolver.BaseResolver.DEFAULT_SCALAR_TAG:
                    continue
                if key_node.value in keys:  # load_config then lets OmegaConf say so
                    raise yaml.constructor.ConstructorError(
                        None, None, f"found duplicate key {key_node.value}", key_node.start_mark
                    )
                keys.add(key_node.value)
            return super().construct_mapping(node, deep=deep)

    return ConfigLoader


def read_plain_yaml(path: Path) -> Optional[dict[str, Any]]:
    """The file's mapping when it is plain YAML data (what hpcdl writes), read without
    OmegaConf; None for anything else (unreadable, invalid, an interpolation, a key that
    is not a string), which load_config then reads, and reports, through OmegaConf."""
    try:
        text = path.read_text(encoding="utf-8")
        # libyaml takes a tab where PyYAML refuses one (`a:<TAB>1`); hpcdl writes none.
        if "\t" in text:
            return None
        raw = yaml.load(text, Loader=_yaml_loader())
    except (OSError, ValueError, yaml.YAMLError):
        return None
    return raw if type(raw) is dict and _is_yaml_data(raw) else None


def load_config(path: Path) -> schema.Config:
    fast = read_plain_yaml(Path(path))
    if fast is not None:
        return from_dict(fast)
    try:
        loaded = OmegaConf.load(path)
        if isinstance(loaded, DictConfig):
            keep_shell_variables(loaded)  # a run's `${USER}`, as it was submitted
        raw = OmegaConf.to_container(loaded, resolve=True)
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
