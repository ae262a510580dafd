"""R3 (bad input) and R5 (crafted checkpoints): the cases, each a command on a folder
prepared for it. `run` in a case's argv is a finished tiny run (1 epoch, breast cancer)
copied in fresh for the case."""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

Setup = Callable[[Path], None]


@dataclass(frozen=True)
class Case:
    id: str
    scenario: str  # "R3" or "R5"
    argv: tuple[str, ...]
    expect: str  # must appear in the one error line
    setup: Setup = field(default=lambda _: None)
    needs_run: bool = False  # copy the prepared run into ./run first
    marker: str = ""  # a file crafted input would create if it ran code: must not exist
    # A case whose right outcome is to go on (a crafted checkpoint among valid ones is
    # skipped with a warning): its exit status, and the folder may change.
    exit_code: int = 2


def _npz(name: str, x: np.ndarray, y: np.ndarray) -> Setup:
    return lambda d: np.savez(d / name, x=x, y=y)


def _text(name: str, text: str) -> Setup:
    return lambda d: (d / name).write_text(text)


def _bytes(name: str, data: bytes) -> Setup:
    return lambda d: (d / name).write_bytes(data)


X = np.random.default_rng(0).normal(size=(40, 4)).astype("float32")
Y = np.arange(40) % 2


class _RunsCode:
    """Unpickling this creates the marker file: what a crafted file would do."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (Path.touch, (Path(self.target),))


def _evil_torch_file(name: str) -> Setup:
    def make(d: Path) -> None:
        import torch

        buffer = io.BytesIO()
        torch.save({"model": {}, "evil": _RunsCode(str(d / "pwned"))}, buffer)
        (d / name).write_bytes(buffer.getvalue())

    return make


def _evil_cifar(d: Path) -> None:
    folder = d / "cifar"
    folder.mkdir()
    good = {b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]}
    for i in range(1, 6):
        (folder / f"data_batch_{i}").write_bytes(pickle.dumps(good, protocol=2))
    (folder / "test_batch").write_bytes(pickle.dumps(_RunsCode(str(d / "pwned")), protocol=2))


def _into_run(name: str, make: Setup) -> Setup:
    """A crafted file placed as the run's newest checkpoint."""

    def setup(d: Path) -> None:
        make(d)
        (d / name).rename(d / "run" / "checkpoints" / "step_999999999.pt")

    return setup


def _broken_yaml(d: Path) -> None:
    (d / "mine" / "model").mkdir(parents=True)
    (d / "mine" / "model" / "foo.yaml").write_text("name: mlp\nhidden: [16, 8\n")


def _remove_checkpoints(d: Path) -> None:
    """A run with two epochs on record whose checkpoints are gone."""
    for path in (d / "run" / "checkpoints").iterdir():
        path.unlink()
    metrics = d / "run" / "metrics.csv"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([*lines, "2" + lines[-1][1:]]) + "\n")


T = ("train",)
FAST = ("trainer.max_epochs=1",)

CASES: list[Case] = [
    # ---------------------------------------------------------------- config keys
    Case("epochs-zero", "R3", (*T, "trainer.max_epochs=0"), "trainer.max_epochs"),
    Case("epochs-text", "R3", (*T, "trainer.max_epochs=abc"), "trainer.max_epochs"),
    Case("batch-negative", "R3", (*T, "trainer.batch_size=-1"), "trainer.batch_size"),
    Case("lr-negative", "R3", (*T, "optim.lr=-1"), "optim.lr"),
    Case("model-unknown", "R3", (*T, "model=nope"), "model=nope"),
    Case("data-unknown", "R3", (*T, "data=nope"), "data=nope"),
    Case("schedule-unknown", "R3", (*T, "schedule=nope"), "schedule=nope"),
    Case("cluster-unknown", "R3", (*T, "cluster=nope"), "cluster=nope"),
    Case("key-unknown", "R3", (*T, "trainer.nope=1"), "trainer.nope"),
    Case("top-key-unknown", "R3", (*T, "nope=1"), "nope"),
    Case("precision-unknown", "R3", (*T, "trainer.precision=fp8"), "trainer.precision"),
    Case("override-no-value", "R3", (*T, "trainer.max_epochs"), "trainer.max_epochs"),
    Case("override-bad-syntax", "R3", (*T, "model.hidden=[1,2"), "model.hidden"),
    Case("monitor-unknown", "R3", (*T, "trainer.early_stopping.monitor=val_nope"), "monitor"),
    Case("val-fraction", "R3", (*T, "data.val_fraction=1.5"), "data.val_fraction"),
    Case("debug-two-nodes", "R3", (*T, "cluster.nodes=2"), "cluster.nodes"),
    Case("debug-two-ranks", "R3", (*T, "cluster.tasks_per_node=2"), "cluster.tasks_per_node"),
    Case("regression-on-classes", "R3", (*T, "task=regression", "data=digits"), "task=regression"),
    Case("init-from-missing", "R3", (*T, "init_from=nowhere"), "nowhere"),
    Case("stall-timeout-zero", "R3", (*T, "trainer.stall_timeout_s=0"), "trainer.stall_timeout_s"),
    # ---------------------------------------------------------------- user code
    Case("model-target-missing", "R3", (*T, "model=custom"), "model.target"),
    Case("model-target-module", "R3", (*T, "model=custom", "model.target=nomodule:X"), "nomodule"),
    Case("data-target-attr", "R3", (*T, "data=custom", "data.target=os:nope"), "data.target"),
    Case("task-target-form", "R3", (*T, "task=custom", "task.target=no_colon"), "task.target"),
    # ---------------------------------------------------------------- data files
    Case("files-missing", "R3", (*T, "data=files", "data.path=none.npz"), "none.npz"),
    Case(
        "files-corrupt-npz",
        "R3",
        (*T, "data=files", "data.path=bad.npz", *FAST),
        "bad.npz",
        setup=_bytes("bad.npz", b"PK\x03\x04 this is not a zip archive"),
    ),
    Case(
        "files-nan",
        "R3",
        (*T, "data=files", "data.path=nan.npz", *FAST),
        "NaN",
        setup=_npz("nan.npz", np.where(np.arange(160).reshape(40, 4) == 7, np.nan, X), Y),
    ),
    Case(
        "files-short-labels",
        "R3",
        (*T, "data=files", "data.path=d.npz", *FAST),
        "39 labels",
        setup=_npz("d.npz", X, Y[:39]),
    ),
    Case(
        "files-stray-label",
        "R3",
        (*T, "data=files", "data.path=d.npz", *FAST),
        "label 7",
        setup=_npz("d.npz", X, np.where(np.arange(40) == 3, 7, Y)),
    ),
    Case(
        "csv-text-cell",
        "R3",
        (*T, "data=files", "data.path=t.csv", *FAST),
        "t.csv",
        setup=_text("t.csv", "a,b,label\n1,2,0\n3,x,1\n" + "1,2,0\n3,4,1\n" * 20),
    ),
    Case(
        "csv-empty",
        "R3",
        (*T, "data=files", "data.path=e.csv", *FAST),
        "e.csv",
        setup=_text("e.csv", ""),
    ),
    Case(
        "npy-no-labels",
        "R3",
        (*T, "data=files", "data.path=x.npy", *FAST),
        "labels_path",
        setup=lambda d: np.save(d / "x.npy", X),
    ),
    Case("mnist-missing", "R3", (*T, "data=mnist", "data.path=nomnist", *FAST), "nomnist"),
    # ---------------------------------------------------------------- cluster profiles
    Case(
        "gpus-negative",
        "R3",
        (*T, "cluster=rivanna_a100", "cluster.gpus_per_node=-1", "--dry-run"),
        "cluster.gpus_per_node",
    ),
    Case(
        "time-zero",
        "R3",
        (*T, "cluster=rivanna_a100", "cluster.timeout_min=0", "--dry-run"),
        "cluster.timeout_min",
    ),
    Case(
        "signal-after-limit",
        "R3",
        (
            *T,
            "cluster=rivanna_a100",
            "cluster.timeout_min=1",
            "cluster.signal_delay_s=90",
            "--dry-run",
        ),
        "cluster.signal_delay_s",
    ),
    Case(
        "requeue-mode",
        "R3",
        (*T, "cluster=rivanna_a100", "cluster.requeue=again", "--dry-run"),
        "cluster.requeue",
    ),
    Case(
        "container-runtime",
        "R3",
        (*T, "cluster=rivanna_a100", "cluster.container.runtime=docker", "--dry-run"),
        "cluster.container.runtime",
    ),
    Case("container-on-debug", "R3", (*T, "cluster.container.image=x.sif"), "container"),
    Case("dry-run-debug", "R3", (*T, "--dry-run"), "--dry-run"),
    # ---------------------------------------------------------------- run dirs
    Case("run-dir-exists", "R3", (*T, "run_dir=run", *FAST), "already exists", needs_run=True),
    Case("run-dir-is-file", "R3", (*T, "run_dir=f", *FAST), "is a file", setup=_text("f", "x")),
    Case("run-dir-under-file", "R3", (*T, "run_dir=f/x", *FAST), "f", setup=_text("f", "x")),
    Case("resume-missing", "R3", ("resume", "nowhere"), "nowhere"),
    Case("resume-file", "R3", ("resume", "f"), "f", setup=_text("f", "x")),
    Case(
        "resume-lost-checkpoints",
        "R3",
        ("resume", "run", "trainer.max_epochs=3"),
        "--from-scratch",
        needs_run=True,
        setup=_remove_checkpoints,
    ),
    Case("evaluate-missing", "R3", ("evaluate", "nowhere"), "nowhere"),
    Case("status-missing", "R3", ("status", "nowhere"), "nowhere"),
    Case("sweep-status-missing", "R3", ("sweep", "status", "nowhere"), "nowhere"),
    Case("sweep-rerun-file", "R3", ("sweep", "rerun", "f", "--failed"), "f", setup=_text("f", "x")),
    Case("config-dir-missing", "R3", (*T, "--config-dir", "nodir"), "nodir"),
    Case(
        "config-dir-broken-yaml",
        "R3",
        (*T, "--config-dir", "mine", "model=foo"),
        "foo.yaml",
        setup=_broken_yaml,
    ),
    # ---------------------------------------------------------------- evaluate / predict
    Case(
        "evaluate-checkpoint-missing",
        "R3",
        ("evaluate", "run", "--checkpoint", "no.pt"),
        "no.pt",
        needs_run=True,
    ),
    Case(
        "predict-input-missing",
        "R3",
        ("predict", "run", "--input", "no.csv"),
        "no.csv",
        needs_run=True,
    ),
    Case(
        "predict-wrong-width",
        "R3",
        ("predict", "run", "--input", "w.csv"),
        "w.csv",
        needs_run=True,
        setup=_text("w.csv", "1,2,3\n4,5,6\n"),
    ),
    Case(
        "predict-output-is-input",
        "R3",
        ("predict", "run", "--input", "r.csv", "--output", "r.csv"),
        "r.csv",
        needs_run=True,
        setup=_text("r.csv", ",".join(["0.5"] * 30) + "\n"),
    ),
    Case(
        "predict-output-run-file",
        "R3",
        ("predict", "run", "--split", "test", "--output", "run/config.yaml"),
        "run/config.yaml",
        needs_run=True,
    ),
    Case("fold-out-of-range", "R3", (*T, "data.num_folds=3", "data.fold=5"), "data.fold"),
    # ---------------------------------------------------------------- scripts
    Case("run-missing-script", "R3", ("run", "--", "python", "nothere.py"), "nothere.py"),
    Case("run-entry-missing", "R3", ("run", "entry=nomod:fn"), "nomod"),
    Case(
        "run-torchrun-debug",
        "R3",
        ("run", "launcher=torchrun", "--", "python", "s.py"),
        "torchrun",
        setup=_text("s.py", "print(1)\n"),
    ),
    # ---------------------------------------------------------------- R5 crafted files
    Case(
        "cifar-crafted",
        "R5",
        (*T, "data=cifar10", "data.path=cifar", *FAST),
        "refused",
        setup=_evil_cifar,
        marker="pwned",
    ),
    Case(
        "evaluate-crafted",
        "R5",
        ("evaluate", "run", "--checkpoint", "evil.pt"),
        "evil.pt",
        needs_run=True,
        setup=_evil_torch_file("evil.pt"),
        marker="pwned",
    ),
    Case(
        "predict-crafted",
        "R5",
        ("predict", "run", "--checkpoint", "evil.pt", "--split", "test"),
        "evil.pt",
        needs_run=True,
        setup=_evil_torch_file("evil.pt"),
        marker="pwned",
    ),
    Case(
        "init-from-crafted",
        "R5",
        (*T, "init_from=evil.pt", *FAST),
        "evil.pt",
        setup=_evil_torch_file("evil.pt"),
        marker="pwned",
    ),
    Case(
        "resume-crafted",
        "R5",
        ("resume", "run", "trainer.max_epochs=2"),
        "",
        needs_run=True,
        setup=_into_run("evil.pt", _evil_torch_file("evil.pt")),
        marker="pwned",
        exit_code=0,
    ),
]
