"""A user's model: model.target='package.module:callable', a class or a factory.

The callable gets `input_shape` and `num_classes` only where its signature has a parameter
of that name or a **kwargs catch-all, so an existing nn.Module class works unchanged with
just its own model.kwargs. A value the user sets in model.kwargs replaces the data's.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Optional

from torch import nn

from hpcdl.config.schema import CustomModelConfig
from hpcdl.errors import ConfigError, first_line, raised
from hpcdl.targets import accepts, parameter_names, required_not_given, resolve_callable


def build_custom(
    cfg: CustomModelConfig, input_shape: tuple[int, ...], num_classes: int
) -> nn.Module:
    key = f"model.target={cfg.target!r}"
    factory = resolve_callable("model.target", cfg.target)
    signature = readable_signature(factory)
    data_kwargs: dict[str, Any] = {"input_shape": input_shape, "num_classes": num_classes}
    if signature is not None:
        data_kwargs = {k: v for k, v in data_kwargs.items() if accepts(signature, k)}
    if not input_shape:  # samples that are not (x, y) pairs or x/y dicts: shape unknown
        param = signature.parameters.get("input_shape") if signature is not None else None
        required = param is not None and param.default is inspect.Parameter.empty
        if required and "input_shape" not in cfg.kwargs:
            raise ConfigError(
                f"{key}: takes input_shape, but the data's samples are not (x, y) pairs or "
                "x/y dicts, so hpcdl cannot tell it; set model.kwargs.input_shape=[...]"
            )
        data_kwargs.pop("input_shape", None)  # its default, or model.kwargs', applies
    if num_classes < 1:  # the data names no classes (data=custom without them)
        named = signature is not None and "num_classes" in signature.parameters
        if named and "num_classes" not in cfg.kwargs:
            raise ConfigError(
                f"{key}: takes num_classes, but the data names no classes; set data.num_classes "
                "or model.kwargs.num_classes"
            )
        data_kwargs.pop("num_classes", None)
    if signature is not None:
        check_kwargs_fit(cfg, signature, data_kwargs)
    try:
        model = factory(**{**data_kwargs, **cfg.kwargs})
    except TypeError as exc:
        if signature is not None:  # the arguments fit, so the callable itself raised it
            raise ConfigError(f"{key}: {raised(exc)}") from exc
        raise ConfigError(
            f"{key}: calling it with {', '.join(data_kwargs)} and model.kwargs="
            f"{dict(cfg.kwargs)} failed ({first_line(exc)}); it must accept those keyword "
            "arguments"
        ) from exc
    except Exception as exc:
        raise ConfigError(f"{key}: {raised(exc)}") from exc
    if not isinstance(model, nn.Module):
        raise ConfigError(f"{key}: returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def readable_signature(factory: Callable[..., Any]) -> Optional[inspect.Signature]:
    """The callable's parameters (a class's __init__ without self); None for builtins and
    C extensions that have none to read."""
    try:
        return inspect.signature(factory)
    except (TypeError, ValueError):
        return None


def check_kwargs_fit(
    cfg: CustomModelConfig, signature: inspect.Signature, data_kwargs: dict[str, Any]
) -> None:
    """A one-line ConfigError naming the model.kwargs that do not fit the callable."""
    kwargs = dict(cfg.kwargs)
    passed = {**data_kwargs, **kwargs}
    try:
        signature.bind(**passed)
        return
    except TypeError as exc:
        reason = first_line(exc)
    name = cfg.target.partition(":")[2]
    unknown = [k for k in kwargs if not accepts(signature, k)]
    missing = required_not_given(signature, passed)
    if unknown:
        problem = f"{name} takes no {', '.join(f'model.kwargs.{k}' for k in unknown)}"
    elif missing:
        problem = f"{name} needs {', '.join(missing)}; set model.kwargs.{missing[0]}=..."
    else:
        problem = f"model.kwargs={kwargs} do not fit {name} ({reason})"
    raise ConfigError(
        f"model.target={cfg.target!r}: {problem}; its parameters: {parameter_names(signature)}"
    )
