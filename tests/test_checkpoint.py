"""Checkpoint store: atomic step files, checksums, weights_only loading, RNG round trips,
saves in a background thread."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import random
import struct
import threading
import time
import zlib
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
import xxhash

import hpcdl.checkpoint as checkpoint_module
import hpcdl.checkpoint_file as checkpoint_file
from hpcdl.checkpoint import (
    MAGIC,
    MAGIC_V1,
    MAGIC_V2,
    PIECE_BYTES,
    CheckpointStore,
    CheckpointWarning,
    capture_rng_state,
    host_copy,
    payload_checksum,
    read_checkpoint,
    resolve_checkpoint,
    restore_rng_state,
    verify_checkpoint,
)
from hpcdl.errors import CheckpointError, ConfigError


def make_state(step: int) -> dict:
    return {
        "model": {"weight": torch.full((3, 2), float(step)), "bias": torch.arange(2)},
        "progress": {"global_step": step, "best_metric": None, "early_stopped": False},
        "names": ["a", "b"],
        "shape": (3, 2),
    }


def test_round_trip_keeps_values_and_names_file_by_step(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    path = store.save(make_state(123), 123)
    assert path == tmp_path / "step_000000123.pt"
    loaded = store.load(path)
    assert torch.equal(loaded["model"]["weight"], torch.full((3, 2), 123.0))
    assert torch.equal(loaded["model"]["bias"], torch.arange(2))
    assert loaded["progress"] == {"global_step": 123, "best_metric": None, "early_stopped": False}
    assert loaded["names"] == ["a", "b"]
    assert loaded["shape"] == (3, 2)


def big_state(step: int) -> dict:
    """Several checksum pieces (1 MiB) of tensors, some spanning pieces, and small records."""
    state = make_state(step)
    state["model"]["big"] = torch.arange(700_000, dtype=torch.float32) * step  # 2.8 MB
    state["model"]["mid"] = torch.full((100_000,), float(step))
    return state


def piece_checksum(payload: bytes) -> bytes:
    """Format 3's checksum as docs/checkpoints.md defines it, written out independently."""
    pieces = [payload[i : i + PIECE_BYTES] for i in range(0, len(payload), PIECE_BYTES)]
    return hashlib.sha256(b"".join(xxhash.xxh3_64(p).digest() for p in pieces)).digest()


def crc_piece_checksum(payload: bytes) -> bytes:
    """Format 2's: the same with the pieces' CRC-32s (4 bytes, little-endian)."""
    pieces = [payload[i : i + PIECE_BYTES] for i in range(0, len(payload), PIECE_BYTES)]
    return hashlib.sha256(b"".join(struct.pack("<I", zlib.crc32(p)) for p in pieces)).digest()


def test_file_is_torch_save_payload_then_trailer(tmp_path: Path) -> None:
    path = CheckpointStore(tmp_path).save(big_state(1), 1)
    data = path.read_bytes()
    magic, digest, length = struct.unpack_from("<8s32sQ", data, len(data) - 48)
    payload = data[:-48]
    assert magic == MAGIC == b"HPCDLCK3"
    assert length == len(payload) > 3 * PIECE_BYTES
    assert digest == piece_checksum(payload) == payload_checksum(payload)
    loaded = torch.load(io.BytesIO(payload), weights_only=True)
    assert loaded["progress"]["global_step"] == 1
    assert torch.equal(loaded["model"]["big"], big_state(1)["model"]["big"])
    # The file itself is a torch.save file to torch.load, mapped or read (the docs say so).
    for mmap in (False, True):
        whole = torch.load(path, weights_only=True, mmap=mmap)
        assert torch.equal(whole["model"]["big"], big_state(1)["model"]["big"])


def test_a_mapped_load_shares_the_file_and_unmap_copies_it_out(tmp_path: Path) -> None:
    path = CheckpointStore(tmp_path).save(big_state(2), 2)
    mapped = read_checkpoint(path, mmap=True)
    big = mapped["model"]["big"]
    assert torch.equal(big, big_state(2)["model"]["big"])
    big.add_(1)  # copy-on-write: the file keeps its bytes
    assert torch.equal(read_checkpoint(path)["model"]["big"], big_state(2)["model"]["big"])
    owned = checkpoint_module.unmap(mapped)
    assert owned is mapped and owned["model"]["big"] is not big
    assert torch.equal(owned["model"]["big"], big)
    assert owned["names"] == ["a", "b"]


def test_the_checksum_is_checked_before_torch_parses_anything(tmp_path: Path, monkeypatch) -> None:
    path = CheckpointStore(tmp_path).save(big_state(1), 1)
    flip_byte(path, 120)  # in the pickle
    parsed = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: parsed.append(1) or real_load(*a, **k))
    for mmap in (False, True):
        with pytest.raises(CheckpointError, match="checksum mismatch"):
            read_checkpoint(path, mmap=mmap)
    assert parsed == []


class LateThreads(ThreadPoolExecutor):
    """A pool whose tasks start late and finish in any order: what a busy machine does."""

    def submit(self, fn, /, *args, **kwargs):
        delay = random.uniform(0, 0.004)

        def late():
            time.sleep(delay)
            return fn(*args, **kwargs)

        return super().submit(late)


class DeferredFuture(Future):
    def __init__(self, call) -> None:
        super().__init__()
        self.call = call

    def result(self, timeout=None):
        if not self.done():
            self.set_result(self.call())
        return super().result(timeout)


class OutOfOrderPool:
    """Runs every other task at once and the others only once someone waits for them: the
    worst order a pool can take, every time."""

    def __init__(self) -> None:
        self.num_submitted = 0

    def submit(self, fn, *args):
        self.num_submitted += 1
        if self.num_submitted % 2:
            future: Future = Future()
            future.set_result(fn(*args))
            return future
        return DeferredFuture(lambda: fn(*args))

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


@pytest.mark.parametrize("pool", ["threads", "out-of-order"])
@pytest.mark.parametrize("caller", ["writer", "reader"])
def test_piece_checksum_is_the_same_however_the_pool_runs(caller: str, pool: str) -> None:
    random.seed(1)
    payload = memoryview(os.urandom(7 * PIECE_BYTES + 12345))
    if caller == "writer":  # torch.save's chunks; the writer waits after each one
        sizes = [7, 100_000, 3 * PIECE_BYTES // 2, 70_000, 2 * PIECE_BYTES, 1, 10**9]
    else:  # one piece at a time, waited for only at the end, reads taking time between
        sizes = [PIECE_BYTES // 3] + [PIECE_BYTES] * 8
    with LateThreads(4) if pool == "threads" else OutOfOrderPool() as executor:
        checksum = checkpoint_module._PieceChecksum(executor)
        offset, futures = 0, []
        for size in sizes:
            futures += checksum.update(payload[offset : offset + size])
            offset += size
            if caller == "writer":
                for future in futures:
                    future.result()
            else:
                time.sleep(0.001)
        for future in futures:
            future.result()
        assert checksum.length == len(payload)
        assert checksum.digest() == piece_checksum(bytes(payload)) == payload_checksum(payload)


def write_headed(path: Path, state: dict, magic: bytes) -> None:
    """A checkpoint as hpcdl wrote it before format 3: the header before the payload, with
    one SHA-256 of the payload (format 1) or the SHA-256 of its pieces' CRC-32s (format 2)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    digest = hashlib.sha256(payload).digest() if magic == MAGIC_V1 else crc_piece_checksum(payload)
    path.write_bytes(struct.pack("<8s32sQ", magic, digest, len(payload)) + payload)


@pytest.mark.parametrize("magic", [MAGIC_V1, MAGIC_V2], ids=["format-1", "format-2"])
def test_older_formats_still_load_and_are_verified(tmp_path: Path, magic: bytes) -> None:
    store = CheckpointStore(tmp_path, keep_last=3)
    write_headed(tmp_path / "step_000000001.pt", big_state(1), magic)
    write_headed(tmp_path / "step_000000002.pt", big_state(2), magic)
    verify_checkpoint(tmp_path / "step_000000002.pt")
    for mmap in (False, True):  # mmap: read all the same (torch cannot map them)
        found = store.load_latest(mmap=mmap)
        assert found is not None and found[1]["progress"]["global_step"] == 2
        assert torch.equal(found[1]["model"]["big"], big_state(2)["model"]["big"])
    flip_byte(tmp_path / "step_000000002.pt", 48 + 2 * PIECE_BYTES)
    with pytest.warns(CheckpointWarning, match="step_000000002.pt: checksum mismatch"):
        found = store.load_latest()
    assert found is not None and found[1]["progress"]["global_step"] == 1
    # The next save writes format 3 beside them.
    assert store.save(big_state(3), 3).read_bytes()[-48:-40] == MAGIC


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "where", ["tensor", "pickle", "zip_directory"], ids=["tensor", "pickle", "zip-directory"]
)
def test_corruption_anywhere_is_a_checksum_mismatch_and_the_previous_one_loads(
    tmp_path: Path, where: str
) -> None:
    store = CheckpointStore(tmp_path, keep_last=3)
    store.save(big_state(1), 1)
    newest = store.save(big_state(2), 2)
    size = newest.stat().st_size
    # The checksum is checked before torch parses, wherever the damage is.
    offset = {"tensor": 2 * PIECE_BYTES + 5, "pickle": 120, "zip_directory": size - 48 - 30}
    flip_byte(newest, offset[where])
    for mmap in (False, True):
        with pytest.raises(CheckpointError, match="checksum mismatch") as info:
            read_checkpoint(newest, mmap=mmap)
        assert str(info.value) == f"{newest}: checksum mismatch: the file is corrupt"
    with pytest.warns(CheckpointWarning, match="step_000000002.pt: checksum mismatch"):
        found = store.load_latest()
    assert found is not None and found[0].name == "step_000000001.pt"
    assert torch.equal(found[1]["model"]["big"], big_state(1)["model"]["big"])


def test_loading_a_format_2_file_reads_the_payload_about_once(
    tmp_path: Path, monkeypatch
) -> None:
    path = tmp_path / "step_000000001.pt"
    write_headed(path, big_state(1), MAGIC_V2)
    payload_bytes = path.stat().st_size - 48
    read = []
    real_preadv, real_pread = os.preadv, os.pread

    def preadv(fd, buffers, offset):
        n = real_preadv(fd, buffers, offset)
        read.append(n)
        return n

    def pread(fd, n, offset):
        data = real_pread(fd, n, offset)
        read.append(len(data))
        return data

    monkeypatch.setattr(os, "preadv", preadv)
    monkeypatch.setattr(os, "pread", pread)
    read_checkpoint(path)
    # The zip directory (read first, hashed at the end) and records' names are read twice.
    assert payload_bytes <= sum(read) < payload_bytes + 64 * 1024


def test_a_reader_in_any_order_still_checks_every_byte(tmp_path: Path) -> None:
    path = CheckpointStore(tmp_path).save(big_state(1), 1)
    length = path.stat().st_size - 48
    offsets = list(range(0, length, 300_000))
    with checkpoint_module._open_checkpoint(path) as (file, layout):
        assert (layout.length, layout.offset) == (length, 0)
        reader = checkpoint_module._HashingReader(
            file.fileno(), layout, checkpoint_module._CHECKSUMS[layout.magic](pool=None)
        )
        for offset in reversed(offsets):  # back to front, as no torch does
            reader.seek(offset)
            assert len(reader.read(300_000)) == min(300_000, length - offset)
        assert reader.digest() == layout.digest


def test_list_steps_sorts_numerically_and_latest_is_newest(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last=5)
    for step in (9, 100, 10):
        store.save(make_state(step), step)
    assert [step for step, _ in store.list_steps()] == [9, 10, 100]
    found = store.load_latest()
    assert found is not None
    path, state = found
    assert path.name == "step_000000100.pt"
    assert state["progress"]["global_step"] == 100


def test_empty_or_missing_directory_has_no_latest(tmp_path: Path) -> None:
    assert CheckpointStore(tmp_path).load_latest() is None
    missing = CheckpointStore(tmp_path / "nope")
    assert missing.load_latest() is None
    assert missing.list_steps() == []
    assert missing.best_path() is None


def test_truncated_newest_is_skipped_with_warning(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last=3)
    store.save(make_state(1), 1)
    newest = store.save(make_state(2), 2)
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])
    with pytest.warns(CheckpointWarning, match="step_000000002.pt.*truncated"):
        found = store.load_latest()
    assert found is not None
    assert found[0].name == "step_000000001.pt"
    assert found[1]["progress"]["global_step"] == 1


def test_all_corrupt_gives_none(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save(make_state(1), 1).write_bytes(b"short")
    with pytest.warns(CheckpointWarning):
        assert store.load_latest() is None


def test_flipped_last_byte_is_a_checksum_mismatch(tmp_path: Path) -> None:
    path = CheckpointStore(tmp_path).save(make_state(5), 5)
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch") as info:
        read_checkpoint(path)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)
    data[-10] ^= 0xFF
    data[-3] ^= 0x01  # the trailer's payload length
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt: the trailer says"):
        read_checkpoint(path)


def test_a_file_system_without_mmap_is_checked_and_loaded_by_reading(
    tmp_path: Path, monkeypatch
) -> None:
    path = CheckpointStore(tmp_path).save(big_state(3), 3)

    def no_mmap(*args, **kwargs):
        raise OSError(19, "No such device")

    monkeypatch.setattr(checkpoint_file._mmap, "mmap", no_mmap)
    with monkeypatch.context() as torch_too:
        torch_too.setattr(torch.UntypedStorage, "from_file", no_mmap)
        with pytest.raises(OSError):
            torch.load(path, weights_only=True, mmap=True)
        loaded = read_checkpoint(path, mmap=True)
    assert torch.equal(loaded["model"]["big"], big_state(3)["model"]["big"])
    verify_checkpoint(path)
    flip_byte(path, PIECE_BYTES + 7)
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        verify_checkpoint(path)


def test_foreign_file_and_missing_file_are_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "model.pt"
    torch.save({"w": torch.ones(2)}, foreign)
    with pytest.raises(CheckpointError, match="not an hpcdl checkpoint"):
        read_checkpoint(foreign)
    with pytest.raises(CheckpointError, match="cannot read"):
        read_checkpoint(tmp_path / "absent.pt")


class WriteMarker:
    """Unpickling this would create a file: proof that code ran."""

    def __init__(self, target: str):
        self.target = target

    def __reduce__(self):
        return (Path.touch, (Path(self.target),))


@pytest.mark.parametrize("magic", [MAGIC, MAGIC_V2, MAGIC_V1])
def test_malicious_pickle_with_valid_frame_is_refused(tmp_path: Path, magic: bytes) -> None:
    marker = tmp_path / "pwned"
    buffer = io.BytesIO()
    torch.save({"model": {}, "evil": WriteMarker(str(marker))}, buffer)
    payload = buffer.getvalue()
    path = tmp_path / "step_000000001.pt"
    checksum = {
        MAGIC: payload_checksum(payload),
        MAGIC_V2: crc_piece_checksum(payload),
        MAGIC_V1: hashlib.sha256(payload).digest(),
    }[magic]
    frame = struct.pack("<8s32sQ", magic, checksum, len(payload))
    path.write_bytes(payload + frame if magic == MAGIC else frame + payload)
    with pytest.raises(CheckpointError, match="refused") as info:
        read_checkpoint(path)
    assert "\n" not in str(info.value)
    assert not marker.exists()
    with pytest.warns(CheckpointWarning, match="refused"):
        assert CheckpointStore(tmp_path).load_latest() is None
    assert not marker.exists()
    # Sanity check that the marker object does run code when loaded unsafely.
    torch.load(io.BytesIO(payload), weights_only=False)
    assert marker.exists()


def test_unsafe_state_is_refused_at_save_naming_the_key(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    with pytest.raises(CheckpointError, match=r"state\['rng'\]\['gen'\]"):
        store.save({"rng": {"gen": np.random.default_rng(0)}}, 1)
    assert store.list_steps() == []


def test_keep_last_purges_old_steps_but_keeps_best(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last=2)
    store.save(make_state(1), 1, is_best=True)
    for step in (2, 3, 4):
        store.save(make_state(step), step)
    assert [step for step, _ in store.list_steps()] == [3, 4]
    best = store.best_path()
    assert best == tmp_path / "best.pt"
    assert read_checkpoint(best)["progress"]["global_step"] == 1


def test_best_has_the_same_bytes_as_its_step_file(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    path = store.save(make_state(7), 7, is_best=True)
    assert (tmp_path / "best.pt").read_bytes() == path.read_bytes()


def test_saving_an_older_step_keeps_it(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last=1)
    store.save(make_state(10), 10)
    path = store.save(make_state(3), 3)
    assert path.exists()


def test_same_step_twice_overwrites(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save(make_state(1), 4)
    store.save(make_state(2), 4)
    assert len(store.list_steps()) == 1
    assert read_checkpoint(tmp_path / "step_000000004.pt")["progress"]["global_step"] == 2


def test_temp_files_are_ignored_then_cleaned(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save(make_state(1), 1)
    leftover = tmp_path / ".step_000000002.pt.tmp-99999"
    leftover.write_bytes(b"half a checkpoint")
    assert [step for step, _ in store.list_steps()] == [1]
    found = store.load_latest()
    assert found is not None and found[0].name == "step_000000001.pt"
    store.save(make_state(3), 3)
    assert not leftover.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step_000000001.pt",
        "step_000000003.pt",
    ]


def test_keep_last_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"trainer\.keep_last=0"):
        CheckpointStore(tmp_path, keep_last=0)


def test_resolve_run_dir_file_and_best(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    store = CheckpointStore(run_dir / "checkpoints", keep_last=3)
    store.save(make_state(1), 1, is_best=True)
    newest = store.save(make_state(2), 2)
    assert resolve_checkpoint(run_dir) == newest
    assert resolve_checkpoint(str(run_dir / "checkpoints")) == newest
    assert resolve_checkpoint(run_dir, which="best") == run_dir / "checkpoints" / "best.pt"
    assert resolve_checkpoint(newest) == newest
    # The newest valid one: a corrupt newest file is passed over.
    newest.write_bytes(newest.read_bytes()[:100])
    with pytest.warns(CheckpointWarning):
        assert resolve_checkpoint(run_dir).name == "step_000000001.pt"


def test_resolve_errors_name_the_reference(tmp_path: Path) -> None:
    missing = tmp_path / "no_such_run"
    with pytest.raises(CheckpointError, match="no_such_run: no such checkpoint"):
        resolve_checkpoint(missing)
    empty = tmp_path / "empty_run"
    (empty / "checkpoints").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="empty_run: no complete checkpoint"):
        resolve_checkpoint(empty)
    with pytest.raises(CheckpointError, match=r"empty_run: no best\.pt"):
        resolve_checkpoint(empty, which="best")
    with pytest.raises(CheckpointError, match="which='first'"):
        resolve_checkpoint(empty, which="first")


# ----------------------------------------------------------------------------- save_async
@pytest.fixture
def held_writes(monkeypatch: pytest.MonkeyPatch):
    """Background writes wait until the test lets them go: what a slow disk looks like."""
    go = threading.Event()
    real_write = CheckpointStore._write

    def write(self, state, step, is_best):
        assert go.wait(timeout=30)
        return real_write(self, state, step, is_best)

    monkeypatch.setattr(CheckpointStore, "_write", write)
    return go


def test_save_async_writes_a_copy_taken_when_it_was_called(tmp_path: Path, held_writes) -> None:
    store = CheckpointStore(tmp_path)
    state = big_state(1)
    path = store.save_async(state, 1)
    assert path == tmp_path / "step_000000001.pt" and not path.exists()
    state["model"]["weight"].add_(100)  # training goes on and changes the live tensors
    state["model"]["big"].zero_()
    state["progress"]["global_step"] = 99
    held_writes.set()
    store.wait()
    loaded = read_checkpoint(path)
    assert torch.equal(loaded["model"]["weight"], torch.full((3, 2), 1.0))
    assert torch.equal(loaded["model"]["big"], big_state(1)["model"]["big"])
    assert loaded["progress"]["global_step"] == 1
    assert path.read_bytes()[-48:-40] == MAGIC


def test_save_async_keeps_one_save_in_flight(tmp_path: Path, held_writes) -> None:
    store = CheckpointStore(tmp_path, keep_last=1)
    store.save_async(make_state(1), 1)
    second = threading.Thread(target=store.save_async, args=(make_state(2), 2))
    second.start()
    second.join(timeout=0.5)
    assert second.is_alive(), "the second save must wait for the first to be written"
    held_writes.set()
    second.join(timeout=30)
    store.wait()
    # Both were written in order; the purge of keep_last=1 ran after the newer was complete.
    assert [step for step, _ in store.list_steps()] == [2]
    assert not list(tmp_path.glob(".*.tmp-*"))


def fail_fsync_of(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(f".{name}.tmp-{os.getpid()}"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_a_failed_background_write_surfaces_at_the_next_save(tmp_path: Path, monkeypatch) -> None:
    store = CheckpointStore(tmp_path)
    store.save(make_state(1), 1)
    fail_fsync_of(monkeypatch, "step_000000002.pt")
    store.save_async(make_state(2), 2)  # returns at once: the failure is in the thread
    with pytest.raises(CheckpointError) as caught:
        store.save_async(make_state(3), 3)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'step_000000002.pt'}: checkpoint not saved: ")
    assert "(EIO)" in message and "intact" in message
    assert [step for step, _ in store.list_steps()] == [1]  # step 3 was not started
    assert not list(tmp_path.glob(".*.tmp-*"))
    store.wait()  # reported once


def test_a_failed_background_write_surfaces_at_wait(tmp_path: Path, monkeypatch) -> None:
    store = CheckpointStore(tmp_path)
    fail_fsync_of(monkeypatch, "best.pt")
    store.save_async(make_state(1), 1, is_best=True)
    with pytest.raises(CheckpointError, match=r"best\.pt: checkpoint not saved: .*\(EIO\)"):
        store.wait()
    assert store.list_steps() == [] and store.best_path() is None  # neither: see below
    assert not list(tmp_path.glob(".*.tmp-*"))


@pytest.mark.parametrize("resaved", [False, True])
def test_a_best_save_that_fails_saves_neither_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, resaved: bool
) -> None:
    """A full disk at best.pt's copy once left the new step file without its best.pt: the
    resumed run's progress named that epoch as its best while best.pt held an older one
    (`hpcdl evaluate` and the end of an early-stopped run used those weights). Now the save
    is all or nothing, as the error says; an earlier save of the same step (the epoch's
    last step saved before the epoch ended) is kept as it was."""
    store = CheckpointStore(tmp_path, keep_last=5)
    store.save(make_state(1), 1, is_best=True)
    if resaved:
        store.save(make_state(20), 2)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    fail_fsync_of(monkeypatch, "best.pt")
    with pytest.raises(CheckpointError, match=r"best\.pt: checkpoint not saved: .*\(EIO\)"):
        store.save(make_state(2), 2, is_best=True)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_unsafe_state_is_refused_by_save_async_before_anything_starts(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    with pytest.raises(CheckpointError, match=r"state\['rng'\]\['gen'\]"):
        store.save_async({"rng": {"gen": np.random.default_rng(0)}}, 1)
    store.wait()
    assert store.list_steps() == []


def test_host_copy_is_independent_and_keeps_what_load_state_dict_needs() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    tied = torch.ones(4)
    state = {
        "model": model.state_dict(),
        "tied": [tied, tied],
        "param": torch.nn.Parameter(torch.zeros(2), requires_grad=False),
        "plain": (1, "a", None, torch.Size([2, 3])),
    }
    copied = host_copy(state)
    assert isinstance(copied["model"], OrderedDict)
    assert copied["model"]._metadata == state["model"]._metadata  # module versions
    for key, value in state["model"].items():
        assert torch.equal(copied["model"][key], value)
        assert copied["model"][key].data_ptr() != value.data_ptr()
    assert copied["tied"][0] is copied["tied"][1]  # one copy, as torch.save keeps one
    assert type(copied["param"]) is torch.nn.Parameter and not copied["param"].requires_grad
    assert copied["plain"] == state["plain"]
    with torch.no_grad():
        model[0].weight.add_(1.0)
    assert not torch.equal(copied["model"]["0.weight"], model[0].weight)
    model.load_state_dict(copied["model"])


@pytest.mark.gpu
def test_host_copy_of_cuda_tensors_is_pinned_host_memory() -> None:
    state = {"w": torch.randn(1000, device="cuda"), "n": torch.arange(5, device="cuda")}
    copied = host_copy(state)
    for key, value in state.items():
        assert copied[key].device.type == "cpu" and copied[key].is_pinned()
        assert torch.equal(copied[key], value.cpu())


def test_async_checkpoint_choices_are_checked() -> None:
    from hpcdl.cli.compose import compose_config

    # A bare true/false on the command line arrives as a bool: accepted as its text.
    for value in ("auto", "true", "false", "True"):
        assert compose_config([f"trainer.async_checkpoint={value}"]).trainer.async_checkpoint
    with pytest.raises(ConfigError, match=r"trainer\.async_checkpoint='maybe': choose auto"):
        compose_config(["trainer.async_checkpoint=maybe"])


def draw_numbers() -> tuple[list[float], list[float], list[float], list[float]]:
    return (
        [*(random.random() for _ in range(5)), random.gauss(0, 1)],
        [*np.random.rand(5).tolist(), float(np.random.randn())],
        torch.rand(5).tolist() + torch.randn(3).tolist(),
        [random.getrandbits(64) / 2**64],
    )


def test_rng_restore_repeats_the_same_draws() -> None:
    random.gauss(0, 1)  # leave a cached gaussian in both generators
    np.random.randn()
    state = capture_rng_state()
    first = draw_numbers()
    restore_rng_state(state)
    assert draw_numbers() == first


def test_a_process_that_never_started_cuda_does_not_start_it_for_the_rng(monkeypatch) -> None:
    """A CPU run on a GPU node (CUDA available, never used): reading the CUDA generators
    would create a CUDA context on every rank at its first save; there is nothing to keep."""

    def started(*_: object) -> None:
        raise AssertionError("the CUDA generators were read")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", started)
    assert capture_rng_state()["cuda"] == []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(AssertionError, match="generators were read"):
        capture_rng_state()


def test_rng_state_survives_the_store_with_weights_only(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save({"rng": [capture_rng_state()]}, 1)
    first = draw_numbers()
    found = store.load_latest()
    assert found is not None
    restore_rng_state(found[1]["rng"][0])
    assert draw_numbers() == first


@pytest.mark.gpu
def test_cuda_rng_restore_repeats_the_same_draws(tmp_path: Path) -> None:
    torch.cuda.init()  # capture reads the CUDA generators only once CUDA is in use
    torch.cuda.manual_seed_all(3)
    store = CheckpointStore(tmp_path)
    store.save({"rng": capture_rng_state()}, 1)
    first = torch.rand(4, device="cuda").tolist()
    found = store.load_latest()
    assert found is not None
    assert len(found[1]["rng"]["cuda"]) == torch.cuda.device_count()
    restore_rng_state(found[1]["rng"])
    assert torch.rand(4, device="cuda").tolist() == first


def test_a_state_the_store_cannot_load_is_refused_at_save_with_the_way_on() -> None:
    """An FSDP2 state dict holds DTensors: the refusal says how to save one (persona, FSDP)."""
    from hpcdl.checkpoint import check_weights_only_safe
    from hpcdl.errors import CheckpointError

    class DTensor(torch.Tensor):  # the name is what the message goes by
        pass

    state = {"model": {"0.weight": torch.zeros(2).as_subclass(DTensor)}}
    with pytest.raises(CheckpointError) as refused:
        check_weights_only_safe(state)
    assert str(refused.value) == (
        "state['model']['0.weight']: tensor subclass DTensor is not weights_only-safe; a "
        "sharded (FSDP) state: save it with torch.distributed.checkpoint "
        "(docs/scripts.md#fsdp-and-torchdistributedcheckpoint), or gather a full state dict "
        "first (StateDictOptions(full_state_dict=True, cpu_offload=True))"
    )
    with pytest.raises(CheckpointError, match=r"^state: builtins\.object is not weights_only-safe"):
        check_weights_only_safe(object())
