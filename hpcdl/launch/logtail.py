"""Copy what a growing log file gained since the last look to our stdout."""

from __future__ import annotations

import sys
from pathlib import Path

from hpcdl.launch.diagnose import PEER_GONE


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
    `submitit INFO (...) - Loading pickle ...` lines.

    `fold_peer_loss`: a traceback whose exception is the loss of another rank (gloo's
    "Connection closed by peer" when that rank failed) is shown as one line naming the log
    that keeps it: the cause is the other rank's error, which the launcher prints after."""

    def __init__(self, path: Path, hidden: bytes, fold_peer_loss: bool = False) -> None:
        self.path, self.hidden, self.fold = path, hidden, fold_peer_loss
        self._offset, self._partial = 0, b""
        self._block: list[bytes] = []  # a traceback's lines, held until its last line

    def poll(self, *, final: bool = False) -> None:
        """Echo the lines completed since the last poll; `final`: the unfinished one too."""
        chunk = _read_from(self.path, self._offset)
        self._offset += len(chunk)
        lines = (self._partial + chunk).splitlines(keepends=True)
        self._partial = b""
        if lines and not final and not lines[-1].endswith((b"\n", b"\r")):
            self._partial = lines.pop()
        shown = [line for line in lines if not self._hidden(line)]
        text = b"".join(self._folded(shown, final))
        if text:
            sys.stdout.write(text.decode(errors="replace"))
            sys.stdout.flush()

    def _hidden(self, line: bytes) -> bool:
        return line.startswith(self.hidden) or (
            self.fold and line.startswith(b"submitit ERROR (") and SUBMITIT_RAISED in line
        )

    def _folded(self, lines: list[bytes], final: bool) -> list[bytes]:
        if not self.fold:
            return lines
        out: list[bytes] = []
        for line in lines:
            if self._block or line.startswith(TRACEBACK):
                self._block.append(line)
                if not line[:1].isspace() and not line.startswith(TRACEBACK):  # its error
                    out += self._end_block()
            elif not line.startswith(HPCDL_ERROR):
                out.append(line)
            # else hpcdl's own one-line error, raised in the rank: the launcher says it once,
            # as `error: ...` (hpcdl.launch.local); the terminal showed it twice (a full disk)
        if final and self._block:
            out += self._block
            self._block = []
        return out

    def _end_block(self) -> list[bytes]:
        block, self._block = self._block, []
        error = block[-1].decode(errors="replace").strip()
        gone = next((phrase for phrase in PEER_GONE if phrase in error), None)
        if gone is None:
            return block
        kind = error.partition(":")[0]
        return [
            f"rank 0 stopped: it lost another rank ({kind}: ...{gone}...); the cause, that "
            f"rank's error, follows (rank 0's traceback: {self.path})\n".encode()
        ]


TRACEBACK = b"Traceback (most recent call last):"
# submitit's line before the traceback of a job that raised (once per logging handler).
SUBMITIT_RAISED = b"Submitted job triggered an exception"
HPCDL_ERROR = b"hpcdl.errors."


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read()
    except FileNotFoundError:
        return b""
