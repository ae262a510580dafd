"""Training on a data set whose files are several times larger than the memory allowed.

A 1 GiB data set in mylab's format (docs/examples/mylab: images.npy and masks.npy, read one
sample at a time) is written to disk, and `hpcdl train` runs one epoch on it inside a
memory cgroup capped well below that, as a Slurm job's --mem would cap it. The epoch must
complete and summary.json must report a peak RSS below the data set's size. Loading the
same data whole under the same cap must be killed, which shows that the cap is real.

The cap is measured, not fixed: the same run on a 32 MiB copy of the data, in a cgroup
without a limit, gives what the trainer itself is charged on this machine (torch's kernels
and allocator differ between CPUs by tens of MiB; a fixed 320 MiB cap once left 15 MiB
of room and was hit on another machine). The cap is that plus HEADROOM_MB, and must stay
at most half the data set, which also bounds the trainer's own memory.

The cap is a cgroup (v1 memory.limit_in_bytes or v2 memory.max), which limits resident
memory, page cache included. RLIMIT_AS would not do: it counts address space, and torch
alone reserves gigabytes of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

EXAMPLES = REPO / "docs" / "examples"
DATASET_MB = 1024  # images.npy + masks.npy
SMALL_MB = 32  # the copy whose run measures the trainer's own memory
HEADROOM_MB = 64  # above that, for the page cache of the large data and the allocator's swings
IMAGE_SIZE = 512  # 2 x 256 KiB per sample: 2048 samples
BATCH_SIZE = 4


def test_an_epoch_on_data_larger_than_the_memory_cap(tmp_path: Path) -> None:
    import torch  # noqa: F401  (its libraries are then cached outside the capped cgroup)

    needed_mb = 2 * DATASET_MB
    free_mb = shutil.disk_usage(tmp_path).free // 2**20
    assert free_mb > needed_mb, f"{tmp_path}: {free_mb} MiB free, this test writes {needed_mb}"
    root = write_dataset(tmp_path / "cells", DATASET_MB, IMAGE_SIZE)
    num_samples = DATASET_MB * 2**20 // (2 * IMAGE_SIZE**2)
    num_train = num_samples - 2 * round(0.02 * num_samples)

    small = write_dataset(tmp_path / "small", SMALL_MB, IMAGE_SIZE)
    with memory_cgroup(None) as unlimited:
        out = capped_run(
            unlimited,
            *("-m", "hpcdl.cli.main", "train", "run_dir=small-run", *overrides(small)),
            cwd=tmp_path,
        )
        assert out.returncode == 0, f"{unlimited.describe()}\n{out.stderr}{out.stdout}"
        own_mb = unlimited.peak_mb()
    cap_mb = round(own_mb) + HEADROOM_MB
    assert cap_mb <= DATASET_MB // 2, (
        f"the trainer alone was charged {own_mb:.0f} MiB on {SMALL_MB} MiB of data: "
        f"a cap of {cap_mb} MiB would not be well below the {DATASET_MB} MiB data set"
    )

    with memory_cgroup(cap_mb) as cap:
        started = time.monotonic()
        out = capped_run(
            cap, "-m", "hpcdl.cli.main", "train", "run_dir=run", *overrides(root), cwd=tmp_path
        )
        train_s = time.monotonic() - started
        assert out.returncode == 0, f"{cap.describe()}\n{out.stderr}{out.stdout}"
        assert cap.peak_mb() > 0.9 * cap_mb  # the cap was full: pages were reclaimed to go on
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["epochs"] == 1 and summary["num_samples_seen"] == num_train
    assert 0 < summary["peak_rss_mb"] < DATASET_MB
    print(
        f"epoch on {DATASET_MB} MiB under a {cap_mb} MiB cap ({own_mb:.0f} MiB on "
        f"{SMALL_MB} MiB of data + {HEADROOM_MB}): {train_s:.0f} s, "
        f"peak RSS {summary['peak_rss_mb']:.0f} MiB"
    )

    load_whole = "import numpy as np; data = [np.load(p) for p in ('images.npy', 'masks.npy')]"
    with memory_cgroup(cap_mb) as cap:
        whole = capped_run(cap, "-c", load_whole, cwd=root)
        assert whole.returncode == -signal.SIGKILL, f"{cap.describe()}\n{whole.stderr}"


def overrides(root: Path) -> list[str]:
    return [
        "model=custom",
        "model.target=mylab.models:SmoothedThreshold",  # cheap per pixel: the test is the data
        "data=custom",
        "data.target=mylab.data:build_datasets",
        f"data.kwargs.root={root}",
        "data.kwargs.val_fraction=0.02",
        "data.kwargs.test_fraction=0.02",
        # Each DataLoader worker is a forked copy of the trainer (~100 MiB more under the
        # cap); reading in the training process keeps the cap about the data.
        "data.num_workers=0",
        "task=custom",
        "task.target=mylab.tasks:segmentation_step",
        "trainer.max_epochs=1",
        f"trainer.batch_size={BATCH_SIZE}",
    ]


def write_dataset(root: Path, size_mb: int, image_size: int) -> Path:
    """mylab's images.npy and masks.npy of size_mb together: 64 generated samples, repeated
    (generating every sample would take most of the test's time), then dropped from the
    page cache so that the capped reader pays for reading them."""
    import numpy as np

    sys.path.insert(0, str(EXAMPLES))
    try:
        from mylab.make_data import make_dataset
    finally:
        sys.path.remove(str(EXAMPLES))
    block = make_dataset(root / "block", num=64, size=image_size)
    num = size_mb * 2**20 // (2 * image_size**2)
    for name in ("images.npy", "masks.npy"):
        source = np.load(block / name)
        array = np.lib.format.open_memmap(root / name, "w+", np.uint8, (num, *source.shape[1:]))
        for start in range(0, num, len(source)):
            array[start : start + len(source)] = source[: num - start]
        array.flush()
        del array
        fd = os.open(root / name, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return root


def capped_run(cap: MemoryCgroup, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    paths = [str(EXAMPLES), str(REPO), os.environ.get("PYTHONPATH", "")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=cap.enter,  # only writes the child's pid to a file
        check=False,
    )


# ----------------------------------------------------------------------------- the cap
class MemoryCgroup:
    """A new memory cgroup below this process's own (v1) or below the root (v2)."""

    def __init__(self, path: Path, version: int) -> None:
        self.path = path
        self.version = version

    def enter(self) -> None:
        """Moves the calling process (and its future children) into the cgroup."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def peak_mb(self) -> float:
        """The most memory charged to the cgroup at once, page cache included."""
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        return int((self.path / name).read_text()) / 2**20

    def describe(self) -> str:
        return f"cgroup v{self.version} {self.path}: peak {self.peak_mb():.0f} MiB"


@contextlib.contextmanager
def memory_cgroup(limit_mb: int | None) -> Iterator[MemoryCgroup]:
    """A capped cgroup, or with limit_mb None one that only measures."""
    cap = new_memory_cgroup(limit_mb)
    try:
        yield cap
    finally:
        remove_cgroup(cap.path)


def new_memory_cgroup(limit_mb: int | None) -> MemoryCgroup:
    limit = str(limit_mb * 2**20) if limit_mb is not None else None
    name = f"hpcdl-test-memory-{os.getpid()}-{time.monotonic_ns()}"
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    v1 = [line.split(":", 2)[2] for line in lines if line.split(":")[1] == "memory"]
    unified = Path("/sys/fs/cgroup")
    if v1 and (Path("/sys/fs/cgroup/memory") / v1[0].lstrip("/")).is_dir():
        path = Path("/sys/fs/cgroup/memory") / v1[0].lstrip("/") / name
        path.mkdir()
        if limit is not None:
            (path / "memory.limit_in_bytes").write_text(limit)
            with contextlib.suppress(FileNotFoundError):  # no swap accounting: nothing to swap to
                (path / "memory.memsw.limit_in_bytes").write_text(limit)
        return MemoryCgroup(path, 1)
    controllers = unified / "cgroup.subtree_control"
    if controllers.exists() and "memory" in controllers.read_text().split():
        # The root cgroup may hold processes and have children with controllers; a
        # non-root cgroup with processes may not (cgroup v2's no-internal-process rule).
        path = unified / name
        path.mkdir()
        if limit is not None:
            (path / "memory.max").write_text(limit)
            with contextlib.suppress(FileNotFoundError):
                (path / "memory.swap.max").write_text("0")
        return MemoryCgroup(path, 2)
    pytest.fail(
        "capping memory needs a memory cgroup this test can create (root; cgroup v1 "
        "/sys/fs/cgroup/memory, or v2 with 'memory' in /sys/fs/cgroup/cgroup.subtree_control)"
    )


def remove_cgroup(path: Path) -> None:
    """Ends what is left in the cgroup (only processes this test started are in it), then
    removes it; the kernel may need a moment after an OOM kill."""
    procs = path / "cgroup.procs"
    for pid in procs.read_text().split() if procs.exists() else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while True:
        try:
            path.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
