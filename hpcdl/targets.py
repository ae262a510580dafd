"""User code named in the config as 'package.module:attribute' (model.target,
trainer.step_hooks, ...): imported inside the job only, never on the login node."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, cast

from hpcdl.config.validate import check_target_form
from hpcdl.errors import ConfigError


def resolve_target(key: str, target: str) -> object:
    """The object `target` names; one-line ConfigError naming `key` when it cannot be found."""
    where = f"{key}={target!r}"
    check_target_form(key, target)
    module_name, _, attr_path = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{where}: cannot import {module_name!r} ({exc}); install it or put its folder on "
            "PYTHONPATH"
        ) from exc
    found: object = module
    for attr in attr_path.split("."):
        if not hasattr(found, attr):
            raise ConfigError(f"{where}: module {module_name!r} has no attribute {attr_path!r}")
        found = getattr(found, attr)
    return found


def resolve_callable(key: str, target: str) -> Callable[..., Any]:
    found = resolve_target(key, target)
    if not callable(found):
        raise ConfigError(
            f"{key}={target!r}: {target.partition(':')[2]!r} is a {type(found).__name__}, not callable"
        )
    return cast(Callable[..., Any], found)
