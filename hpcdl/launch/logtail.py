"""Copy what a growing log file gained since the last look to our stdout."""

from __future__ import annotations

import sys
from pathlib import Path


def copy_new(path: Path, offset: int) -> int:
    """Write bytes of `path` past `offset` to stdout; return the new offset (missing file: same)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except FileNotFoundError:
        return offset
    if chunk:
        sys.stdout.write(chunk.decode(errors="replace"))
        sys.stdout.flush()
    return offset + len(chunk)
