"""data=custom's fitted state (hpcdl.data.fitted_state): a train dataset with state_dict()
and load_state_dict() has its statistics saved with the model, and a resume, `evaluate`
and `predict` on new data load them into the rebuilt datasets instead of refitting.

The dataset here standardizes its features with a mean fitted on a random half of its
rows (unseeded, as a quick fit on a subsample is): a refit never gives the saved mean
again, so a dataset holding the saved one shows it was loaded. Every dataset made in this
process is kept in FEATURES.made, so the test sees the ones hpcdl built.
"""

from __future__ import annotations

import csv
import io
import textwrap
from pathlib import Path

import pytest
import torch

from hpcdl.checkpoint import read_checkpoint

FEATURES = textwrap.dedent(
    """
    import numpy as np
    import torch

    made = []  # every dataset built in this process, in order


    class Standardized(torch.utils.data.Dataset):
        def __init__(self, shift, seed, mean=None):
            rng = np.random.default_rng(seed)
            self.y = torch.as_tensor(rng.integers(0, 2, 120))
            self.x = torch.as_tensor(rng.normal(size=(120, 4)), dtype=torch.float32)
            self.x += self.y[:, None] * 2.0 + shift
            half = np.random.default_rng().permutation(120)[:60]  # unseeded: a refit differs
            self.mean = self.x[half].mean(0) if mean is None else mean
            made.append(self)

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return self.x[i] - self.mean, self.y[i]

        def state_dict(self):
            return {"mean": self.mean.clone()}

        def load_state_dict(self, state):
            self.mean = state["mean"]


    def build(shift=0.0, seed=0):
        train = Standardized(shift, seed)
        return train, Standardized(shift, seed + 1, mean=train.mean)


    class NoLoad(Standardized):
        load_state_dict = None


    def no_load():
        return NoLoad(0.0, 0), Standardized(0.0, 1)


    class NumpyState(Standardized):
        def state_dict(self):
            return {"mean": self.mean.numpy()}


    def numpy_state():
        return NumpyState(0.0, 0), Standardized(0.0, 1)
    """
)

TRAIN = [
    "data=custom", "data.target=features:build", "data.num_workers=0", "data.num_classes=2",
    "model=mlp",
]  # fmt: skip


@pytest.fixture
def features(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "features.py").write_text(FEATURES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    import features

    features.made.clear()
    yield features
    monkeypatch.delitem(__import__("sys").modules, "features")


def saved_mean(run_dir: Path, name: str = "best.pt") -> torch.Tensor:
    return read_checkpoint(run_dir / "checkpoints" / name)["data_state"]["mean"]


def test_the_fitted_mean_is_saved_and_loaded_by_resume_evaluate_and_predict(
    features, tmp_path: Path, capsys
) -> None:
    from hpcdl.cli.main import main

    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", *TRAIN, "trainer.max_epochs=1"]) == 0
    trained = features.made[-2].mean  # the training's (train, val): the probe's came first
    assert torch.equal(saved_mean(run), trained)

    # A resume refits in the rebuilt train dataset, then loads the saved mean into it and
    # into the val dataset, before any batch is read; its checkpoints keep that mean.
    features.made.clear()
    assert main(["resume", str(run), "trainer.max_epochs=2"]) == 0
    assert all(torch.equal(d.mean, trained) for d in features.made[-2:])
    step_files = sorted((run / "checkpoints").glob("step_*.pt"))
    assert torch.equal(saved_mean(run, step_files[-1].name), trained)

    # New data, 100 higher: its own fit would be 100 off; the training mean is used.
    capsys.readouterr()
    features.made.clear()
    assert main(["predict", str(run), "--split", "all", "data.kwargs.shift=100.0"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 240  # every sample of both splits the builder returns
    assert all(torch.equal(d.mean, trained) for d in features.made[-2:])
    features.made.clear()
    assert main(["evaluate", str(run), "--split", "val"]) == 0
    assert all(torch.equal(d.mean, trained) for d in features.made[-2:])

    # For the user's own inference code: the Python API hands the state over.
    from hpcdl import Job

    assert torch.equal(Job.from_run_dir(run).data_state()["mean"], trained)
    assert torch.equal(Job.from_run_dir(run).data_state("newest")["mean"], trained)
    plain = tmp_path / "plain"
    assert main(["train", f"run_dir={plain}", "trainer.max_epochs=1"]) == 0
    assert Job.from_run_dir(plain).data_state() is None  # a built-in source: none


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (
            "features:no_load",
            "error: data.target='features:no_load': the train dataset (NoLoad) has state_dict() "
            "but no load_state_dict(state); define both",
        ),
        (
            "features:numpy_state",
            "error: data.target='features:numpy_state': NumpyState.state_dict()['mean']: "
            "numpy.ndarray is not weights_only-safe; store tensors, dicts, lists, tuples, str, "
            "int, float, bool or None (checkpoints are read with weights_only=True: "
            "torch.as_tensor() a numpy array",
        ),
    ],
)
def test_a_state_that_cannot_be_saved_is_refused_before_training(
    features, tmp_path: Path, capsys, target: str, message: str
) -> None:
    """Found when the data is built, not at the first checkpoint after an epoch of work."""
    from hpcdl.cli.main import main

    assert main(["train", "run_dir=run", *TRAIN, f"data.target={target}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message), err
    assert not (tmp_path / "run").exists()
