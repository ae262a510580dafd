"""Checkpoint store: atomic step files, checksums, weights_only loading, RNG round trips."""

from __future__ import annotations

import hashlib
import io
import random
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcdl.checkpoint import (
    MAGIC,
    CheckpointStore,
    CheckpointWarning,
    capture_rng_state,
    read_checkpoint,
    resolve_checkpoint,
    restore_rng_state,
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


def test_file_is_header_then_torch_save_payload(tmp_path: Path) -> None:
    path = CheckpointStore(tmp_path).save(make_state(1), 1)
    data = path.read_bytes()
    magic, digest, length = struct.unpack_from("<8s32sQ", data)
    payload = data[48:]
    assert magic == MAGIC
    assert length == len(payload)
    assert digest == hashlib.sha256(payload).digest()
    assert torch.load(io.BytesIO(payload), weights_only=True)["progress"]["global_step"] == 1


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


def test_flipped_byte_is_a_checksum_mismatch(tmp_path: Path) -> None:
    path = CheckpointStore(tmp_path).save(make_state(5), 5)
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch") as info:
        read_checkpoint(path)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


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


def test_malicious_pickle_with_valid_header_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    buffer = io.BytesIO()
    torch.save({"model": {}, "evil": WriteMarker(str(marker))}, buffer)
    payload = buffer.getvalue()
    path = tmp_path / "step_000000001.pt"
    header = struct.pack("<8s32sQ", MAGIC, hashlib.sha256(payload).digest(), len(payload))
    path.write_bytes(header + payload)
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
    torch.cuda.manual_seed_all(3)
    store = CheckpointStore(tmp_path)
    store.save({"rng": capture_rng_state()}, 1)
    first = torch.rand(4, device="cuda").tolist()
    found = store.load_latest()
    assert found is not None
    assert len(found[1]["rng"]["cuda"]) == torch.cuda.device_count()
    restore_rng_state(found[1]["rng"])
    assert torch.rand(4, device="cuda").tolist() == first
