"""The parameters of a user's `package.module:Name`, read from its source file without
running any of it (a Slurm login node imports none of the user's code): enough to refuse a
`model.kwargs` (or data/task) key the callable cannot take before the job waits in the
queue to find it out. Where the source does not tell for certain (a decorator, an inherited
or generated __init__, a name bound some other way, code hpcdl cannot read), nothing is
refused: the job checks the real signature.
"""

from __future__ import annotations

import ast
import difflib
import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional, Union

from hpcdl.launch.snapshot import find_top_level, user_module_source
from hpcdl.targets import refuse_kwargs_not_taken

_Def = Union[ast.FunctionDef, ast.AsyncFunctionDef]


def refuse_unknown_kwargs(key: str, target: str, kwargs: Mapping[str, Any]) -> None:
    """`<key>.target=...: Name takes no <key>.kwargs.x; its parameters: ...` (the job's own
    words for it), when the source shows the callable cannot take a key."""
    if not kwargs:
        return
    signature = static_signature(target)
    if signature is not None:
        refuse_kwargs_not_taken(key, target, signature, kwargs)


def static_signature(target: str) -> Optional[inspect.Signature]:
    """The parameters `Name` takes (a class: its own __init__'s, without self), or None
    when its source does not say for certain."""
    module, _, name = target.partition(":")
    path = source_file(module)
    if path is None or not name or "." in name:
        return None
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, SyntaxError):  # the job reports a broken module
        return None
    bound = [n for n in tree.body if _binds(n, name)]
    if not bound or not isinstance(
        bound[-1], (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    ):
        return None  # not bound, or bound by an assignment or an import
    node = bound[-1]
    if node.decorator_list:  # @dataclass, @functools.wraps, a registry: not the source's
        return None
    if isinstance(node, ast.ClassDef):
        inits = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
        if len(inits) != 1 or inits[0].decorator_list or _has_new(node):
            return None  # inherited (or made) elsewhere
        return _signature(inits[0], drop_first=True)
    return _signature(node, drop_first=False)


def unbound_name(target: str) -> Optional[str]:
    """Why `package.module:Name` cannot be found, when the module's source binds no `Name`
    anywhere (a typo: `Regg` for `Reg`), read without running it; None where it does, or
    may (a star import, a module `__getattr__`, `globals()`), or the source is not read."""
    module, _, name = target.partition(":")
    path = source_file(module)
    if path is None or not name.isidentifier():
        return None
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, SyntaxError):  # the job reports a broken module
        return None
    if any(_binds(node, name) for node in tree.body):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return None
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            return None
        if isinstance(node, ast.Name) and node.id in ("globals", "setattr", "exec"):
            return None
    names = sorted(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)))
    close = difflib.get_close_matches(name, names, n=1)
    hint = (
        f"; did you mean {module}:{close[0]}?"
        if close
        else (f" (it has {', '.join(names[:8])})" if names else "")
    )
    return f"{path} has no {name!r}{hint}"


def source_file(module: str) -> Optional[Path]:
    """The .py file of one of the user's own modules, found without importing it or its
    package (None: installed, compiled, not found here)."""
    top, *rest = module.split(".")
    spec = find_top_level(top)
    source = user_module_source(spec) if spec is not None else None
    if source is None:
        return None
    if not rest:
        return source / "__init__.py" if source.is_dir() else source
    folder = source
    for part in rest[:-1]:
        folder = folder / part
    last = folder / rest[-1]
    for candidate in (last.with_suffix(".py"), last / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _binds(node: ast.AST, name: str) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == name
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(name in {n.id for n in ast.walk(t) if isinstance(n, ast.Name)} for t in targets)
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any((a.asname or a.name.split(".")[0]) == name for a in node.names)
    if isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):  # may bind it
        return any(_binds(inner, name) for inner in ast.walk(node) if inner is not node)
    return False


def _has_new(node: ast.ClassDef) -> bool:
    return any(isinstance(n, ast.FunctionDef) and n.name == "__new__" for n in node.body)


def _signature(node: _Def, *, drop_first: bool) -> Optional[inspect.Signature]:
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    if drop_first:
        if not positional:
            return None  # an __init__ without self: not a plain method
        positional = positional[1:]
    has_default = [False] * (len(positional) - len(args.defaults)) + [True] * len(args.defaults)
    if len(has_default) > len(positional):  # self had a default: keep to the real ones
        has_default = has_default[-len(positional) :] if positional else []
    required = inspect.Parameter.empty  # no default
    params = []
    posonly = {a.arg for a in args.posonlyargs}
    for arg, defaulted in zip(positional, has_default, strict=True):
        kind = (
            inspect.Parameter.POSITIONAL_ONLY
            if arg.arg in posonly
            else inspect.Parameter.POSITIONAL_OR_KEYWORD
        )
        params.append(inspect.Parameter(arg.arg, kind, default=None if defaulted else required))
    if args.vararg is not None:
        params.append(inspect.Parameter(args.vararg.arg, inspect.Parameter.VAR_POSITIONAL))
    for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        kw = required if kw_default is None else None
        params.append(inspect.Parameter(arg.arg, inspect.Parameter.KEYWORD_ONLY, default=kw))
    if args.kwarg is not None:
        params.append(inspect.Parameter(args.kwarg.arg, inspect.Parameter.VAR_KEYWORD))
    try:
        return inspect.Signature(params)
    except ValueError:
        return None
