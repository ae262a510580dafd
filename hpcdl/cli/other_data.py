"""The keys `hpcdl evaluate` and `hpcdl predict` take on their command line: data keys
that point the run's data builder at other data (a held-out file, a shifted
distribution), for this command only; config.yaml is never changed.

    hpcdl evaluate RUN_DIR [--split S] data.path=other.npz
    hpcdl predict RUN_DIR --split all data.kwargs.path=new.npy [task.predict=...]

Every other key is refused in one line naming it: the model, its preprocessing and its
classes are the checkpoint's, and training or cluster settings mean nothing here.
Paths typed here are the current folder's (as on resume's command line), made absolute
before the command enters the run's workdir.

Stdlib + config only (no torch).
"""

from __future__ import annotations

import difflib
import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from hpcdl.config.paths import path_keys, with_absolute_paths
from hpcdl.config.schema import Config, CustomDataConfig
from hpcdl.errors import ConfigError, HpcdlWarning

# --split: one of the data's splits, or `all` of its samples (hpcdl.inference.ALL_SPLIT).
SPLITS = ("test", "val", "train", "all")

# Per data kind, the keys that say which samples to read. The model never sees them, so
# any value the data builder accepts is fine.
SOURCE_KEYS: dict[str, tuple[str, ...]] = {
    "files": ("path", "labels_path", "label_column"),
    "mnist": ("path",),
    "cifar10": ("path",),
    "imagefolder": ("path",),
    "custom": ("target", "kwargs"),
    # Another draw of the same classes (data.seed fixes the class centres: refused below).
    "synthetic": ("num_samples", "noise"),
    "breast_cancer": (),
    "digits": (),
}
# How samples are read, not what they are: results do not depend on them.
READING_KEYS = ("num_workers", "in_memory", "prefetch_factor")

_SPLIT_REASON = (
    "it would split the data another way, and on the run's own data put training samples "
    "into the split evaluated; other data is split as the run's was, or give --split all "
    "to use every sample"
)
_INPUT_REASON = "it changes the model's input, which training fixed"
# Data keys refused, and why. Keys in none of these lists are refused with REASON_OTHER.
REFUSED_DATA_KEYS: dict[str, str] = {
    "name": "the data kind is the run's; point it at other data with its own keys",
    # Inference applies the training split's mean/std stored in the checkpoint; refitting
    # on other data would silently feed the model inputs on another scale.
    "standardize": "the preprocessing is the checkpoint's (the training split's mean and std)",
    "as_images": _INPUT_REASON + " (its shape)",
    "shape": _INPUT_REASON + " (its shape)",
    "channels": _INPUT_REASON + " (its channels)",
    "image_size": _INPUT_REASON + " (its size)",
    "crop_size": _INPUT_REASON + " (its size)",
    "mean": _INPUT_REASON + " (its normalization)",
    "std": _INPUT_REASON + " (its normalization)",
    "random_crop": "a training augmentation; inference reads samples as they are",
    "random_flip": "a training augmentation; inference reads samples as they are",
    "num_classes": "the model's outputs are the checkpoint's classes",
    "seed": "it draws other class centres, which the model's classes do not match",
    "collate_fn": "it makes the batches that the model and the task read, as in training",
    "val_fraction": _SPLIT_REASON,
    "test_fraction": _SPLIT_REASON,
    "split_seed": _SPLIT_REASON,
    "num_folds": _SPLIT_REASON,
    "fold": _SPLIT_REASON,
}
REASON_OTHER = {
    "model": "the model is the checkpoint's",
    "task": "the task is the run's (predict takes task.predict for task=custom)",
    "optim": "a training setting; evaluate and predict do not train",
    "trainer": "a training setting; evaluate and predict do not train",
    "cluster": "evaluate and predict run here, in this process",
}


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ConfigError(f"split={split!r}: choose one of {', '.join(SPLITS)}")


def inference_config(
    cfg: Config, overrides: Sequence[str], command: str
) -> tuple[Config, list[str]]:
    """The run's config with the command line's keys applied for this command: data keys
    (SOURCE_KEYS, READING_KEYS), trainer.batch_size (samples per forward pass) and, for
    predict, task.predict. Returns the config and the data overrides as they resolved
    (paths absolute), [] without any: what names and records the evaluation."""
    from hpcdl.cli.compose import apply_overrides

    data_items, other_items, predict_items = [], [], []
    for item in overrides:
        key, sep, _ = item.partition("=")
        if not sep:
            raise ConfigError(f"{item}: give key=value, e.g. data.path=other.npz")
        if key == "task.predict" and command == "predict":
            predict_items.append(item)
        elif key == "trainer.batch_size":
            other_items.append(item)
        elif key.startswith("data."):
            _refuse_data_key(cfg, key, item, command)
            data_items.append(item)
        else:
            raise ConfigError(_refusal(key, item, command))
    if data_items or other_items:
        given = apply_overrides(cfg, [*data_items, *other_items])
        trainer = replace(cfg.trainer, batch_size=given.trainer.batch_size)
        given = replace(cfg, data=given.data, trainer=trainer)
        cfg = _paths_from_here(given, _keys(data_items))
    if predict_items:
        cfg = with_predict_function(cfg, predict_items)
    applied = [f"{key}={_text(_value(cfg, key))}" for key in _keys(data_items)]
    return cfg, applied


def _keys(items: list[str]) -> list[str]:
    """The keys given, once each, in the order first given."""
    return list(dict.fromkeys(item.partition("=")[0] for item in items))


def _refuse_data_key(cfg: Config, key: str, item: str, command: str) -> None:
    name, _, deeper = key[len("data.") :].partition(".")
    kind = cfg.data.name
    allowed = (*SOURCE_KEYS.get(kind, ()), *READING_KEYS)
    if name in allowed and hasattr(cfg.data, name) and (not deeper or name == "kwargs"):
        return
    reason = REFUSED_DATA_KEYS.get(name)
    if reason is None and not hasattr(cfg.data, name):  # a typo: name the key meant
        close = difflib.get_close_matches(name, [f.name for f in fields(cfg.data)], n=1)
        reason = f"unknown key of data={kind}" + (
            f"; did you mean data.{close[0]}?" if close else ""
        )
    if reason is None:
        known = ", ".join(f"data.{k}" for k in SOURCE_KEYS.get(kind, ()))
        reason = f"not a key of data={kind} that names its samples" + (
            f" ({known}{'.*' if kind == 'custom' else ''})" if known else ""
        )
    raise ConfigError(f"{item}: hpcdl {command} cannot change {key}: {reason}")


def _refusal(key: str, item: str, command: str) -> str:
    group = key.lstrip("+~").split(".")[0]
    if group == "data":  # data=files: a group choice
        reason = REFUSED_DATA_KEYS["name"]
    else:
        reason = REASON_OTHER.get(group, "not a data key")
    takes = "data keys that point the run at other data (data.path, data.kwargs.*, ...)"
    if command == "predict":
        takes += " and task.predict"
    return f"{item}: hpcdl {command} takes only {takes}; {key}: {reason}"


def _paths_from_here(given: Config, keys: list[str]) -> Config:
    """`given` with the paths typed on this command line made absolute from the current
    folder: data.path and data.labels_path, and each data.kwargs value given (`keys`)
    that names a file or folder here (data.kwargs are the user's, read from the run's
    workdir, where a path typed here could name another file; a value that names nothing
    here is passed as typed)."""
    given = with_absolute_paths(given, Path.cwd(), only=frozenset(keys) & set(path_keys(given)))
    if not isinstance(given.data, CustomDataConfig):
        return given
    kwargs = dict(given.data.kwargs)
    typed = {k.split(".")[2] for k in keys if k.startswith("data.kwargs.")}
    if "data.kwargs" in keys:
        typed = set(kwargs)
    for name, value in kwargs.items():
        if name in typed and _names_a_path_here(value):
            kwargs[name] = os.path.abspath(Path(value).expanduser())
        elif name in typed and _bare_name_elsewhere(value, given.workdir):
            warnings.warn(
                HpcdlWarning(
                    f"data.kwargs.{name}={value!r}: a bare name is passed as typed, and your "
                    f"data function reads it in the run's workdir ({given.workdir}), not "
                    f"here, where ./{value} is another; for the one here write "
                    f"data.kwargs.{name}=./{value}"
                ),
                stacklevel=2,
            )
    return replace(given, data=replace(given.data, kwargs=kwargs))


def _bare_name_elsewhere(value: Any, workdir: str | None) -> bool:
    """A name without a folder part or suffix (`heldout`) that names a file or folder
    here, typed where the run's data function does not read it (its workdir is another
    folder): passed as typed (`test` may be a mode), but said."""
    if not isinstance(value, str) or not value or os.sep in value or Path(value).suffix:
        return False
    here = Path(value).exists()
    return here and workdir is not None and Path(workdir).resolve() != Path.cwd().resolve()


def _names_a_path_here(value: Any) -> bool:
    """A str that looks like a path (a folder part or a suffix: not `test`, which may be a
    mode as well as a folder) and names a file or folder in the current folder."""
    if not isinstance(value, str) or not value:
        return False
    path = Path(value).expanduser()
    return (os.sep in value or bool(path.suffix)) and path.exists()


def _value(cfg: Config, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return asdict(node) if hasattr(node, "__dataclass_fields__") else node


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def with_predict_function(cfg: Config, overrides: list[str]) -> Config:
    """`hpcdl predict RUN_DIR task.predict=package.module:function`, for a task=custom
    run trained without it (its config.yaml is left as it is)."""
    from hpcdl.config.schema import CustomTaskConfig
    from hpcdl.config.validate import check_target_form

    for item in overrides:
        _, _, value = item.partition("=")
        if not isinstance(cfg.task, CustomTaskConfig):
            raise ConfigError(
                f"{item}: this run has task={cfg.task.name}, whose predictions hpcdl writes "
                "itself; task.predict is for task=custom"
            )
        check_target_form("task.predict", value)
        cfg = replace(cfg, task=replace(cfg.task, predict=value))
    return cfg
