"""Trackers (logger=tensorboard, wandb, mlflow) continue one tracker run across attempts.

The end-to-end tests interrupt real `hpcdl` processes with real signals (tests/fault_hook.py)
and resume them, then read what each tracker wrote back with its own reader: TensorBoard's
EventAccumulator, the records of W&B's offline files, MLflow's client on the file store.
The W&B and MLflow runs are made without a network (`unshare -n`: only a loopback, down).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Optional

import pytest

from hpcdl.config.schema import LoggerConfig
from hpcdl.rundir import RunDir, SweepDir
from hpcdl.trackers.base import ConfigRecord, TrackerStart
from hpcdl.trackers.logger import TrackerLogger, run_name
from tests import fault_hook
from tests.conftest import REPO, run_hpcdl

# Breast cancer MLP: 13 steps per epoch at batch 32 on 1 rank, 52 steps in all; the train
# loss of every step goes to the trackers (log_every_steps=1).
BASE = ["trainer.max_epochs=4", "trainer.checkpoint_every_steps=5", "trainer.log_every_steps=1"]
ALL_STEPS = list(range(1, 53))
EPOCH_ENDS = [13, 26, 39, 52]


def train(run_dir: Path, extra: list[str], fault: Optional[str], *, offline: bool = False):
    hook = [fault_hook.OVERRIDE] if fault else []
    args = ["train", f"run_dir={run_dir}", *BASE, *extra, *hook]
    return hpcdl_cmd(args, run_dir.parent, fault, offline=offline)


def resume(run_dir: Path, *, offline: bool = False):
    return hpcdl_cmd(["resume", str(run_dir)], run_dir.parent, None, offline=offline)


def hpcdl_cmd(args: list[str], cwd: Path, fault: Optional[str], *, offline: bool):
    if not offline:
        return run_hpcdl(*args, cwd=cwd, env=fault_hook.env(fault))
    # A network namespace of its own: no interface but a loopback that is down.
    command = ["unshare", "-n", sys.executable, "-m", "hpcdl.cli.main", *args]
    env = {**os.environ, **fault_hook.env(fault)}
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


# ----------------------------------------------------------------------------- TensorBoard
def scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # 0: keep all
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


@pytest.fixture(scope="module")
def tensorboard_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    out = train(run_dir, ["logger=tensorboard"], None)
    assert out.returncode == 0, out.stderr + out.stdout
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault",
    [
        "SIGTERM@7",  # mid-epoch: stops with a checkpoint at step 8
        pytest.param(  # no handler: steps 11 and 12 were logged after the checkpoint at 10
            "SIGKILL@13", marks=pytest.mark.extended
        ),
    ],
)
def test_tensorboard_shows_each_step_once_after_a_resume(tmp_path, tensorboard_reference, fault):
    run_dir = tmp_path / "run"
    first = train(run_dir, ["logger=tensorboard"], fault)
    assert first.returncode == (3 if fault.startswith("SIGTERM") else -9), first.stderr
    logged = [step for step, _ in scalars(run_dir / "tensorboard", "step/train_loss")]
    assert logged == list(range(1, 9 if fault == "SIGTERM@7" else 13))  # then it stopped
    final = resume(run_dir)
    assert final.returncode == 0, final.stderr + final.stdout
    assert "tensorboard --logdir" in final.stdout

    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 2  # one dir
    reference = tensorboard_reference / "tensorboard"
    losses = scalars(run_dir / "tensorboard", "step/train_loss")
    assert [step for step, _ in losses] == ALL_STEPS  # each step once, in order
    assert losses == scalars(reference, "step/train_loss")  # and the uninterrupted values
    for tag in ("epoch/train_loss", "epoch/val_accuracy", "epoch/lr", "epoch/samples_per_s"):
        assert [step for step, _ in scalars(run_dir / "tensorboard", tag)] == EPOCH_ENDS, tag
    assert scalars(run_dir / "tensorboard", "epoch/val_loss") == scalars(
        reference, "epoch/val_loss"
    )
    assert [s for s, _ in scalars(run_dir / "tensorboard", "summary/test_accuracy")] == [52]


def test_the_gradient_norm_of_each_logged_step_is_the_one_the_optimizer_used(tmp_path):
    # Plain SGD (no momentum, no decay, constant lr): a step moves the weights by lr times
    # the gradient, so each step's norm can be read back from two checkpoints in a row.
    run_dir, lr = tmp_path / "run", 0.05
    out = run_hpcdl(
        "train", f"run_dir={run_dir}", "trainer.max_epochs=1", "trainer.log_every_steps=2",
        "trainer.checkpoint_every_steps=1", "trainer.keep_last=20", f"optim.lr={lr}",
        "optim.momentum=0", "logger=tensorboard", cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    norms = dict(scalars(run_dir / "tensorboard", "step/grad_norm"))
    assert sorted(norms) == list(range(2, 14, 2))  # the steps the tracker keeps, only
    from hpcdl.checkpoint import read_checkpoint

    def weights(step: int) -> list:
        path = run_dir / "checkpoints" / f"step_{step:09d}.pt"
        return list(read_checkpoint(path)["model"].values())

    for step, logged in norms.items():
        moved = [
            (a - b).double().norm() for a, b in zip(weights(step - 1), weights(step), strict=True)
        ]
        expected = float(sum(m**2 for m in moved) ** 0.5) / lr
        assert logged == pytest.approx(expected, rel=1e-4), step
    # With trainer.grad_clip_norm the norm is clip_grad_norm_'s own (before clipping): with
    # a limit no step reaches, the same run and the same norms.
    clipped = tmp_path / "clipped"
    out = run_hpcdl(
        "train", f"run_dir={clipped}", "trainer.max_epochs=1", "trainer.log_every_steps=2",
        f"optim.lr={lr}", "optim.momentum=0", "trainer.grad_clip_norm=1e6",
        "logger=tensorboard", "trainer.max_steps=4", cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    again = scalars(clipped / "tensorboard", "step/grad_norm")
    assert again == [(2, pytest.approx(norms[2], rel=1e-6)), (4, pytest.approx(norms[4], rel=1e-6))]


@pytest.mark.slow
def test_only_rank_0_writes_to_the_tracker(tmp_path):
    run_dir = tmp_path / "run"
    out = run_hpcdl(
        "train",
        f"run_dir={run_dir}",
        "trainer.max_epochs=1",
        "trainer.log_every_steps=1",
        "logger=tensorboard",
        "cluster=local",
        "cluster.tasks_per_node=2",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr + out.stdout
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 1
    losses = scalars(run_dir / "tensorboard", "step/train_loss")
    assert [step for step, _ in losses] == list(range(1, 14))  # each step once, not twice


# ----------------------------------------------------------------------------- W&B, MLflow
def wandb_records(path: Path) -> list[Any]:
    """The protobuf records of a W&B offline file (.wandb): a 7-byte header, then LevelDB's
    log format (32 KiB blocks of chunks: crc32 4, length 2, type 1 = full, 2 first,
    3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B offline file"
    block, pos, pending, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header: padding
            pos += block - pos % block
            continue
        length = int.from_bytes(data[pos + 4 : pos + 6], "little")
        kind = data[pos + 6]
        if kind == 0:
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_attempt(folder: Path) -> tuple[str, list[int]]:
    """(run id, history steps) of one offline-run folder."""
    (path,) = folder.glob("*.wandb")
    run_id, steps = "", []
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
        elif kind == "history":
            # Newer W&B versions put the key in nested_key (one element for a flat key).
            items = {
                item.key or "/".join(item.nested_key): item.value_json
                for item in record.history.item
            }
            if "step/train_loss" in items:
                steps.append(int(items["_step"]))
    return run_id, steps


@pytest.mark.slow
def test_wandb_and_mlflow_continue_one_run_across_sigterm_offline(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    first = train(run_dir, ["logger=[wandb,mlflow]"], "SIGTERM@7", offline=True)
    assert first.returncode == 3, first.stderr + first.stdout
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    ids = json.loads((run_dir / "trackers.json").read_text())
    assert ids["last_step"] == 8  # sent up to the stop; a resume continues after it
    assert client.get_run(ids["mlflow"]["run_id"]).info.status == "KILLED"
    final = resume(run_dir, offline=True)
    assert final.returncode == 0, final.stderr + final.stdout
    record = json.loads((run_dir / "trackers.json").read_text())
    wandb_id, mlflow_id = record["wandb"]["id"], record["mlflow"]["run_id"]
    assert (wandb_id, mlflow_id) == (ids["wandb"]["id"], ids["mlflow"]["run_id"])

    # W&B: one offline folder per attempt, both of the one run; the steps continue.
    folders = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert [f.name.rsplit("-", 1)[1] for f in folders] == [wandb_id, wandb_id]
    (id1, steps1), (id2, steps2) = (wandb_attempt(f) for f in folders)
    assert id1 == id2 == wandb_id
    assert steps1 == list(range(1, 9)) and steps2 == list(range(9, 53))
    assert f"wandb sync {run_dir}/wandb/offline-run-*-{wandb_id}" in final.stdout

    # MLflow: the file store in the run dir holds that one run, finished, each step once.
    run = client.get_run(mlflow_id)
    assert run.info.status == "FINISHED"
    (experiment,) = [e for e in client.search_experiments() if e.name == "hpcdl"]
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [mlflow_id]
    history = client.get_metric_history(mlflow_id, "step/train_loss")
    assert sorted(m.step for m in history) == ALL_STEPS
    epochs = sorted(
        (m.step, m.value) for m in client.get_metric_history(mlflow_id, "epoch/train_loss")
    )
    rows = RunDir(run_dir).metrics.read()
    assert epochs == [(row["step"], row["train_loss"]) for row in rows]
    assert run.data.params["trainer.max_epochs"] == "4"
    assert run.data.tags["hpcdl.run_dir"] == str(run_dir)
    assert "summary/test_accuracy" in run.data.metrics


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("tracker", ["tensorboard", "wandb", "mlflow"])
def test_a_missing_tracker_package_is_refused_before_the_run_dir(
    tmp_path, monkeypatch, capsys, tracker
):
    from hpcdl.cli.main import main

    monkeypatch.setitem(sys.modules, tracker, None)  # importlib's "not installed"
    run_dir = tmp_path / "run"
    assert main(["train", f"run_dir={run_dir}", f"logger=[tensorboard,{tracker}]"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: logger={tracker}: the {tracker} package is not installed; "
        f"pip install 'hpcdl[{tracker}]' (in a checkout: pip install -e '.[{tracker}]')\n"
    )
    assert not run_dir.exists()


def test_choosing_trackers_imports_none_on_the_login_node() -> None:
    code = (
        "import sys; from hpcdl.cli.compose import compose_config; "
        "cfg = compose_config(['logger=[tensorboard,wandb,mlflow]']); "
        "print(cfg.logger.chosen(), sorted(m for m in ('torch', 'tensorboard', 'wandb', "
        "'mlflow') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "['tensorboard', 'wandb', 'mlflow'] []"


# ----------------------------------------------------------------------------- config
def test_csv_is_the_default_and_adds_nothing() -> None:
    from hpcdl.cli.compose import compose_config

    assert compose_config([]).logger == LoggerConfig()
    assert compose_config(["logger=csv"]).logger.chosen() == []


def test_several_trackers_from_one_override_and_their_keys() -> None:
    from hpcdl.cli.compose import apply_overrides, compose_config
    from hpcdl.errors import ConfigError

    cfg = compose_config(["logger=[tensorboard,wandb]", "logger.wandb.project=mnist"])
    assert cfg.logger.chosen() == ["tensorboard", "wandb"]
    assert cfg.logger.wandb.project == "mnist" and cfg.logger.wandb.mode.value == "offline"
    resumed = apply_overrides(cfg, ["logger=[mlflow]"])  # resume: the group is replaced
    assert resumed.logger.chosen() == ["mlflow"]
    with pytest.raises(
        ConfigError,
        match=r"logger\.wandb\.projct: unknown key; did you mean logger\.wandb\.project\?",
    ):
        compose_config(["logger=wandb", "logger.wandb.projct=x"])


# ----------------------------------------------------------------------------- TrackerLogger
class FakeTracker:
    name: ClassVar[str] = "fake"
    rewrites_on_resume: ClassVar[bool] = False

    def __init__(self, fail_at: Optional[int] = None) -> None:
        self.opened: list[TrackerStart] = []
        self.described: list[Optional[ConfigRecord]] = []
        self.logged: list[int] = []
        self.ended: list[str] = []
        self.fail_at = fail_at

    def open(self, start: TrackerStart) -> dict[str, Any]:
        self.opened.append(start)
        return start.identity or {"id": f"{self.name}-1"}

    def describe(self, config: Optional[ConfigRecord], provenance: Mapping[str, Any]) -> None:
        self.described.append(config)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        if step == self.fail_at:
            raise OSError("server gone")
        self.logged.append(step)

    def flush(self) -> None:
        pass

    def finish(self, step: int, summary: Mapping[str, float]) -> None:
        self.ended.append("finished")

    def close(self, *, failed: bool) -> None:
        self.ended.append("failed" if failed else "closed")

    def hint(self) -> Optional[str]:
        return None


class FakeRewritingTracker(FakeTracker):
    name: ClassVar[str] = "rewriting"
    rewrites_on_resume: ClassVar[bool] = True


def test_a_resumed_attempt_sends_no_step_twice_and_the_config_once(tmp_path) -> None:
    from hpcdl.cli.compose import compose_config

    cfg = compose_config([])
    run_dir = RunDir(tmp_path)
    keeping, rewriting = FakeTracker(), FakeRewritingTracker()
    logger = TrackerLogger([keeping, rewriting], log_every_steps=1, provenance={"job_id": None})
    logger.start(cfg, run_dir, resumed_step=0)
    for step in range(1, 13):
        logger.log_step(step, {"train_loss": 0.5})
    logger.close()  # interrupted after step 12 ...
    assert run_dir.read_trackers()["last_step"] == 12

    keeping, rewriting = FakeTracker(), FakeRewritingTracker()
    logger = TrackerLogger([keeping, rewriting], log_every_steps=1, provenance={})
    logger.start(cfg, run_dir, resumed_step=10)  # ... resumed from the checkpoint at 10
    assert keeping.opened[0].identity == {"id": "fake-1"}  # the stored identity
    assert keeping.described == [None]  # the config is unchanged: not sent again
    for step in range(11, 15):
        logger.log_step(step, {"train_loss": 0.5})
    assert keeping.logged == [13, 14]  # 11 and 12 are in the tracker already
    assert rewriting.logged == [11, 12, 13, 14]  # TensorBoard purges and rewrites them
    logger.finish({"steps": 14, "test_accuracy": 0.9, "outcome": "completed"})
    assert keeping.ended == ["finished"]


def test_a_tracker_that_fails_mid_run_is_dropped_and_training_goes_on(tmp_path, capsys):
    from hpcdl.cli.compose import compose_config

    broken, healthy = FakeTracker(fail_at=3), FakeRewritingTracker()
    logger = TrackerLogger([broken, healthy], log_every_steps=2, provenance={})
    logger.start(compose_config([]), RunDir(tmp_path), resumed_step=0)
    for step in range(1, 4):
        logger.log_step(step, {"train_loss": 0.5})
    logger.log_epoch(3, {"epoch": 1, "step": 3, "train_loss": 0.4, "val_loss": None})
    for step in range(4, 7):
        logger.log_step(step, {"train_loss": 0.5})
    assert broken.logged == [2] and healthy.logged == [2, 3, 4, 6]
    assert "logger.fake: server gone; training goes on without it" in capsys.readouterr().out


def test_a_sweep_trial_is_named_and_grouped_by_its_sweep(tmp_path) -> None:
    sweep = SweepDir(tmp_path / "sweep1")
    sweep.path.mkdir()
    sweep.ledger_file.write_text("{}")
    assert run_name(sweep.trial(3)) == ("sweep1/3", "sweep1")
    assert run_name(RunDir(tmp_path / "exp1")) == ("exp1", None)


def test_mlflow_file_store_leaves_the_callers_environment_as_it_was(tmp_path, monkeypatch):
    """An in-process run (a notebook's) with logger=mlflow used to leave
    MLFLOW_ALLOW_FILE_STORE=true in the caller's os.environ; the run still logs into its
    run dir's file store, which MLflow refuses without that variable."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from hpcdl.config.schema import MlflowConfig
    from hpcdl.trackers.base import TrackerStart
    from hpcdl.trackers.mlflow import MlflowTracker

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    run_dir = RunDir(tmp_path)
    tracker = MlflowTracker(MlflowConfig())
    identity = tracker.open(TrackerStart(run_dir, None, 0, "run", None))
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ
    tracker.log(1, {"step/train_loss": 0.5})  # the store MLflow made while it was set
    tracker.finish(1, {"test_accuracy": 0.9})
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=run_dir.mlflow_store.resolve().as_uri())
    run = client.get_run(identity["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.metrics == {"step/train_loss": 0.5, "summary/test_accuracy": 0.9}
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "false")  # the caller's own value: kept
    MlflowTracker(MlflowConfig()).open(TrackerStart(RunDir(tmp_path / "b"), None, 0, "b", None))
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "false"
