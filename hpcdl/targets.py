"""User code named in the config as 'package.module:attribute' (model.target,
trainer.step_hooks, ...): imported inside the job only, never on the login node."""

from __future__ import annotations

import difflib
import importlib
import inspect
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from hpcdl.config.validate import check_target_form
from hpcdl.errors import ConfigError, raised


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
    except Exception as exc:  # the module's own code failed: a SyntaxError, a raise at import
        raise ConfigError(
            f"{where}: importing {module_name!r} {raised(exc)}{_where_raised(exc)}; fix the "
            "module so that it imports"
        ) from exc
    found: object = module
    for depth, attr in enumerate(attr_path.split(".")):
        if not hasattr(found, attr):
            names = [n for n in dir(found) if not n.startswith("_")]
            close = difflib.get_close_matches(attr, names, n=1)
            guess = ".".join([*attr_path.split(".")[:depth], close[0]]) if close else ""
            hint = f"; did you mean {module_name}:{guess}?" if guess else ""
            raise ConfigError(
                f"{where}: module {module_name!r} has no attribute {attr_path!r}{hint}"
            )
        found = getattr(found, attr)
    return found


def _where_raised(exc: BaseException) -> str:
    """' (models.py line 3)': where the module's code failed ("" for a SyntaxError, whose
    message names its file and line)."""
    if isinstance(exc, SyntaxError):
        return ""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    return f" ({Path(frames[-1].filename).name} line {frames[-1].lineno})"


def resolve_callable(key: str, target: str) -> Callable[..., Any]:
    found = resolve_target(key, target)
    if not callable(found):
        raise ConfigError(
            f"{key}={target!r}: {target.partition(':')[2]!r} is a {type(found).__name__}, not callable"
        )
    return cast(Callable[..., Any], found)


def accepts(signature: inspect.Signature, name: str) -> bool:
    """Whether `name=...` may be passed: a parameter of that name, or a **kwargs."""
    param = signature.parameters.get(name)
    if param is not None:
        return param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)
    return any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values())


def parameter_names(signature: inspect.Signature) -> str:
    names = [star(p) + p.name for p in signature.parameters.values()]
    return ", ".join(names) or "none"


def required_not_given(signature: inspect.Signature, given: Mapping[str, Any]) -> list[str]:
    """The parameters a call by keyword must give that `given` lacks (no default)."""
    return [
        p.name
        for p in signature.parameters.values()
        if p.default is p.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in given
    ]


def star(param: inspect.Parameter) -> str:
    if param.kind == param.VAR_POSITIONAL:
        return "*"
    return "**" if param.kind == param.VAR_KEYWORD else ""


def check_step_kwargs(
    key: str, target: str, fn: Callable[..., Any], kwargs: dict[str, Any]
) -> None:
    """A one-line ConfigError naming the `<key>.kwargs` that a step function called as
    fn(model, batch, **kwargs) does not take (what it takes, too)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    refuse_kwargs_not_taken(key, target, signature, kwargs)


def refuse_kwargs_not_taken(
    key: str, target: str, signature: inspect.Signature, kwargs: Mapping[str, Any]
) -> None:
    """`<key>.target=...: Name takes no <key>.kwargs.x; its parameters: ...`, for the keys
    the signature cannot take."""
    unknown = [k for k in kwargs if not accepts(signature, k)]
    if unknown:
        name = target.partition(":")[2]
        raise ConfigError(
            f"{key}.target={target!r}: {name} takes no "
            f"{', '.join(f'{key}.kwargs.{k}' for k in unknown)}; its parameters: "
            f"{parameter_names(signature)}"
        )
