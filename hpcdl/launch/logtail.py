"""Copy what a growing log file gained since the last look to our stdout."""

from __future__ import annotations

import sys
from pathlib import Path


def copy_new(path: Path, offset: int) -> int:
    """Write bytes of `path` past `offset` to stdout; return the new offset (missing file: same)."""
    chunk = _read_from(path, offset)
    if chunk:
        sys.stdout.write(chunk.decode(errors="replace"))
        sys.stdout.flush()
    return offset + len(chunk)


class LineEcho:
    """A growing log's complete lines to stdout, but those starting with `hidden` (which stay
    in the file): a local run's terminal shows rank 0's output without submitit's own
    `submitit INFO (...) - Loading pickle ...` lines."""

    def __init__(self, path: Path, hidden: bytes) -> None:
        self.path, self.hidden = path, hidden
        self._offset, self._partial = 0, b""

    def poll(self, *, final: bool = False) -> None:
        """Echo the lines completed since the last poll; `final`: the unfinished one too."""
        chunk = _read_from(self.path, self._offset)
        self._offset += len(chunk)
        lines = (self._partial + chunk).splitlines(keepends=True)
        self._partial = b""
        if lines and not final and not lines[-1].endswith((b"\n", b"\r")):
            self._partial = lines.pop()
        text = b"".join(line for line in lines if not line.startswith(self.hidden))
        if text:
            sys.stdout.write(text.decode(errors="replace"))
            sys.stdout.flush()


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read()
    except FileNotFoundError:
        return b""
