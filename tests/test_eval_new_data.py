"""`hpcdl evaluate` and `hpcdl predict --split` on other data: data.* overrides point the
run's data builder at another file for one command, with the checkpoint's preprocessing;
config.yaml and the run's own eval/ outputs stay as they were."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hpcdl.cli.main import main
from hpcdl.client import Job

# data=custom whose samples come from a .npy path among its kwargs (the label last).
SERIES = """\
import numpy as np
import torch


class Rows(torch.utils.data.Dataset):
    num_classes = 2

    def __init__(self, path):
        table = np.load(path)
        self.x = torch.tensor(table[:, :-1]).float()
        self.y = torch.tensor(table[:, -1]).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def series(path):
    return Rows(path)
"""


def table(num_rows: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(num_rows, 3))
    return np.column_stack([x, x[:, 0] > 0]).astype("float32")


def run_files(run: Path) -> dict[str, bytes]:
    """config.yaml and the eval outputs."""
    files = [run / "config.yaml", *(run / "eval").rglob("*")]
    return {str(p.relative_to(run)): p.read_bytes() for p in files if p.is_file()}


def unchanged(run: Path, before: dict[str, bytes]) -> bool:
    """Every file of `before` as it was (other data's eval folders may be new)."""
    after = run_files(run)
    return {name: after.get(name) for name in before} == before


def read_csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


@pytest.fixture(scope="module")
def custom_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A data=custom run made in proj/ from series.npy, evaluated once (eval/best/); the
    tests run in elsewhere/, which holds new.npy."""
    root = tmp_path_factory.mktemp("custom")
    lab, proj, elsewhere = root / "lab", root / "proj", root / "elsewhere"
    for folder in (lab, proj, elsewhere):
        folder.mkdir()
    (lab / "eval_series.py").write_text(SERIES)
    np.save(proj / "series.npy", table(40, 0))
    np.save(elsewhere / "new.npy", table(25, 1))
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(lab))
        mp.chdir(proj)
        data = ["data=custom", "data.target=eval_series:series", "data.kwargs.path=series.npy"]
        train = [*data, "data.num_workers=0", "trainer.max_epochs=1", "model.hidden_sizes=[4]"]
        assert main(["train", *train, "run_dir=runs/c1"]) == 0
        run = proj / "runs" / "c1"
        assert main(["evaluate", str(run)]) == 0
        mp.chdir(elsewhere)
        yield run, elsewhere


def test_custom_data_is_evaluated_and_predicted_on_a_new_file(
    custom_run: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    run, elsewhere = custom_run
    before = run_files(run)
    capsys.readouterr()
    # new.npy is the current folder's; the run's workdir (proj/) has none.
    assert main(["evaluate", str(run), "data.kwargs.path=new.npy", "--split", "all"]) == 0
    out = capsys.readouterr().out
    assert f"data: data.kwargs.path={elsewhere / 'new.npy'} (all split)" in out
    assert "(25 samples)" in out
    written = Path(out.split("written: ")[1].strip())
    assert written.parent == run / "eval" and written.name.startswith("best-all-")
    assert (written / "metrics.json").is_file()

    split = ["--split", "all", "--output", "preds.csv"]
    assert main(["predict", str(run), "data.kwargs.path=new.npy", *split]) == 0
    rows = read_csv((elsewhere / "preds.csv").read_text())
    assert [int(r["row"]) for r in rows] == list(range(25))
    assert [int(float(r["true"])) for r in rows] == table(25, 1)[:, -1].astype(int).tolist()
    # The new file split as the run's data was: 15% of 25 rows is its test split.
    capsys.readouterr()
    assert main(["predict", str(run), "data.kwargs.path=new.npy", "--split", "test"]) == 0
    assert len(read_csv(capsys.readouterr().out)) == round(0.15 * 25)
    assert unchanged(run, before)  # config.yaml and eval/best/ untouched


def test_the_python_api_evaluates_and_predicts_other_data(custom_run: tuple[Path, Path]) -> None:
    run, elsewhere = custom_run
    job = Job.from_run_dir(run)
    report = job.evaluate(overrides=["data.kwargs.path=new.npy"], split="all")
    assert report["num_all_samples"] == 25
    assert report["data_overrides"] == [f"data.kwargs.path={elsewhere / 'new.npy'}"]
    assert 0.0 <= report["all_accuracy"] <= 1.0
    rows = job.predict(split="all", overrides=["data.kwargs.path=new.npy"])
    assert len(rows) == 25
    assert set(rows[0]) == {"row", "predicted", "class_name", "probability", "true"}
    assert isinstance(rows[0]["probability"], float) and isinstance(rows[0]["predicted"], int)
    correct = sum(r["predicted"] == r["true"] for r in rows)
    assert report["all_accuracy"] == pytest.approx(correct / 25)
    # The run's own test split, as the command evaluates it.
    assert job.evaluate()["num_test_samples"] == 6


def test_an_empty_split_is_refused_naming_the_splits_that_have_samples(
    custom_run: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # 3 rows: 15% of them rounds to no test and no validation row.
    run, elsewhere = custom_run
    np.save(elsewhere / "three.npy", table(3, 2))
    capsys.readouterr()
    assert main(["evaluate", str(run), "data.kwargs.path=three.npy"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the test split of" in err, err
    assert err.strip().endswith("nothing to evaluate; evaluate --split train or --split all"), err


# A step of the user's own: cross-entropy on its batches, with no check of the labels.
STEP = """\
import torch.nn.functional as F


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y), {}
"""


def test_other_data_the_model_or_step_cannot_take_is_one_line(
    custom_run: tuple[Path, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: the step's traceback (IndexError: Target 7 is out of bounds), exit status 1.
    _, elsewhere = custom_run
    (elsewhere / "eval_step.py").write_text(STEP)
    monkeypatch.syspath_prepend(str(elsewhere))
    np.save(elsewhere / "ok.npy", table(40, 4))
    data = ["data=custom", "data.target=eval_series:series", "data.kwargs.path=ok.npy"]
    own = ["task=custom", "task.target=eval_step:step", "model.hidden_sizes=[4]"]
    run = elsewhere / "runs" / "step"
    train = [*data, *own, "data.num_workers=0", "trainer.max_epochs=1", f"run_dir={run}"]
    assert main(["train", *train]) == 0
    before = run_files(run)
    bad_labels = table(20, 3)
    bad_labels[-1, -1] = 7  # class 7 of 2, in the last row
    np.save(elsewhere / "labels7.npy", bad_labels)
    wide = np.column_stack([np.ones((20, 4)), np.zeros(20)]).astype("float32")
    np.save(elsewhere / "wide.npy", wide)  # 4 features: the model takes 3
    capsys.readouterr()
    assert main(["evaluate", str(run), "data.kwargs.path=labels7.npy", "--split", "all"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(
        "error: task.target='eval_step:step': evaluating the all split of "
        f"data.kwargs.path={elsewhere / 'labels7.npy'} failed: raised IndexError: Target 7 "
    ), err
    assert main(["evaluate", str(run), "data.kwargs.path=wide.npy"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "samples have shape (4,), the model was trained on samples of shape (3,)" in err
    assert unchanged(run, before)


@pytest.fixture(scope="module")
def files_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A data=files run on train.npz (features far from mean 0, std 1, so that a
    standardization refitted on other rows would show), evaluated once."""
    folder = tmp_path_factory.mktemp("files")
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(120, 4)) * 5 + 10).astype("float32")
    y = (x[:, 0] > 10).astype("int64")
    np.savez(folder / "train.npz", x=x, y=y)
    # Other data: 20 of the training rows, whose own mean and std are not the run's.
    np.savez(folder / "other.npz", x=x[:20], y=y[:20])
    np.save(folder / "rows.npy", x[:20])
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        train = ["data=files", "data.path=train.npz", "trainer.max_epochs=2"]
        assert main(["train", *train, "model.hidden_sizes=[8]", "run_dir=runs/f1"]) == 0
        assert main(["evaluate", "runs/f1"]) == 0
        yield folder / "runs" / "f1", folder


def test_files_data_is_evaluated_on_another_npz_with_the_training_preprocessing(
    files_run: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    run, _ = files_run
    before = run_files(run)
    capsys.readouterr()
    assert main(["evaluate", str(run), "data.path=other.npz", "--split", "all"]) == 0
    assert "(20 samples)" in capsys.readouterr().out
    assert main(["predict", str(run), "data.path=other.npz", "--split", "all"]) == 0
    on_other = read_csv(capsys.readouterr().out)
    # --input applies the checkpoint's mean/std to raw rows: the same rows, the same outputs.
    assert main(["predict", str(run), "--input", "rows.npy"]) == 0
    as_rows = read_csv(capsys.readouterr().out)
    assert [r["probability"] for r in on_other] == [r["probability"] for r in as_rows]
    assert unchanged(run, before)


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("model.hidden_sizes=[4]", "model.hidden_sizes: the model is the checkpoint's"),
        ("data.standardize=false", "cannot change data.standardize: the preprocessing is"),
        ("data.split_seed=3", "cannot change data.split_seed"),
        ("optim.lr=1.0", "optim.lr: a training setting"),
        # A misspelt key: it said "not a key of data=files that names its samples".
        ("data.label_colum=y", "unknown key of data=files; did you mean data.label_column?"),
    ],
)
def test_keys_that_cannot_apply_at_inference_are_refused(
    files_run: tuple[Path, Path], capsys: pytest.CaptureFixture[str], override: str, says: str
) -> None:
    run, _ = files_run
    before = run_files(run)
    capsys.readouterr()
    for command in (["evaluate", str(run)], ["predict", str(run), "--split", "test"]):
        assert main([*command, "data.path=other.npz", override]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {override}: ") and says in err, err
        assert err.count("\n") == 1
    assert run_files(run) == before


@pytest.fixture(scope="module")
def csv_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A data=files run on a CSV with a header (columns a, b, c and the label `kind`)."""
    folder = tmp_path_factory.mktemp("csv")
    rng = np.random.default_rng(0)
    lines = ["a,b,c,kind"]
    for row in rng.normal(size=(60, 3)):
        lines.append(",".join(f"{v:.3f}" for v in row) + ("," + ("hi" if row[0] > 0 else "lo")))
    (folder / "train.csv").write_text("\n".join(lines) + "\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        train = ["data=files", "data.path=train.csv", "data.label_column=kind"]
        assert main(["train", *train, "trainer.max_epochs=1", "run_dir=runs/t1"]) == 0
        yield folder / "runs" / "t1", folder


@pytest.mark.parametrize(
    ("header", "cells", "says"),
    [
        (
            "id,a,b,c,kind",
            "7,",
            "column 'id' not among the model's feature columns (a, b, c); every column but "
            "data.label_column='kind' is read as a feature: drop it from the file",
        ),
        (
            "a,c,kind",
            "",
            "no column 'b' in its header (a, c, kind); the model was trained on the columns "
            "a, b, c: add it",
        ),
    ],
)
def test_other_csv_data_with_another_column_is_refused_naming_it(
    csv_run: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
    header: str,
    cells: str,
    says: str,
) -> None:
    # Before, such a file was read and refused as "features of shape (2, 4) do not fit
    # the model's input_shape (3,)", naming neither the file nor the column.
    run, folder = csv_run
    num_features = header.count(",") - cells.count(",")
    rows = [cells + ",".join(["0.5"] * num_features) + ",hi", cells + "-1," * num_features + "lo"]
    other = folder / f"other-{len(header)}.csv"
    other.write_text("\n".join([header, *rows]) + "\n")
    before = run_files(run)
    capsys.readouterr()
    for command in ("evaluate", "predict"):
        assert main([command, str(run), f"data.path={other}", "--split", "all"]) == 2
        assert capsys.readouterr().err == f"error: data.path={str(other)!r}: {says}\n"
    assert run_files(run) == before


def test_other_csv_data_with_the_columns_in_another_order_is_read_by_name(
    csv_run: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # Before, the same columns in another order were refused ("give those columns, in that
    # order"); positions would have fed column c's values to the weights of column a.
    run, folder = csv_run
    with (folder / "train.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    moved = folder / "moved.csv"
    with moved.open("w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=["c", "kind", "a", "b"])
        out.writeheader()
        out.writerows(rows)
    predictions = []
    for path in (folder / "train.csv", moved):
        capsys.readouterr()
        assert main(["predict", str(run), "--split", "all", f"data.path={path}"]) == 0
        predictions.append(capsys.readouterr().out)
    assert predictions[0] == predictions[1] and predictions[0].count("\n") == 61


def test_feature_columns_leave_ids_out_in_training_evaluate_predict_and_resume(
    hpcdl, tmp_path: Path
) -> None:
    """data.feature_columns: an ID and a note column stay in the file, unread by training,
    `evaluate` of the file and `predict --input`; a resume with the columns in another
    order (the weights are per position) is refused."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 3))
    y = (x[:, 0] - x[:, 1] > 0).astype(int)
    rows = [f"{1000 + i},{x[i, 0]},note,{y[i]},{x[i, 1]},{x[i, 2]}" for i in range(120)]
    (tmp_path / "d.csv").write_text("id,a,memo,label,b,c\n" + "\n".join(rows) + "\n")
    (tmp_path / "new.csv").write_text(
        "c,id,b,a\n" + "".join(f"{x[i, 2]},{i},{x[i, 1]},{x[i, 0]}\n" for i in range(5))
    )
    (tmp_path / "plain.csv").write_text(
        "a,b,c\n" + "".join(f"{x[i, 0]},{x[i, 1]},{x[i, 2]}\n" for i in range(5))
    )
    data = ["data=files", "data.path=d.csv", "data.feature_columns=[a,b,c]"]
    out = hpcdl("train", *data, "trainer.max_epochs=2", "run_dir=r")
    assert out.returncode == 0, out.stderr
    out = hpcdl("evaluate", "r", "--split", "all", "data.path=d.csv")
    assert out.returncode == 0 and "(120 samples)" in out.stdout, out.stderr
    with_id = hpcdl("predict", "r", "--input", "new.csv")
    plain = hpcdl("predict", "r", "--input", "plain.csv")
    assert with_id.returncode == plain.returncode == 0, with_id.stderr + plain.stderr
    assert with_id.stdout == plain.stdout and len(plain.stdout.splitlines()) == 6
    # A split's `row` is the sample's row in the file: it joins the predictions to its IDs.
    out = hpcdl("predict", "r", "--split", "test")
    assert out.returncode == 0, out.stderr
    predicted = read_csv(out.stdout)
    places = [int(r["row"]) for r in predicted]
    assert len(places) == round(0.15 * 120) and places != list(range(len(places)))
    assert places == sorted(set(places)) and max(places) < 120
    assert [int(r["true"]) for r in predicted] == [y[i] for i in places]
    out = hpcdl("resume", "r", "data.feature_columns=[b,a,c]", "trainer.max_epochs=3")
    assert out.returncode == 2 and "trained on 'data.feature_columns=[a,b,c]'" in out.stderr


def test_a_bare_name_here_that_the_run_reads_elsewhere_is_said(
    custom_run: tuple[Path, Path], capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    # `heldout` (no folder part, no suffix) is passed as typed: the data function reads it
    # in the run's workdir (proj/), not here, where a folder of that name is the one meant.
    run, elsewhere = custom_run
    monkeypatch.chdir(elsewhere)
    (elsewhere / "heldout").mkdir(exist_ok=True)
    capsys.readouterr()
    main(["evaluate", str(run), "data.kwargs.path=heldout", "--split", "all"])
    err = capsys.readouterr().err
    assert (
        f"data.kwargs.path='heldout': a bare name is passed as typed, and your data function "
        f"reads it in the run's workdir ({run.parent.parent}), not here, where ./heldout is "
        "another; for the one here write data.kwargs.path=./heldout"
    ) in err, err
