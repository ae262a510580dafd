"""Checkpoint files: atomic writes, a checksum header, and loading that never runs code.

A checkpoint is ``<dir>/step_000000123.pt``: a 48-byte header (magic, SHA-256 of the
payload, payload length) followed by ``torch.save`` bytes. It is written to a temporary
name in the same directory, fsynced and renamed, so a file with a final name is complete;
the newest one is found from the names alone. Loading verifies the header and unpickles
with ``weights_only=True``, so a state may hold only tensors and plain containers (see
``capture_rng_state`` for the RNG states).

Knows nothing about Slurm, Hydra or DDP: the caller decides which rank saves.
"""

from __future__ import annotations

import hashlib
import io
import random
import re
import struct
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch

from hpcdl.atomic import purge_temp_files, write_atomic
from hpcdl.errors import CheckpointError, ConfigError, WriteError, os_error_reason
from hpcdl.rundir import RunDir

MAGIC = b"HPCDLCK1"
# magic (8 bytes), SHA-256 of the payload (32 bytes), payload length (little-endian uint64).
_HEADER = struct.Struct("<8s32sQ")
BEST_NAME = "best.pt"
_STEP_NAME = re.compile(r"^step_(\d+)\.pt$")

# What torch.load(weights_only=True) accepts, besides tensors.
_PLAIN_TYPES = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device)
_CONTAINER_TYPES = (dict, OrderedDict, list, tuple, set, torch.Size)

PathLike = Union[str, Path]


class CheckpointWarning(UserWarning):
    """A checkpoint file was skipped because it is corrupt or unreadable."""


def step_file_name(step: int) -> str:
    # Zero-padded so that names sort by step; 9 digits covers a billion optimizer steps.
    return f"step_{step:09d}.pt"


class CheckpointStore:
    """Step-numbered checkpoint files in one directory, with ``best.pt`` beside them."""

    def __init__(self, directory: PathLike, keep_last: int = 2):
        if keep_last < 1:
            raise ConfigError(f"trainer.keep_last={keep_last}: must be >= 1")
        self.directory = Path(directory)
        self.keep_last = keep_last

    def save(self, state: dict[str, Any], step: int, *, is_best: bool = False) -> Path:
        """Write ``state`` as the checkpoint of ``step``; then purge step files beyond keep_last."""
        if step < 0:
            raise CheckpointError(f"step={step}: must be >= 0")
        check_weights_only_safe(state)
        buffer = io.BytesIO()
        torch.save(state, buffer)
        payload = buffer.getbuffer()
        header = _HEADER.pack(MAGIC, hashlib.sha256(payload).digest(), len(payload))
        path = self.directory / step_file_name(step)
        target = path
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            write_atomic(path, (header, payload))
            if is_best:
                target = self.directory / BEST_NAME
                write_atomic(target, (header, payload))
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

    def load(self, path: PathLike) -> dict[str, Any]:
        return read_checkpoint(path)

    def load_latest(self) -> Optional[tuple[Path, dict[str, Any]]]:
        """The newest checkpoint that loads; corrupt ones are skipped with a CheckpointWarning."""
        for _, path in reversed(self.list_steps()):
            try:
                return path, read_checkpoint(path)
            except CheckpointError as err:
                _warn_skipped(err)
        return None

    def best_path(self) -> Optional[Path]:
        path = self.directory / BEST_NAME
        return path if path.is_file() else None

    def _purge(self, keep: Path) -> None:
        """Remove step files beyond keep_last (never ``keep``) and temp files of killed saves."""
        old = self.list_steps()[: -self.keep_last]
        for _, path in old:
            if path != keep:
                path.unlink(missing_ok=True)
        purge_temp_files(self.directory)


def read_checkpoint(path: PathLike) -> dict[str, Any]:
    """Verify the header and checksum, then unpickle with weights_only=True (on the CPU)."""
    payload = _read_verified_payload(Path(path))
    try:
        state = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    except Exception as err:
        raise CheckpointError(
            f"{path}: refused: holds something other than tensors and plain containers "
            f"(weights_only load: {_unpickling_reason(err)})"
        ) from err
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: holds a {type(state).__name__}, not a checkpoint dict")
    return state


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
            _read_verified_payload(path)
        except CheckpointError as err:
            _warn_skipped(err)
            continue
        return path
    raise CheckpointError(f"{ref}: no complete checkpoint (step_*.pt) in {directory}")


def _read_verified_payload(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            header = f.read(_HEADER.size)
            payload = f.read()  # one bytes object: BytesIO over it makes no copy
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read checkpoint: {err.strerror or err}") from err
    if len(header) < _HEADER.size:
        raise CheckpointError(f"{path}: truncated: {len(header)} bytes, shorter than the header")
    magic, digest, length = _HEADER.unpack(header)
    if magic != MAGIC:
        raise CheckpointError(f"{path}: not an hpcdl checkpoint (bad magic bytes)")
    if len(payload) < length:
        raise CheckpointError(f"{path}: truncated: payload is {len(payload)} of {length} bytes")
    if len(payload) > length:
        raise CheckpointError(f"{path}: corrupt: {len(payload) - length} bytes after the payload")
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"{path}: checksum mismatch: the file is corrupt")
    return payload


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
            raise CheckpointError(
                f"{where}: tensor subclass {kind.__name__} is not weights_only-safe"
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
    if torch.cuda.is_available():
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
