"""Errors that reach the user as one line and exit status 2."""

from __future__ import annotations

import contextlib
import errno
import sys
import warnings
from collections.abc import Iterator
from typing import TextIO


class HpcdlError(Exception):
    """Base class: the message is one line naming the key or file and how to fix it."""


class HpcdlWarning(UserWarning):
    """Base class of hpcdl's warnings: one line, shown as `warning: ...` by the commands."""


@contextlib.contextmanager
def warnings_as_lines() -> Iterator[None]:
    """HpcdlWarnings as one `warning: <message>` line on stderr, instead of Python's
    `file:line: Category: message` and the source line; other warnings as Python shows them."""
    shown = warnings.showwarning

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if issubclass(category, HpcdlWarning):
            print(f"warning: {message}", file=sys.stderr, flush=True)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


def plural(count: int, noun: str) -> str:
    """`1 epoch`, `2 epochs`: a count in a message, with its noun (a plain -s plural)."""
    return f"{count} {noun}" + ("" if count == 1 else "s")


class ConfigError(HpcdlError):
    """A config key has an unknown name, a wrong type or a bad value."""


class DataError(HpcdlError):
    """A data file is missing, unreadable or does not hold what the config says."""


class DataWarning(HpcdlWarning):
    """A data file holds something hpcdl leaves out (e.g. columns the model does not take)."""


class CheckpointError(HpcdlError):
    """A checkpoint is missing, corrupt, or does not match the model."""


class DeviceMemoryError(HpcdlError):
    """Training ran out of GPU (or CPU) memory; the message names what to lower."""


class RunDirError(HpcdlError):
    """A run directory collides with an existing one or is not a run directory."""


class WriteError(HpcdlError):
    """A file or folder could not be written: disk full, read-only, no permission.

    ``path`` is what could not be written and ``reason`` the cause with its fix (from
    ``os_error_reason``), so that callers can put the error in their own words.
    """

    def __init__(self, path: object, reason: str) -> None:
        super().__init__(f"{path}: not written: {reason}")
        self.path = path
        self.reason = reason


# What to do about the errors a full, read-only or failing file system gives.
_OS_ERROR_FIXES = {
    errno.ENOSPC: "free space there, or write to another file system",
    errno.EDQUOT: "your disk quota there is used up; free space, or write elsewhere",
    errno.EFBIG: "the file is larger than this file system or your limits allow (ulimit -f)",
    errno.EROFS: "that file system is mounted read-only; write to another one",
    errno.EACCES: "you have no write permission there; write elsewhere or fix the permissions",
    errno.EPERM: "you have no write permission there; write elsewhere or fix the permissions",
    errno.EIO: "the storage reported an I/O error; check the disk or write elsewhere",
}


def os_error_reason(err: OSError) -> str:
    """One line for an OSError: the cause, its errno name and what to do about it."""
    cause = err.strerror or str(err) or type(err).__name__
    name = errno.errorcode.get(err.errno or 0)
    fix = _OS_ERROR_FIXES.get(err.errno or 0)
    return cause + (f" ({name})" if name else "") + (f"; {fix}" if fix else "")


def raised(exc: BaseException) -> str:
    """'raised KeyError: 0': an exception of the user's code, in one line."""
    message = first_line(exc)
    return f"raised {type(exc).__name__}" + (f": {message}" if message else "")


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""


def did_you_mean(given: str, choices: list[str]) -> str:
    """'did you mean val_macro_f1? ' for a name close to one of `choices` (case aside), else
    ''."""
    import difflib

    lowered = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(given.lower(), list(lowered), n=1, cutoff=0.75)
    return f"did you mean {lowered[close[0]]}? " if close else ""
