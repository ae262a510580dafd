"""Runs read from any folder: the folder a run was created from (config.yaml's workdir) is
where its job, a resume, evaluate and predict resolve its relative paths; data.path and
the other path keys hpcdl knows are absolute from the start."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hpcdl.cli.main import main
from hpcdl.config.paths import absolute, with_absolute_paths
from hpcdl.rundir import RunDir


def small_npz(folder: Path) -> Path:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 4)).astype("float32")
    np.savez(folder / "small.npz", x=x, y=(x[:, 0] > 0).astype("int64"))
    return folder / "small.npz"


def test_relative_data_paths_are_made_absolute_at_compose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcdl.cli.compose import compose_config

    (tmp_path / "data").mkdir()
    small_npz(tmp_path / "data")
    np.save(tmp_path / "labels.npy", np.zeros(60, dtype="int64"))
    (tmp_path / "runs" / "ref" / "checkpoints").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "data")
    data = ["data=files", "data.path=small.npz", "data.labels_path=../labels.npy"]
    cfg = compose_config([*data, "init_from=../runs/ref"])
    assert cfg.data.path == str(tmp_path / "data" / "small.npz")  # type: ignore[union-attr]
    assert cfg.data.labels_path == str(tmp_path / "labels.npy")  # type: ignore[union-attr]
    assert cfg.init_from == str(tmp_path / "runs" / "ref")


def test_absolute_keeps_absolute_home_and_unset_paths() -> None:
    base = Path("/work/proj")
    assert absolute("/data/x.npz", base) == "/data/x.npz"
    assert absolute("~/x.npz", base) == "~/x.npz"
    assert absolute("???", base) == "???"
    assert absolute("../x/./y.npz", base) == "/work/x/y.npz"


def test_only_the_named_keys_change() -> None:
    from hpcdl.config.schema import Config, FilesConfig

    cfg = Config(data=FilesConfig(path="a.npz", labels_path="b.npy"), init_from="r")
    out = with_absolute_paths(cfg, Path("/p"), only=frozenset({"data.labels_path"}))
    assert (out.data.path, out.data.labels_path, out.init_from) == ("a.npz", "/p/b.npy", "r")  # type: ignore[union-attr]


def test_evaluate_from_another_folder_reads_the_runs_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hpcdl train data=files data.path=small.npz`, then `cd /tmp && hpcdl evaluate RUN`."""
    proj, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    proj.mkdir(), elsewhere.mkdir()
    small_npz(proj)
    monkeypatch.chdir(proj)
    train = ["train", "data=files", "data.path=small.npz", "trainer.max_epochs=1"]
    assert main([*train, "run_dir=runs/f1", "model.hidden_sizes=[8]"]) == 0
    run = proj / "runs" / "f1"
    assert RunDir(run).load_config().data.path == str(proj / "small.npz")  # type: ignore[union-attr]
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["evaluate", str(run), "--checkpoint", "last"]) == 0
    assert "test_accuracy" in capsys.readouterr().out
