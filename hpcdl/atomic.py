"""The one atomic writer: every file another process may read is written through here.

Temporary name in the same directory (``.<name>.tmp-<pid>``), fsync, rename over the final
name, fsync of the directory. A reader therefore sees the old file or the new one, never a
half-written one, and a rename survives a crash of the node. Stdlib only (login node).
"""

from __future__ import annotations

import errno
import glob
import json
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from enum import Enum
from pathlib import Path
from typing import IO, Any, Union

from hpcdl.errors import WriteError, os_error_reason

PathLike = Union[str, Path]
Chunk = Union[bytes, bytearray, memoryview]

# What a temporary file of a killed writer looks like: purged by whoever owns the folder.
TEMP_NAME = re.compile(r"^\..+\.tmp-\d+$")


def temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


# A temporary copy whose writer is not running here and that has not changed for this long
# was left by a killed command (on a shared file system the writer may be on another node,
# where its pid means nothing here: only its age tells).
STALE_AFTER_S = 600.0


def remove_stale_temps(path: Path, stale_after_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove the temporary siblings of ``path`` (``.<name>.tmp-<pid>``, files or folders)
    left by killed commands: the pid is not a process here and nothing in it changed for
    ``stale_after_s``. Returns those removed."""
    removed = []
    for temp in path.parent.glob(f".{glob.escape(path.name)}.tmp-*"):
        pid = temp.name.rpartition("-")[2]
        if not pid.isdigit() or _is_process(int(pid)) or _changed_within(temp, stale_after_s):
            continue
        if temp.is_dir() and not temp.is_symlink():
            shutil.rmtree(temp, ignore_errors=True)
        else:
            with suppress(OSError):
                temp.unlink()
        removed.append(temp)
    return removed


def _is_process(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (EPERM): it exists
        return True
    return True


def _changed_within(temp: Path, seconds: float) -> bool:
    """Whether ``temp`` or anything directly in it (a file still being copied) changed in the
    last ``seconds``."""
    try:
        newest = temp.lstat().st_mtime
        if temp.is_dir() and not temp.is_symlink():
            for entry in os.scandir(temp):
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    except OSError:
        return True  # being removed or renamed meanwhile: not ours to touch
    return time.time() - newest < seconds


@contextmanager
def atomic_file(path: PathLike) -> Iterator[IO[bytes]]:
    """A binary file that appears at ``path`` complete, or not at all, when the block ends.

    An exception inside the block removes the temporary file and leaves ``path`` as it was.
    A file-system error (disk full, read-only, no permission) becomes a one-line WriteError.
    """
    path = Path(path)
    temp = temp_path(path)
    try:
        with open(temp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException as err:
        with suppress(OSError):  # the error that got us here matters, not this one
            temp.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise WriteError(path, os_error_reason(err)) from err
        raise
    fsync_directory(path.parent)


def write_atomic(path: PathLike, data: Union[str, Chunk, Iterable[Chunk]]) -> None:
    """Write text (UTF-8), bytes, or an iterable of byte chunks atomically."""
    if isinstance(data, str):
        data = data.encode()
    chunks: Iterable[Chunk] = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
    with atomic_file(path) as f:
        for chunk in chunks:
            f.write(chunk)


def copy_atomic(source: PathLike, path: PathLike) -> None:
    """A second complete file with ``source``'s bytes at ``path``, atomically. The bytes are
    copied inside the kernel (copy_file_range) where it can, else through a buffer."""
    with open(source, "rb") as src, atomic_file(path) as dst:
        dst.flush()  # nothing buffered, but the copy goes around the buffer
        remaining = os.fstat(src.fileno()).st_size
        try:
            while remaining > 0:
                copied = os.copy_file_range(src.fileno(), dst.fileno(), remaining)
                if copied == 0:  # the source shrank under us: copy what is left below
                    break
                remaining -= copied
        except (AttributeError, OSError) as err:  # no copy_file_range, or not across these
            if isinstance(err, OSError) and err.errno not in _NO_KERNEL_COPY:
                raise
        shutil.copyfileobj(src, dst)  # the rest: nothing where the kernel copied it all


# copy_file_range's "not here": another file system (older kernels), or not supported.
_NO_KERNEL_COPY = {errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ETXTBSY}


def write_json_atomic(path: PathLike, obj: Any, indent: int = 2) -> None:
    """Indented JSON (Path and Enum values as strings), atomically."""
    write_atomic(path, json.dumps(obj, indent=indent, default=_json_default) + "\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def append_line_durably(path: PathLike, line: str) -> None:
    """Append one line to a log that is only ever appended to (fsync: it survives a kill).

    A reader may see a last line cut short by a kill mid-write or a full disk, so readers
    skip lines that do not parse; the next line starts on a line of its own, so that it is
    not lost with the cut one."""
    data = (line.rstrip("\n") + "\n").encode()
    try:
        with open(path, "a+b") as f:  # a+: its last byte is read too
            end = f.seek(0, os.SEEK_END)
            if end and os.pread(f.fileno(), 1, end - 1) != b"\n":
                data = b"\n" + data
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        raise WriteError(path, os_error_reason(err)) from err


def fsync_directory(directory: Path) -> None:
    """Make a rename durable: fsync the directory entry (a no-op where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def purge_temp_files(directory: Path) -> None:
    """Remove the temporary files that killed writers left in ``directory``."""
    if not directory.is_dir():
        return
    for entry in directory.iterdir():
        if TEMP_NAME.match(entry.name):
            entry.unlink(missing_ok=True)
