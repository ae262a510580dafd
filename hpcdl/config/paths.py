"""The config keys that name files or folders, made absolute once, from where the command
that gave them ran, so that later commands (resume, evaluate, predict, a Slurm job, whose
working directory is wherever sbatch ran) read the same files from any folder.

Only keys hpcdl knows are paths: the built-in data kinds' own, and init_from. The keys
of user code (data.kwargs, model.kwargs) are the user's to interpret; those are read
from the run's working directory (Config.workdir), as at the start.

Stdlib + config only (no torch): used on the login node.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpcdl.config import schema

# The path keys of the built-in data kinds (schema.DATA_SCHEMAS): every one that has them.
DATA_PATH_KEYS = ("path", "labels_path")


def path_keys(cfg: schema.Config) -> dict[str, str]:
    """{dotted key: value} for each path key this config sets (data.path, init_from, ...)."""
    found = {
        f"data.{key}": value
        for key in DATA_PATH_KEYS
        if isinstance(value := getattr(cfg.data, key, None), str)
    }
    if cfg.init_from is not None:
        found["init_from"] = cfg.init_from
    return found


def absolute(value: str, base: Path) -> str:
    """A path as given when it is absolute (or starts with ~), else `base / value`, with `..`
    folded in (links are kept: a link to scratch may be pointed elsewhere later)."""
    if value in ("", schema.MISSING) or Path(value).expanduser().is_absolute():
        return value
    return os.path.normpath(base / value)


def with_absolute_paths(
    cfg: schema.Config, base: Path, only: frozenset[str] | None = None
) -> schema.Config:
    """`cfg` with its relative path keys (path_keys; `only` those named) made absolute
    from `base`."""
    changed: dict[str, Any] = {
        key: absolute(value, base)
        for key in DATA_PATH_KEYS
        if isinstance(value := getattr(cfg.data, key, None), str)
        and (only is None or f"data.{key}" in only)
    }
    data: Any = replace(cfg.data, **changed) if changed else cfg.data
    init_from = cfg.init_from
    if init_from is not None and (only is None or "init_from" in only):
        init_from = absolute(init_from, base)
    if data is cfg.data and init_from == cfg.init_from:
        return cfg
    return replace(cfg, data=data, init_from=init_from)
