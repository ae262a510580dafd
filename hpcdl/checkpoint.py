"""Checkpoint files: atomic writes, a checksum trailer, and loading that never runs code.

A checkpoint is ``<dir>/step_000000123.pt``: ``torch.save`` bytes followed by a 48-byte
trailer (magic, checksum of the payload, payload length), so the file is itself a zip that
``torch.load`` reads. It is written to a temporary name in the same directory, fsynced and
renamed, so a file with a final name is complete; the newest one is found from the names
alone. The payload is hashed as torch.save streams it to the file. A load checks the
checksum first, on up to 4 threads over the file's pages, then parses with
``weights_only=True``: a state may hold only tensors and plain containers (see
``capture_rng_state`` for the RNG states). With ``mmap=True`` the tensors are mapped from
the file instead of read into memory. ``save_async`` writes in a background thread from a
copy in host memory.

Knows nothing about Slurm, Hydra or DDP: the caller decides which rank saves.
"""

from __future__ import annotations

import os
import random
import re
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, NamedTuple, Optional, cast

import numpy as np
import torch

from hpcdl.atomic import atomic_file, copy_atomic, purge_temp_files
from hpcdl.checkpoint_file import (  # noqa: F401 (the file format, without torch; re-exported)
    _CHECKSUMS,
    _FRAME,
    MAGIC,
    MAGIC_V1,
    MAGIC_V2,
    PIECE_BYTES,
    PLAIN_RECORD_ERRORS,
    PathLike,
    _check_digest,
    _hash_pool,
    _HashingReader,
    _Layout,
    _open_checkpoint,
    _payload_digest,
    _PieceChecksum,
    _Unpickler,
    _unreadable,
    _wait,
    _zip_record,
    payload_checksum,
    read_plain_record,
    step_file_name,
    verify_checkpoint,
)
from hpcdl.errors import (
    CheckpointError,
    ConfigError,
    HpcdlWarning,
    WriteError,
    os_error_reason,
)
from hpcdl.rundir import RunDir

BEST_NAME = "best.pt"
_STEP_NAME = re.compile(r"^step_(\d+)\.pt$")

# What torch.load(weights_only=True) accepts, besides tensors.
_PLAIN_TYPES = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device)
_CONTAINER_TYPES = (dict, OrderedDict, list, tuple, set, torch.Size)


class CheckpointWarning(HpcdlWarning):
    """A checkpoint file was skipped because it is corrupt or unreadable."""


class CheckpointStore:
    """Step-numbered checkpoint files in one directory, with ``best.pt`` beside them.

    ``save`` has written the file when it returns. ``save_async`` copies the state to host
    memory and writes it in a background thread: at most one save is in flight (the next
    save waits for it), and ``wait`` blocks until it is on disk and raises its error.
    """

    def __init__(self, directory: PathLike, keep_last: int = 2):
        if keep_last < 1:
            raise ConfigError(f"trainer.keep_last={keep_last}: must be >= 1")
        self.directory = Path(directory)
        self.keep_last = keep_last
        self._in_flight: Optional[_BackgroundSave] = None
        # What the purge read of each file (milestone_mark), by its name and identity on
        # disk (a file saved again under its name is read anew): once per file and store.
        self._marks: dict[tuple[str, int, int, int], Optional[Mark]] = {}

    def save(self, state: dict[str, Any], step: int, *, is_best: bool = False) -> Path:
        """Write ``state`` as the checkpoint of ``step``; then purge older step files beyond
        keep_last that are not milestones."""
        self.wait()
        _check_savable(state, step)
        return self._write(state, step, is_best)

    def save_async(self, state: dict[str, Any], step: int, *, is_best: bool = False) -> Path:
        """Copy ``state`` to host memory, write it in a background thread, and return the
        path the file will have. A failed earlier background save raises its error here."""
        self.wait()
        _check_savable(state, step)
        snapshot = host_copy(state)  # training may change the live tensors from now on
        self._in_flight = _BackgroundSave(lambda: self._write(snapshot, step, is_best))
        return self.directory / step_file_name(step)

    def wait(self) -> None:
        """Return once no save is in flight; raise the CheckpointError of a failed one."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight.result()

    def _write(self, state: dict[str, Any], step: int, is_best: bool) -> Path:
        path = self.directory / step_file_name(step)
        target = path
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with atomic_file(path) as f:
                _write_payload(f, state)
                if is_best:  # before the step file has its name: both are saved, or neither
                    f.flush()
                    os.fsync(f.fileno())  # the step file's data is on disk before best.pt
                    target = self.directory / BEST_NAME
                    copy_atomic(f.name, target)
        except OSError as err:
            raise self._save_failed(target, os_error_reason(err)) from err
        except WriteError as err:
            raise self._save_failed(target, err.reason) from err
        self._purge(keep=path)
        return path

    def _save_failed(self, path: Path, reason: str) -> CheckpointError:
        # Nothing was purged and the atomic writer removed its temporary file, so the
        # checkpoints already on disk are untouched and `hpcdl resume` continues from them.
        return CheckpointError(
            f"{path}: checkpoint not saved: {reason}; the older checkpoints in "
            f"{self.directory} are intact (continue with `hpcdl resume` once fixed)"
        )

    def list_steps(self) -> list[tuple[int, Path]]:
        """Complete checkpoint files as (step, path), oldest first, from the names only."""
        if not self.directory.is_dir():
            return []
        found = []
        for entry in self.directory.iterdir():
            match = _STEP_NAME.match(entry.name)
            if match:
                found.append((int(match.group(1)), entry))
        return sorted(found)

    def load(self, path: PathLike, *, mmap: bool = False) -> dict[str, Any]:
        return read_checkpoint(path, mmap=mmap)

    def load_latest(self, *, mmap: bool = False) -> Optional[tuple[Path, dict[str, Any]]]:
        """The newest checkpoint that loads; corrupt ones are skipped with a CheckpointWarning.
        ``mmap``: as read_checkpoint's."""
        for _, path in reversed(self.list_steps()):
            try:
                return path, read_checkpoint(path, mmap=mmap)
            except CheckpointError as err:
                _warn_skipped(err)
        return None

    def best_path(self) -> Optional[Path]:
        path = self.directory / BEST_NAME
        return path if path.is_file() else None

    def _purge(self, keep: Path) -> None:
        """Remove step files beyond keep_last, never ``keep`` nor a milestone, and temp
        files of killed saves. A milestone was saved at the end of an epoch that is a
        multiple of the trainer.keep_every_epochs it was saved with, or that a newer step
        file was saved with (the newest holds the run's setting now): decided from the
        files alone, so a milestone stays one through requeues and resumes, whatever they
        set, and an epoch end still on disk when the option is set becomes one."""
        steps = self.list_steps()
        settings: set[int] = set()  # keep_every_epochs of this file and the newer ones
        for index in reversed(range(len(steps))):
            path = steps[index][1]
            mark = self._mark(path)
            if mark is not None and mark.keep_every_epochs is not None:
                settings.add(mark.keep_every_epochs)
            if index >= len(steps) - self.keep_last or path == keep or mark is None:
                continue  # among the newest, or unreadable for now: a later purge decides
            if not any(mark.epoch_end % every == 0 for every in settings if mark.epoch_end):
                path.unlink(missing_ok=True)
        purge_temp_files(self.directory)

    def _mark(self, path: Path) -> Optional[Mark]:
        try:
            info = path.stat()
        except OSError:
            return None
        key = (path.name, info.st_ino, info.st_mtime_ns, info.st_size)
        if key not in self._marks:
            try:
                self._marks[key] = milestone_mark(path)
            except OSError:
                return None  # an I/O error, maybe passing: not remembered
        return self._marks[key]


class Mark(NamedTuple):
    """What decides whether a step file is a milestone."""

    epoch_end: int  # the epochs done when it was saved at an epoch's end; else 0
    keep_every_epochs: Optional[int]  # the trainer.keep_every_epochs it was saved with


def milestone_mark(path: Path) -> Mark:
    """Read from the file's pickle record alone (a small read), without the checksum over
    the whole file that a load checks: a damaged file reads as no epoch end and no
    setting, so it is purged as before. An epoch's end is E epochs done, step 0 of the
    next (the trainer saves an epoch's last step again once the epoch has ended)."""
    try:
        state = read_plain_record(path)
    except PLAIN_RECORD_ERRORS:
        return Mark(0, None)
    progress = state.get("progress") if isinstance(state, dict) else None
    if not isinstance(progress, dict):
        return Mark(0, None)
    epoch, step_in_epoch = progress.get("epoch"), progress.get("step_in_epoch")
    every = state.get("keep_every_epochs")
    return Mark(
        epoch if isinstance(epoch, int) and epoch > 0 and step_in_epoch == 0 else 0,
        every if isinstance(every, int) and every > 0 else None,
    )


def _check_savable(state: dict[str, Any], step: int) -> None:
    if step < 0:
        raise CheckpointError(f"step={step}: must be >= 0")
    check_weights_only_safe(state)


class _BackgroundSave:
    """One write in a thread of its own; ``result`` joins it and raises its error. Not a
    daemon thread: the interpreter waits for it at exit, so a save in flight completes even
    if no one waits for it."""

    def __init__(self, write: Callable[[], Path]) -> None:
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, args=(write,), name="hpcdl-checkpoint")
        self._thread.start()

    def _run(self, write: Callable[[], Path]) -> None:
        try:
            write()
        except BaseException as err:  # raised again by result(), in the thread that waits
            self._error = err

    def result(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


# ----------------------------------------------------------------------------- host copy
def host_copy(state: Any) -> Any:
    """``state`` with its containers rebuilt and its tensors copied to host memory (pinned,
    for CUDA tensors), so that the live tensors may change while the copy is written. A
    tensor that appears twice (tied weights) is copied once."""
    cuda_devices: set[torch.device] = set()
    copied = _host_copy(state, {}, cuda_devices)
    for device in cuda_devices:  # the device-to-host copies were queued: wait for them
        torch.cuda.synchronize(device)
    return copied


def _host_copy(value: Any, memo: dict[int, torch.Tensor], cuda_devices: set[torch.device]) -> Any:
    if isinstance(value, torch.Tensor):
        if id(value) not in memo:
            memo[id(value)] = _tensor_on_host(value, cuda_devices)
        return memo[id(value)]
    if isinstance(value, dict):
        copied = type(value)((key, _host_copy(v, memo, cuda_devices)) for key, v in value.items())
        if hasattr(value, "__dict__"):  # a module state_dict's _metadata (its versions)
            copied.__dict__.update(value.__dict__)
        return copied
    if type(value) in (list, tuple, set):
        return type(value)(_host_copy(v, memo, cuda_devices) for v in value)
    return value  # immutable: str, numbers, None, dtype, device, torch.Size


def _tensor_on_host(tensor: torch.Tensor, cuda_devices: set[torch.device]) -> torch.Tensor:
    data = tensor.detach()
    if data.device.type == "cpu":
        copy = data.clone()
    elif data.device.type == "cuda":
        # Pinned memory (cached by torch's host allocator across saves) lets the copy run
        # without blocking; host_copy waits for all of them at once. empty_like keeps the
        # strides (channels_last state restored as channels_last, as a synchronous save does).
        copy = torch.empty_like(data, device="cpu", pin_memory=True)
        copy.copy_(data, non_blocking=True)
        cuda_devices.add(data.device)
    else:
        copy = data.to("cpu")
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(copy, requires_grad=tensor.requires_grad)
    return copy


# ----------------------------------------------------------------------------- writing
def _write_payload(file: IO[bytes], state: dict[str, Any]) -> None:
    """The torch.save bytes (hashed as they stream past), then the trailer. A failed save
    never renames its temporary file, so every file with a final name has its trailer."""
    with _hash_pool() as pool:
        writer = _HashingWriter(file, _PieceChecksum(pool))
        try:
            with _without_zip_crc32():
                torch.save(state, cast(IO[bytes], writer))  # it calls write and flush
        except Exception:
            if writer.error is not None:  # torch wraps it in a RuntimeError: report the cause
                raise writer.error from None
            raise
    file.write(_FRAME.pack(MAGIC, writer.checksum.digest(), writer.checksum.length))


@contextmanager
def _without_zip_crc32() -> Iterator[None]:
    """torch.save computes a CRC-32 of every zip record, which torch.load never checks; the
    checksum over the whole payload covers the same bytes, so that pass is skipped (about a
    fifth of torch.save's time here). torch's switch is process-wide: it is set back as
    soon as this save is done."""
    get = getattr(torch.serialization, "get_crc32_options", None)
    set_ = getattr(torch.serialization, "set_crc32_options", None)
    if get is None or set_ is None:  # older torch: computed, as ever
        yield
        return
    before = get()
    set_(False)
    try:
        yield
    finally:
        set_(before)


class _HashingWriter:
    """The file torch.save writes to: every chunk goes to ``file`` and into the checksum,
    whose pieces the pool hashes while this thread writes the chunk; all of it is done
    before write() returns, while torch's buffer is still valid."""

    def __init__(self, file: IO[bytes], checksum: _PieceChecksum) -> None:
        self.file = file
        self.checksum = checksum
        self.error: Optional[OSError] = None

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        futures = self.checksum.update(view)
        try:
            self.file.write(view)
        except OSError as err:
            self.error = err
            raise
        finally:
            _wait(futures)
        return len(view)

    def flush(self) -> None:
        try:
            self.file.flush()
        except OSError as err:
            self.error = err
            raise


# ----------------------------------------------------------------------------- reading
def read_checkpoint(path: PathLike, *, mmap: bool = False) -> dict[str, Any]:
    """Check the file's frame and its checksum, then unpickle with weights_only=True on the
    CPU: torch never parses bytes that fail the checksum. ``mmap=True`` maps the tensors
    from the file (copy-on-write, the pages shared with every other reader of the file)
    instead of reading them into memory: for a state that is loaded into a model and
    dropped. Mapped tensors that are kept pin the file: an optimizer's state on the CPU,
    for one, should be copied out (``unmap``)."""
    path = Path(path)
    with _open_checkpoint(path) as (file, layout), _hash_pool() as pool:
        if layout.offset:  # formats 1 and 2: hashed as torch reads it
            return _read_streamed(path, file.fileno(), layout, pool)
        _check_digest(path, lambda: _payload_digest(file.fileno(), layout, pool), layout.digest)
        source = _reopenable(file, path)
        try:
            state = _parse(source, mmap=mmap)
        except OSError as err:
            raise _unreadable(path, err) from err
        except Exception as err:
            raise _refused(path, err) from err
    return _checked_state(path, state)


def _parse(source: str, *, mmap: bool) -> Any:
    if mmap:
        try:
            return torch.load(source, weights_only=True, map_location="cpu", mmap=True)
        except Exception:  # a file system that cannot map files: read it instead
            pass
    return torch.load(source, weights_only=True, map_location="cpu")


def unmap(value: Any) -> Any:
    """``value`` with its CPU tensors copied into memory of their own (in place for the
    containers): what a ``mmap=True`` load left mapped from the file. For state that lives on
    (an optimizer's on the CPU), so that purging the file frees its space at once."""
    if isinstance(value, torch.Tensor):
        return value.clone() if value.device.type == "cpu" else value
    if isinstance(value, dict):
        for key in value:
            value[key] = unmap(value[key])
    elif isinstance(value, list):
        value[:] = [unmap(v) for v in value]
    return value


def _read_streamed(
    path: Path, fd: int, layout: _Layout, pool: ThreadPoolExecutor
) -> dict[str, Any]:
    """Formats 1 and 2 (the frame before the payload): unpickle through a reader that
    hashes the bytes torch reads, and refuse the result unless the checksum matches."""
    reader = _HashingReader(fd, layout, _CHECKSUMS[layout.magic](pool))
    try:
        state = torch.load(cast(IO[bytes], reader), weights_only=True, map_location="cpu")
    except Exception as err:
        if reader.error is not None:
            raise _unreadable(path, reader.error) from err
        _check_digest(path, reader.digest, layout.digest)  # corrupt is reported as corrupt
        raise _refused(path, err) from err
    _check_digest(path, reader.digest, layout.digest)
    return _checked_state(path, state)


def _reopenable(file: IO[bytes], path: Path) -> str:
    """A name torch.load can open that is certainly the file checked: the descriptor's own
    /proc entry on Linux (a rename onto ``path`` since, as a new best.pt, changes nothing)."""
    proc = f"/proc/self/fd/{file.fileno()}"
    return proc if os.path.exists(proc) else str(path)


def _checked_state(path: Path, state: Any) -> dict[str, Any]:
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: holds a {type(state).__name__}, not a checkpoint dict")
    return state


def _refused(path: Path, err: Exception) -> CheckpointError:
    return CheckpointError(
        f"{path}: refused: holds something other than tensors and plain containers "
        f"(weights_only load: {_unpickling_reason(err)})"
    )


def resolve_checkpoint(ref: PathLike, which: str = "last") -> Path:
    """A checkpoint file from a file path or a run directory (its newest valid or best one).

    A directory may be a run directory (with ``checkpoints/``) or a checkpoint directory.
    """
    if which not in ("last", "best"):
        raise CheckpointError(f"which={which!r}: must be 'last' or 'best'")
    ref_path = Path(ref)
    if ref_path.is_file():
        return ref_path
    if not ref_path.is_dir():
        raise CheckpointError(f"{ref}: no such checkpoint file or run directory")
    run_checkpoints = RunDir(ref_path).checkpoint_dir
    directory = run_checkpoints if run_checkpoints.is_dir() else ref_path
    store = CheckpointStore(directory)
    if which == "best":
        best = store.best_path()
        if best is None:
            raise CheckpointError(f"{ref}: no {BEST_NAME} in {directory}")
        return best
    for _, path in reversed(store.list_steps()):
        try:
            verify_checkpoint(path)
        except CheckpointError as err:
            _warn_skipped(err)
            continue
        return path
    raise CheckpointError(f"{ref}: no complete checkpoint (step_*.pt) in {directory}")


def _unpickling_reason(err: Exception) -> str:
    """The informative line of torch.load's multi-paragraph weights_only error."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    for line in lines[1:]:
        if not line.startswith("Check the documentation"):
            return line
    return lines[0] if lines else type(err).__name__


def _warn_skipped(err: CheckpointError) -> None:
    warnings.warn(f"skipping checkpoint: {err}", CheckpointWarning, stacklevel=3)


def check_weights_only_safe(state: Any, where: str = "state") -> None:
    """Raise CheckpointError naming the first value that weights_only loading would refuse.

    Checked at save time so that a bad state fails at once, not at the resume after a requeue.
    """
    kind = type(state)
    if isinstance(state, torch.Tensor):
        if kind not in (torch.Tensor, torch.nn.Parameter):
            sharded = (
                "; a sharded (FSDP) state: save it with torch.distributed.checkpoint "
                "(docs/scripts.md#fsdp-and-torchdistributedcheckpoint), or gather a full "
                "state dict first (StateDictOptions(full_state_dict=True, cpu_offload=True))"
                if kind.__name__ == "DTensor"
                else ""
            )
            raise CheckpointError(
                f"{where}: tensor subclass {kind.__name__} is not weights_only-safe{sharded}"
            )
        return
    if kind in _PLAIN_TYPES:
        return
    if kind in (dict, OrderedDict):
        for key, value in state.items():
            check_weights_only_safe(key, f"{where} key {key!r}")
            check_weights_only_safe(value, f"{where}[{key!r}]")
        return
    if kind in _CONTAINER_TYPES:
        for index, value in enumerate(state):
            check_weights_only_safe(value, f"{where}[{index}]")
        return
    raise CheckpointError(
        f"{where}: {kind.__module__}.{kind.__qualname__} is not weights_only-safe; "
        "store tensors, dicts, lists, tuples, str, int, float, bool or None"
    )


# ----------------------------------------------------------------------------- RNG state
def capture_rng_state() -> dict[str, Any]:
    """Python, numpy (legacy global), torch CPU and CUDA generator states, weights_only-safe."""
    version, internal, gauss_next = random.getstate()
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": {
            "version": version,
            "internal": torch.tensor(internal, dtype=torch.int64),
            "gauss_next": gauss_next,
        },
        "numpy": {
            "name": str(name),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
        "cuda": [],
    }
    # Only where this process uses CUDA: reading the states would start CUDA (a context,
    # ~0.5 GB of GPU memory, refused on exclusive-process GPUs) in a CPU run on a GPU node.
    # A process that never started it drew no CUDA random numbers to restore.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of capture_rng_state. CUDA states beyond this machine's devices are ignored."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"].tolist()), py["gauss_next"]))
    npy = state["numpy"]
    np.random.set_state(
        (
            npy["name"],
            npy["keys"].numpy().astype(np.uint32),
            npy["pos"],
            npy["has_gauss"],
            npy["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    cuda_states = state.get("cuda") or []
    if cuda_states and torch.cuda.is_available():
        for index, cuda_state in enumerate(cuda_states[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, index)
