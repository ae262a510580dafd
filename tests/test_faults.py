"""Faults a new user hits: a crafted CIFAR pickle, mistyped paths, broken YAML, and file
systems that are read-only, full or in the way. Each is one line on stderr, exit status 2,
and nothing on disk made, half-made or damaged.

Disk-full and read-only cases run on a real tmpfs mounted here when this machine allows
it (root in a container that may mount); a file-size limit (RLIMIT_FSIZE, any user) and an
injected OSError cover the same paths where it does not.
"""

from __future__ import annotations

import errno
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hpcdl.checkpoint import CheckpointStore, read_checkpoint
from hpcdl.cli.main import main
from hpcdl.data.cifar import read_cifar10
from hpcdl.errors import CheckpointError
from hpcdl.exit_codes import EXIT_BAD_INPUT, EXIT_OK
from hpcdl.hooks import StepEvent
from tests.conftest import REPO, run_hpcdl

FAST = ["trainer.max_epochs=1"]


def tree(root: Path) -> list[str]:
    """Every path under root (hidden ones too), to compare before and after a command."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def one_line_error(out: subprocess.CompletedProcess, *expected: str) -> str:
    assert out.returncode == EXIT_BAD_INPUT, (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    for text in expected:
        assert text in lines[0], (text, lines[0])
    return lines[0]


# ----------------------------------------------------------------------------- CIFAR-10
def cifar_batch(num_rows: int, seed: int) -> dict[bytes, object]:
    """A batch as the CIFAR-10 "python version" holds one (Python 2 str keys and values
    read back as bytes): uint8 rows of 1024 red, 1024 green, 1024 blue values."""
    rng = np.random.default_rng(seed)
    return {
        b"batch_label": b"training batch 1 of 5",
        b"labels": [int(v) for v in rng.integers(0, 10, num_rows)],
        b"data": rng.integers(0, 256, (num_rows, 3072), dtype=np.uint8),
        b"filenames": [f"img_{i}.png".encode() for i in range(num_rows)],
    }


def write_cifar(folder: Path, protocol: int) -> Path:
    folder.mkdir(parents=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for seed, name in enumerate(names):
        (folder / name).write_bytes(pickle.dumps(cifar_batch(20, seed), protocol=protocol))
    meta = {
        b"label_names": [n.encode() for n in "abcdefghij"],
        b"num_cases_per_batch": 20,
        b"num_vis": 3072,
    }
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=protocol))
    return folder


class RunsAShellCommand:
    """What a crafted batch file holds: unpickling it calls os.system."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (self.command,))


# Protocol 2 is how the CIFAR-10 files were written (Python 2's cPickle); a user's own
# re-pickled batches use Python 3's default or highest protocol.
@pytest.mark.parametrize("protocol", [2, pickle.DEFAULT_PROTOCOL, pickle.HIGHEST_PROTOCOL])
def test_cifar_batches_in_the_real_format_still_load(tmp_path: Path, protocol: int) -> None:
    raw = read_cifar10(str(write_cifar(tmp_path / "cifar-10-batches-py", protocol)))
    assert raw.x.shape == (100, 3, 32, 32) and raw.x.dtype == np.uint8
    assert raw.x_test is not None and raw.x_test.shape == (20, 3, 32, 32)
    expected = cifar_batch(20, 0)
    assert np.array_equal(raw.x[:20].reshape(20, -1), expected[b"data"])
    assert raw.y[:20].tolist() == expected[b"labels"]
    assert raw.class_names == list("abcdefghij")


def test_a_crafted_cifar_batch_is_refused_and_runs_nothing(hpcdl, tmp_path: Path) -> None:
    folder = write_cifar(tmp_path / "cifar-10-batches-py", protocol=2)
    marker = tmp_path / "pwned"
    evil = folder / "data_batch_3"
    evil.write_bytes(pickle.dumps({b"data": RunsAShellCommand(f"touch {marker}")}, protocol=2))
    out = hpcdl("train", "data=cifar10", f"data.path={folder}", "run_dir=run", *FAST)
    line = one_line_error(out, str(evil), "refused", "system")
    assert "Traceback" not in out.stderr, line
    assert not marker.exists()


# ----------------------------------------------------------------------------- read-only commands
READING_COMMANDS = [
    ["sweep", "status"],
    ["sweep", "summary"],
    ["sweep", "rerun", "--failed"],
    ["status"],
    ["logs"],
    ["evaluate"],
]


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The command line in this process (the same main() the installed command runs)."""
    code = main(args)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("command", READING_COMMANDS, ids=" ".join)
def test_commands_that_read_create_nothing_on_a_bad_path(
    command: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("a file, not a sweep or run dir\n")
    (tmp_path / "empty").mkdir()
    before = tree(tmp_path)
    for ref in ("nope/typo/sweep", "notes.txt", "empty"):
        # `status` and `logs` take RUN_DIR|JOB_ID; the subcommand comes before the path.
        args = [*command[:2], ref, *command[2:]] if command[0] == "sweep" else [*command, ref]
        code, err = run_main(args, capsys)
        assert code == EXIT_BAD_INPUT, (args, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and ref in lines[0], (args, err)
        assert tree(tmp_path) == before, args
    assert (tmp_path / "notes.txt").read_text() == "a file, not a sweep or run dir\n"


# ----------------------------------------------------------------------------- broken YAML
def test_malformed_yaml_in_a_config_dir_is_one_line(hpcdl, tmp_path: Path) -> None:
    (tmp_path / "mydir" / "model").mkdir(parents=True)
    bad = tmp_path / "mydir" / "model" / "foo.yaml"
    bad.write_text("# hpcdl train --config-dir mydir model=foo\nname: mlp\nhidden: [64, 32\n")
    out = hpcdl("train", "--config-dir", "mydir", "model=foo", *FAST)
    one_line_error(out, str(bad), "line 4", "invalid YAML")
    out = hpcdl("train", "-m", "--config-dir", "mydir", "model=mlp,foo", *FAST)
    one_line_error(out, "trial 1 (model=foo)", str(bad))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mydir"]


def test_malformed_top_level_config_is_one_line(hpcdl, tmp_path: Path) -> None:
    conf = shutil.copytree(REPO / "conf", tmp_path / "conf")
    top = conf / "config.yaml"
    top.write_text(top.read_text() + "trainer:\n  max_epochs: 1\n bad: : x\n")
    out = hpcdl("train", env={"HPCDL_CONF_DIR": str(conf)})
    one_line_error(out, str(top), "invalid YAML")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conf"]


# ----------------------------------------------------------------------------- file systems
@pytest.fixture
def mount_tmpfs(tmp_path: Path) -> Iterator:
    """mount(size_kb, read_only) -> a fresh tmpfs; skips where this machine may not mount."""
    mounted: list[Path] = []

    def mount(size_kb: int, read_only: bool = False) -> Path:
        point = tmp_path / f"fs{len(mounted)}"
        point.mkdir()
        options = f"size={size_kb}k" + (",ro" if read_only else "")
        try:
            out = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
                capture_output=True,
                text=True,
            )
        except OSError as err:  # no mount(8) at all
            pytest.skip(f"cannot mount a tmpfs here: {err}")
        if out.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in reversed(mounted):
        subprocess.run(["umount", "-l", str(point)], check=False)


def fill(fs: Path, pages_free: int = 0) -> Path:
    """Fill a tmpfs, then give back ``pages_free`` 4 KiB pages (tmpfs counts whole pages)."""
    filler = fs / "filler"
    with open(filler, "wb", buffering=0) as f:  # unbuffered: close() has nothing to flush
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as err:
            assert err.errno == errno.ENOSPC
    os.truncate(filler, max(0, filler.stat().st_size - pages_free * 4096))
    return filler


def test_run_dir_on_a_read_only_file_system(hpcdl, mount_tmpfs) -> None:
    fs = mount_tmpfs(256, read_only=True)
    out = hpcdl("train", f"run_dir={fs}/runs/exp1", *FAST)
    one_line_error(out, f"{fs}/runs/exp1", "Read-only file system (EROFS)")
    assert tree(fs) == []
    # The default run dir (outputs/ here): the key that chooses another folder is named.
    out = run_hpcdl("train", *FAST, cwd=fs)
    line = one_line_error(out, f"run dir {fs}/outputs/", "Read-only file system (EROFS)")
    assert line.endswith(
        "; set run_dir=... (runs go under outputs/ in the current folder by default)"
    )
    assert tree(fs) == []


def test_evaluate_of_a_run_on_a_read_only_file_system(hpcdl, mount_tmpfs) -> None:
    """It was a traceback (eval/ made with a bare mkdir) once the checkpoint was evaluated."""
    fs = mount_tmpfs(1024)
    run = shutil.copytree(REPO / "tests" / "data" / "run_v0", fs / "run")
    subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
    before = tree(fs)
    out = hpcdl("evaluate", str(run))
    one_line_error(out, f"{run}/eval/best", "Read-only file system (EROFS)")
    assert tree(fs) == before
    # The metrics, computed before the folder was refused, are shown all the same.
    assert out.stdout.startswith(f"checkpoint: {run}/checkpoints/best.pt\ntest_loss "), out.stdout
    assert "confusion matrix [true x predicted]:" in out.stdout and "written:" not in out.stdout


def test_run_dir_under_a_regular_file(hpcdl, tmp_path: Path) -> None:
    (tmp_path / "somefile").write_text("keep me\n")
    out = hpcdl("train", "run_dir=somefile/x", *FAST)
    one_line_error(out, "run_dir='somefile/x'", f"{tmp_path}/somefile is a file")
    out = hpcdl("train", "run_dir=somefile", *FAST)
    one_line_error(out, "run_dir='somefile'", "is a file, not a folder")
    assert tree(tmp_path) == ["somefile"]
    assert (tmp_path / "somefile").read_text() == "keep me\n"


def test_run_dir_whose_parent_is_not_writable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Root ignores permission bits, so the kernel's answer to a non-root user is injected.
    locked = tmp_path / "shared"
    locked.mkdir()
    real_mkdir = os.mkdir

    def mkdir(path: os.PathLike, mode: int = 0o777) -> None:
        if Path(path).parent == locked:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        real_mkdir(path, mode)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(os, "mkdir", mkdir)
    code, err = run_main(["train", f"run_dir={locked}/exp1", *FAST], capsys)
    assert code == EXIT_BAD_INPUT
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"{locked}/exp1" in lines[0], err
    assert "Permission denied (EACCES)" in lines[0]
    assert tree(tmp_path) == ["shared"]


@pytest.mark.parametrize("pages_free", [0, 1])
def test_disk_full_while_creating_the_run_dir_leaves_nothing(
    hpcdl, mount_tmpfs, pages_free: int
) -> None:
    # 0 pages: config.yaml's first write fails; 1 page: commands.log fits, config.yaml not.
    fs = mount_tmpfs(128)
    filler = fill(fs, pages_free)
    out = hpcdl("train", f"run_dir={fs}/runs/exp1", *FAST)
    one_line_error(out, f"{fs}/runs/exp1", "No space left on device (ENOSPC)")
    assert tree(fs) == ["filler"]
    filler.unlink()  # space freed: the same command now works, and so does resume
    out = hpcdl("train", "--no-launch", f"run_dir={fs}/runs/exp1", *FAST)
    assert out.returncode == EXIT_OK, out.stderr
    assert (fs / "runs" / "exp1" / "config.yaml").is_file()


def test_a_file_size_limit_while_creating_the_run_dir_leaves_nothing(tmp_path: Path) -> None:
    # Works without root: RLIMIT_FSIZE makes writes past 512 bytes fail with EFBIG (Python
    # ignores SIGXFSZ), so the config write fails after the run dir's folder was made.
    code = (
        "import resource, runpy, sys\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))\n"
        "sys.argv = ['hpcdl', 'train', 'run_dir=runs/exp1', 'trainer.max_epochs=1']\n"
        "runpy.run_module('hpcdl.cli.main', run_name='__main__')\n"
    )
    out = subprocess.run(
        [sys.executable, "-B", "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    # runpy's sys.exit(main()) carries the status out of the interpreter.
    one_line_error(out, f"{tmp_path}/runs/exp1", "File too large (EFBIG)")
    assert tree(tmp_path) == []
    out = run_hpcdl("train", "--no-launch", "run_dir=runs/exp1", *FAST, cwd=tmp_path)
    assert out.returncode == EXIT_OK, out.stderr


# ----------------------------------------------------------------------------- checkpoints
def tiny_state(value: float) -> dict[str, object]:
    import torch

    return {"model": {"w": torch.full((256,), value)}, "progress": {"global_step": int(value)}}


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
@pytest.mark.parametrize("best", [False, True])
def test_a_failed_checkpoint_save_keeps_the_older_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, best: bool
) -> None:
    store = CheckpointStore(tmp_path, keep_last=2)
    store.save(tiny_state(1), 1, is_best=True)
    store.save(tiny_state(2), 2)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    real_fsync = os.fsync
    failing = "best.pt" if best else "step_000000003.pt"

    def fsync(fd: int) -> None:  # the storage fails on the file's data (write-back)
        if os.readlink(f"/proc/self/fd/{fd}").endswith(f".{failing}.tmp-{os.getpid()}"):
            raise OSError(code, os.strerror(code))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(CheckpointError) as caught:
        store.save(tiny_state(3), 3, is_best=True)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / failing}: checkpoint not saved: ")
    assert f"({errno.errorcode[code]})" in message
    assert not list(tmp_path.glob(".*.tmp-*")), "the temporary file must be removed"
    for name, data in before.items():  # nothing purged, nothing overwritten
        assert (tmp_path / name).read_bytes() == data
        read_checkpoint(tmp_path / name)
    # best.pt is copied before the step file is renamed: neither is saved (test_checkpoint)
    assert [s for s, _ in store.list_steps()] == [1, 2]


def fill_disk_after_step(event: StepEvent) -> None:
    """A step hook (trainer.step_hooks): fill HPCDL_TEST_FILL=PATH@STEP's file system."""
    path, _, step = os.environ["HPCDL_TEST_FILL"].partition("@")
    if event.global_step == int(step) and event.rank == 0:
        fill(Path(path))


def test_disk_full_during_training_keeps_the_checkpoints(hpcdl, mount_tmpfs) -> None:
    fs = mount_tmpfs(2048)
    run_dir = fs / "run"
    train = [
        f"run_dir={run_dir}",
        "trainer.max_epochs=1",  # 13 steps of the default batch size on breast_cancer
        "trainer.checkpoint_every_steps=3",
        "trainer.keep_last=2",
        f"trainer.step_hooks=[{__name__}:fill_disk_after_step]",
    ]
    env = {"PYTHONPATH": str(REPO), "HPCDL_TEST_FILL": f"{fs}@7"}
    out = hpcdl("train", *train, env=env)
    one_line_error(out, f"{run_dir}/checkpoints/step_000000009.pt", "(ENOSPC)", "intact")
    steps = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert steps == ["step_000000003.pt", "step_000000006.pt"], steps
    # What `hpcdl resume` continues from, once space is freed (tests/test_resume_exact.py).
    latest = CheckpointStore(run_dir / "checkpoints").load_latest()
    assert latest is not None and latest[1]["progress"]["global_step"] == 6


def test_disk_full_while_creating_a_sweep_leaves_nothing(hpcdl, mount_tmpfs) -> None:
    # Room for the first trial's run dir, not for the rest: no half-made sweep is left to
    # block a retry (which says "already exists") or a rerun (which finds no ledger).
    fs = mount_tmpfs(4096)  # once the filler is gone, room for the trials' checkpoints
    filler = fill(fs, pages_free=3)
    sweep = fs / "sweeps" / "s1"
    out = hpcdl("train", "-m", f"hydra.sweep.dir={sweep}", "trainer.seed=1,2,3,4,5,6", *FAST)
    one_line_error(out, str(sweep), "No space left on device (ENOSPC)")
    assert tree(fs) == ["filler"]
    filler.unlink()
    out = hpcdl("train", "-m", f"hydra.sweep.dir={sweep}", "trainer.seed=1,2", *FAST)
    assert out.returncode == EXIT_OK, out.stderr + out.stdout
    assert (sweep / "sweep.json").is_file()
