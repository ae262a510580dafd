"""A checkpoint file as bytes: its frame, its checksum, and its plain entries, without torch.

hpcdl.checkpoint writes and loads checkpoints with torch; what needs no torch is here, so
that the login node (``hpcdl resume --from``) checks a checkpoint as the store does before
anything is launched. A file is ``torch.save``'s zip followed by a 48-byte trailer (format
3), or a header followed by the zip (formats 1 and 2, read only): see docs/checkpoints.md.

Stdlib + xxhash only (no torch).
"""

from __future__ import annotations

import collections
import hashlib
import io
import mmap as _mmap
import os
import pickle
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, NamedTuple, Optional, Protocol, Union, cast

import xxhash

from hpcdl.errors import CheckpointError

PathLike = Union[str, Path]


def step_file_name(step: int) -> str:
    # Zero-padded so that names sort by step; 9 digits covers a billion optimizer steps.
    return f"step_{step:09d}.pt"


# magic (8 bytes), checksum of the payload (32 bytes), payload length (little-endian uint64):
# the trailer of format 3, the header of formats 1 and 2.
_FRAME = struct.Struct("<8s32sQ")
_CRC = struct.Struct("<I")
# Format 3 (written): the payload, then the frame as a trailer. torch.load (mmap included)
# reads the zip with the trailer after it, so hpcdl's file is a plain torch.save file too.
# The checksum is the SHA-256 of the XXH3-64 digests of the payload's PIECE_BYTES pieces
# (8 canonical bytes each, in order; the last piece shorter). XXH3 catches what storage
# and copies do to a file (a damaged piece passes with a chance of 1 in 2^64) at about
# 9 GB/s a core here: 2.6x zlib's CRC-32 (format 2's), 5x SHA-256 with SHA-NI; pieces are
# hashed in parallel. Not a signature: weights_only loading is what keeps a hostile file
# from running code.
MAGIC = b"HPCDLCK3"
PIECE_BYTES = 1 << 20
# Read only: format 2 (the frame as a header before the payload; the pieces' digests are
# CRC-32s, 4 bytes little-endian) and format 1 (header first; the SHA-256 of the payload).
MAGIC_V2 = b"HPCDLCK2"
MAGIC_V1 = b"HPCDLCK1"

# Checksumming runs beside the file I/O: xxhash, zlib, hashlib and file reads/writes release
# the GIL, so pieces are checked by helper threads while this one writes, or reads the next
# piece. Smaller runs (pickle records, zip headers) go inline: a hand-off costs ~30 us.
_HAND_OFF_MIN_BYTES = 64 << 10
# Helper threads: one hash stream runs at about the speed of reading from the page cache or
# faster, so a few of them keep up with the reads where the cores are free.
_MAX_HASH_THREADS = 4
# A read that starts at most this far past the hashed bytes (the skipped bytes are a zip
# record's name and alignment padding, or small records read out of order) hashes the gap
# first; one farther ahead (the zip directory at the end, read first) waits for digest().
_MAX_GAP_BYTES = 1 << 20


# ----------------------------------------------------------------------------- checksums
class _Crc32:
    """A piece's CRC-32 (format 2), as 4 bytes little-endian."""

    def __init__(self) -> None:
        self._crc = 0

    def update(self, run: memoryview) -> None:
        self._crc = zlib.crc32(run, self._crc)

    def digest(self) -> bytes:
        return _CRC.pack(self._crc)


class _PieceHash(Protocol):
    def update(self, run: memoryview, /) -> None: ...
    def digest(self) -> bytes: ...


def _xxh3() -> _PieceHash:
    """A piece's XXH3-64 (format 3), as its 8 canonical (big-endian) bytes."""
    return cast(_PieceHash, xxhash.xxh3_64())


class _PieceChecksum:
    """Formats 3 and 2: the SHA-256 of the digests of the payload's PIECE_BYTES pieces
    (XXH3-64 in format 3, CRC-32 in format 2), in order.

    ``update`` takes the payload's bytes in order and hands each piece's run of them to the
    pool (a run shorter than _HAND_OFF_MIN_BYTES is hashed inline), after the piece's
    earlier run, so a piece is hashed in order. It returns the futures: the caller waits
    for them before the bytes it passed may change.
    """

    def __init__(
        self, pool: Optional[ThreadPoolExecutor], piece: Callable[[], _PieceHash] = _xxh3
    ) -> None:
        self.pool = pool
        self.length = 0
        self._piece = piece
        self._open: dict[int, _PieceHash] = {}  # index -> the hash so far of a piece not done
        self._pending: dict[int, Future[None]] = {}  # index -> its run being hashed
        self._done = bytearray()  # the digests of the pieces done, in order

    def update(self, view: memoryview) -> list[Future[None]]:
        futures: list[Future[None]] = []
        offset = 0
        while offset < len(view):
            index, within = divmod(self.length, PIECE_BYTES)
            self._close_pieces(before=index)
            run = view[offset : offset + PIECE_BYTES - within]
            piece = self._open.setdefault(index, self._piece())  # open before the hand-off
            earlier = self._pending.pop(index, None)
            if earlier is not None:
                earlier.result()
            if self.pool is not None and len(run) >= _HAND_OFF_MIN_BYTES:
                self._pending[index] = self.pool.submit(piece.update, run)
                futures.append(self._pending[index])
            else:
                piece.update(run)
            self.length += len(run)
            offset += len(run)
        return futures

    def digest(self) -> bytes:
        self._close_pieces(before=None)
        return hashlib.sha256(self._done).digest()

    def _close_pieces(self, before: Optional[int]) -> None:
        """Finish the pieces below index ``before`` (None: all of them)."""
        for index in sorted(self._open):
            if before is not None and index >= before:
                break
            pending = self._pending.pop(index, None)
            if pending is not None:
                pending.result()
            self._done += self._open.pop(index).digest()


class _Sha256Checksum:
    """Format 1's checksum: the SHA-256 of the payload, hashed inline (old files only)."""

    def __init__(self, pool: Optional[ThreadPoolExecutor]) -> None:
        self.length = 0
        self._sha256 = hashlib.sha256()

    def update(self, view: memoryview) -> list[Future[None]]:
        self._sha256.update(view)
        self.length += len(view)
        return []

    def digest(self) -> bytes:
        return self._sha256.digest()


_Checksum = Union[_PieceChecksum, _Sha256Checksum]
_CHECKSUMS: dict[bytes, Callable[[Optional[ThreadPoolExecutor]], _Checksum]] = {
    MAGIC: _PieceChecksum,
    MAGIC_V2: lambda pool: _PieceChecksum(pool, _Crc32),
    MAGIC_V1: _Sha256Checksum,
}


def payload_checksum(payload: Union[bytes, memoryview]) -> bytes:
    """The trailer's checksum of ``payload`` (format 3): to check a file by hand."""
    checksum = _PieceChecksum(pool=None)
    checksum.update(memoryview(payload).cast("B"))
    return checksum.digest()


def _wait(futures: list[Future[None]]) -> None:
    for future in futures:
        future.result()


@contextmanager
def _hash_pool() -> Iterator[ThreadPoolExecutor]:
    try:  # the CPUs this process may run on (a Slurm job's share of the node)
        num_cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        num_cpus = os.cpu_count() or 1
    workers = max(1, min(_MAX_HASH_THREADS, num_cpus))
    with ThreadPoolExecutor(workers, thread_name_prefix="hpcdl-checksum") as pool:
        yield pool


# ----------------------------------------------------------------------------- reading
class _Layout(NamedTuple):
    magic: bytes
    digest: bytes
    length: int  # of the payload
    offset: int  # where the payload starts: 0 (format 3), or after the header (1 and 2)


def verify_checkpoint(path: PathLike) -> None:
    """Check the frame and the checksum of the payload without unpickling it."""
    path = Path(path)
    with _open_checkpoint(path) as (file, layout), _hash_pool() as pool:
        _check_digest(path, lambda: _payload_digest(file.fileno(), layout, pool), layout.digest)


def stored_checksum(path: PathLike) -> tuple[bytes, int]:
    """The checksum and payload length that the file's frame holds, read without the
    payload: two files with the same are copies of one save (best.pt of its step file)."""
    with _open_checkpoint(Path(path)) as (_, layout):
        return layout.digest, layout.length


def _payload_digest(fd: int, layout: _Layout, pool: ThreadPoolExecutor) -> bytes:
    """The checksum of the payload as the file holds it now. Format 3's is computed over the
    mapped file: each thread hashes whole pieces straight from the page cache (no copy)."""
    reader = _HashingReader(fd, layout, _CHECKSUMS[layout.magic](pool))
    if layout.magic != MAGIC:
        return reader.digest()
    length = layout.length
    try:
        mapped = _mmap.mmap(fd, length, access=_mmap.ACCESS_READ)
    except (OSError, ValueError):  # a file system without mmap: read it piece by piece
        return reader.digest()
    with mapped:
        view = memoryview(mapped)
        try:
            starts = range(0, length, PIECE_BYTES)
            pieces = pool.map(lambda at: xxhash.xxh3_64_digest(view[at : at + PIECE_BYTES]), starts)
            return hashlib.sha256(b"".join(pieces)).digest()
        finally:
            view.release()


def _check_digest(path: Path, compute: Callable[[], bytes], digest: bytes) -> None:
    """Refuse the file unless ``compute()``, its payload's checksum, matches ``digest``."""
    try:
        actual = compute()
    except OSError as err:
        raise _unreadable(path, err) from err
    if actual != digest:
        raise CheckpointError(f"{path}: checksum mismatch: the file is corrupt")


def _unreadable(path: Path, err: OSError) -> CheckpointError:
    return CheckpointError(f"{path}: cannot read checkpoint: {err.strerror or err}")


# The first bytes of a zip (torch.save's format): a file that starts so but has no trailer
# was cut short, or is a bare torch.save file.
_ZIP_START = b"PK\x03\x04"


@contextmanager
def _open_checkpoint(path: Path) -> Iterator[tuple[IO[bytes], _Layout]]:
    """The open file and its layout, once its frame's magic bytes and the file's size have
    been checked: a header (formats 1 and 2) or a trailer (format 3)."""
    try:
        file = open(path, "rb", buffering=0)  # noqa: SIM115 (closed below)
    except OSError as err:
        raise _unreadable(path, err) from err
    with file:
        try:
            size = os.fstat(file.fileno()).st_size
            head = os.pread(file.fileno(), _FRAME.size, 0)
            tail = os.pread(file.fileno(), _FRAME.size, max(0, size - _FRAME.size))
        except OSError as err:
            raise _unreadable(path, err) from err
        yield file, _layout(path, size, head, tail)


def _layout(path: Path, size: int, head: bytes, tail: bytes) -> _Layout:
    if head[:8] in (MAGIC_V1, MAGIC_V2):
        if len(head) < _FRAME.size:
            raise CheckpointError(f"{path}: truncated: {size} bytes, shorter than the header")
        magic, digest, length = _FRAME.unpack(head)
        stored = size - _FRAME.size
        if stored < length:
            raise CheckpointError(f"{path}: truncated: payload is {stored} of {length} bytes")
        if stored > length:
            raise CheckpointError(f"{path}: corrupt: {stored - length} bytes after the payload")
        return _Layout(magic, digest, length, _FRAME.size)
    if len(tail) == _FRAME.size and tail[:8] == MAGIC:
        magic, digest, length = _FRAME.unpack(tail)
        if length != size - _FRAME.size:
            raise CheckpointError(
                f"{path}: corrupt: the trailer says {length} payload bytes, the file holds "
                f"{size - _FRAME.size}"
            )
        return _Layout(magic, digest, length, 0)
    if head.startswith(_ZIP_START):
        raise CheckpointError(
            f"{path}: truncated, or not an hpcdl checkpoint: it does not end with hpcdl's "
            f"trailer ({MAGIC.decode()})"
        )
    raise CheckpointError(f"{path}: not an hpcdl checkpoint (bad magic bytes)")


class _HashingReader(io.RawIOBase):
    """The payload of an open checkpoint as torch.load reads it, hashed in file order.

    torch reads the zip directory at the end first, then the records in the order they
    were written. A read that continues where the hash stands is read one checksum piece
    at a time, the pool hashing each piece while the next is read; a short skip ahead is
    read and hashed first; bytes read far ahead, or never, are hashed by ``digest()``. A
    reader that went in another order would still be verified, reading those bytes twice.
    """

    def __init__(self, fd: int, layout: _Layout, checksum: _Checksum) -> None:
        super().__init__()
        self.fd = fd
        self.length = layout.length
        self.offset = layout.offset
        self.checksum = checksum
        self.position = 0
        self.error: Optional[OSError] = None

    @property
    def hashed(self) -> int:
        """Bytes [0, hashed) of the payload have gone into the checksum."""
        return self.checksum.length

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.length}[whence]
        self.position = base + offset
        return self.position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        start = self.position
        view = view[: max(0, min(len(view), self.length - start))]
        try:
            if self.hashed < start <= self.hashed + _MAX_GAP_BYTES:
                self._hash_file(start)
            if start <= self.hashed < start + len(view):
                got = self._read_and_hash(view, start)
            else:
                got = self._read(view, start)
        except OSError as err:
            self.error = err
            raise
        self.position = start + got
        return got

    def digest(self) -> bytes:
        """The payload's checksum: what torch did not read in order is read and hashed now."""
        self._hash_file(self.length)
        return self.checksum.digest()

    def _read(self, view: memoryview, start: int) -> int:
        got = 0
        while got < len(view):
            n = os.preadv(self.fd, [view[got:]], self.offset + start + got)
            if n == 0:
                break
            got += n
        return got

    def _read_and_hash(self, view: memoryview, start: int) -> int:
        """Read into ``view`` up to one piece boundary at a time; the pool hashes each
        piece's new bytes while the next is read. All done before this returns."""
        skip = self.hashed - start  # the first bytes of the view are hashed already
        got = 0
        futures: list[Future[None]] = []
        try:
            while got < len(view):
                boundary = (start + got) // PIECE_BYTES * PIECE_BYTES + PIECE_BYTES
                wanted = min(len(view), boundary - start) - got
                n = self._read(view[got : got + wanted], start + got)
                futures += self.checksum.update(view[max(got, skip) : got + n])
                got += n
                if n < wanted:
                    break
        finally:
            _wait(futures)
        return got

    def _hash_file(self, end: int) -> None:
        """Read the payload's bytes from the hashed ones to ``end`` into the checksum, one
        piece at a time (at most a few pieces in flight)."""
        futures: list[Future[None]] = []
        try:
            while self.hashed < end:
                boundary = self.hashed // PIECE_BYTES * PIECE_BYTES + PIECE_BYTES
                chunk = os.pread(
                    self.fd, min(end, boundary) - self.hashed, self.offset + self.hashed
                )
                if not chunk:
                    break  # the file shrank since its size was checked: the digest will differ
                futures += self.checksum.update(memoryview(chunk))
                if len(futures) > _MAX_HASH_THREADS:
                    _wait(futures)
                    futures = []
        finally:
            _wait(futures)


# ----------------------------------------------------------------------------- plain entries
def read_plain_entries(path: PathLike) -> dict[str, Any]:
    """A checkpoint's entries with their tensors left out (``None``): its ``progress``,
    ``batch_size``, ``data_config``, ``early_stopping``, ... read without torch, once the
    frame and the checksum are verified (as the store checks before a load). The pickle is
    read by an unpickler that builds plain containers only: every other global it names (a
    tensor's rebuild function, a torch type) is a stand-in that does nothing, so no code
    of the file's runs. A file that verifies but is no checkpoint dict is refused."""
    path = Path(path)
    verify_checkpoint(path)
    unreadable: tuple[type[Exception], ...] = (OSError, *PLAIN_RECORD_ERRORS)
    try:
        state = read_plain_record(path)
    except unreadable as err:
        raise CheckpointError(f"{path}: not a torch.save checkpoint ({err})") from err
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: holds a {type(state).__name__}, not a checkpoint dict")
    return state


# What reading a file that is not a whole torch.save pickle raises in read_plain_record.
PLAIN_RECORD_ERRORS: tuple[type[Exception], ...] = (
    ValueError,
    EOFError,
    KeyError,
    StopIteration,
    pickle.UnpicklingError,
    zipfile.BadZipFile,
)


def read_plain_record(path: Path) -> Any:
    """The checkpoint's pickle record with its tensors left out, unverified (a small read;
    read_plain_entries verifies first). Raises OSError or one of PLAIN_RECORD_ERRORS."""
    with open(path, "rb") as file:
        record = _zip_record(file, "data.pkl")
    try:
        return _Unpickler(io.BytesIO(record)).load()
    except PLAIN_RECORD_ERRORS:
        raise
    except Exception as err:  # a crafted pickle calling a stand-in: TypeError, ...
        raise pickle.UnpicklingError(f"not a plain checkpoint record ({err!r})") from err


def _zip_record(file: IO[bytes], name: str) -> bytes:
    """The bytes of torch.save's record ``<archive>/name``. Read from its local header
    rather than through zipfile's reader: hpcdl saves without the records' CRC-32s (the
    checksum covers them), which zipfile would refuse. torch stores records uncompressed."""
    archive = zipfile.ZipFile(file)
    info = next(i for i in archive.infolist() if i.filename.endswith("/" + name))
    if info.compress_type != zipfile.ZIP_STORED:
        raise ValueError(f"{info.filename} is compressed")
    file.seek(info.header_offset)
    local = file.read(_ZIP_LOCAL_HEADER.size)
    signature, *_, name_length, extra_length = _ZIP_LOCAL_HEADER.unpack(local)
    if signature != _ZIP_START:
        raise ValueError(f"no local header for {info.filename}")
    file.seek(info.header_offset + len(local) + name_length + extra_length)
    return file.read(info.compress_size)


# A zip's local file header: signature, version, flags, method, time, date, CRC-32, sizes,
# name length, extra length (APPNOTE 4.3.7).
_ZIP_LOCAL_HEADER = struct.Struct("<4s5H3I2H")


class _StandIn:
    """What a global of the pickle other than a plain container stands for: called, or
    given its state, it does nothing (a tensor comes out as one of these)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _StandIn:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass


class _Unpickler(pickle.Unpickler):
    _PLAIN = {("collections", "OrderedDict"): collections.OrderedDict}

    def find_class(self, module: str, name: str) -> Any:
        return self._PLAIN.get((module, name)) or type(name, (_StandIn,), {})

    def persistent_load(self, pid: Any) -> None:  # a tensor's storage
        return None
