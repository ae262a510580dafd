"""`hpcdl evaluate` and `hpcdl predict`: a model rebuilt from a checkpoint, no code by hand."""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from hpcdl.atomic import write_atomic, write_json_atomic
from hpcdl.checkpoint import BEST_NAME, read_checkpoint, resolve_checkpoint
from hpcdl.config.convert import model_from_dict
from hpcdl.config.schema import (
    Config,
    CustomDataConfig,
    CustomTaskConfig,
    FilesConfig,
    ImageFolderConfig,
    RegressionTaskConfig,
    numeric_targets,
)
from hpcdl.data import DataSplits, Preprocessing, build_data, load_feature_rows
from hpcdl.data.feed import EVAL_BATCH_SIZE, Feed, TensorFeed, build_feed
from hpcdl.data.files import csv_column, csv_header
from hpcdl.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    HpcdlError,
    WriteError,
    os_error_reason,
    raised,
)
from hpcdl.evaluation import evaluate, load_matching_weights
from hpcdl.models import build_model
from hpcdl.plots import plot_confusion_matrix, plot_predicted_vs_true
from hpcdl.resume_from import checkpoint_listing
from hpcdl.rundir import RUN_DIR_LAYOUT, RunDir
from hpcdl.tasks import (
    CustomPrediction,
    RegressionTask,
    build_prediction,
    build_task,
    input_and_target,
)

# `--split all`: every sample the data builder gives (the train, val and test splits of
# the data read with val_fraction=test_fraction=0, in that order: a file's rows in order).
ALL_SPLIT = "all"


def _model_from_checkpoint(state: dict[str, Any], source: str) -> nn.Module:
    info = state["data_info"]
    model = build_model(
        model_from_dict(state["model_config"]), tuple(info["input_shape"]), int(info["num_classes"])
    )
    load_matching_weights(model, state["model"], source)
    model.eval()
    return model


def _checkpoint_for(run_dir: RunDir, which: str) -> Path:
    """--checkpoint best | last (or newest) | PATH, or the name of a file in the run's
    checkpoints/ folder (step_000000390.pt); anything else is refused listing those."""
    if which in ("best", "last", "newest"):
        folder = run_dir.checkpoint_dir
        if not folder.is_dir() or not any(folder.glob("*.pt")):  # it said: no best.pt in RUN_DIR
            raise CheckpointError(
                f"{run_dir.path}: no checkpoint in {folder}: the run has saved none (not "
                f"started yet, or it ended before its first save; `hpcdl status {run_dir.path}` "
                "says how it ended)"
            )
        if which == "best" and not (folder / BEST_NAME).is_file():
            raise CheckpointError(
                f"{run_dir.path}: no {BEST_NAME} in {folder} (a run saves it at its best "
                "validated epoch: this one has no validation split, none so far, or it went "
                "on from a checkpoint older than its run's best.pt (hpcdl resume --from) and "
                "has not beaten that best yet); use its newest checkpoint: --checkpoint last"
            )
        return resolve_checkpoint(run_dir.path, "best" if which == "best" else "last")
    given = Path(which).expanduser()
    in_run = run_dir.checkpoint_dir / which
    if not given.exists() and in_run.is_file():
        return in_run
    if not given.exists():
        raise CheckpointError(
            f"{which}: no such checkpoint file, nor one in {run_dir.checkpoint_dir} "
            f"({checkpoint_listing(run_dir)}); give best, last (or newest), one of those "
            "names, or a checkpoint file's path"
        )
    return resolve_checkpoint(given)


def load_model(cfg: Config, run_dir: RunDir, which: str, device: str | torch.device) -> nn.Module:
    """A run's model with one checkpoint's weights, in eval mode, on `device` (Job.load_model):
    built as `hpcdl predict` builds it, from the model config and data shape the checkpoint
    was saved with (a model=custom class imported from sys.path)."""
    if cfg.script is not None:
        raise ConfigError(
            f"{run_dir.path} is an `hpcdl run` run; its program keeps its own model and "
            "checkpoints, which hpcdl cannot rebuild: load them with your program"
        )
    target = _usable_device(device)
    path = _checkpoint_for(run_dir, which)
    model = _model_from_checkpoint(read_checkpoint(path, mmap=True), str(path))
    return model.to(target)


def saved_data_state(cfg: Config, run_dir: RunDir, which: str) -> Optional[dict[str, Any]]:
    """A checkpoint's data_state (hpcdl.data.fitted_state), or None (Job.data_state)."""
    if cfg.script is not None:
        raise ConfigError(
            f"{run_dir.path} is an `hpcdl run` run; its program keeps its own data state"
        )
    state = read_checkpoint(_checkpoint_for(run_dir, which), mmap=True).get("data_state")
    return state if isinstance(state, dict) else None


def _usable_device(device: str | torch.device) -> torch.device:
    """`device` as torch names it, checked before any work: a GPU this process cannot see
    is one line naming it (torch said `AssertionError: Torch not compiled with CUDA
    enabled`, or an index error, as a traceback)."""
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(
            f"device={device!r}: not a torch device; give 'cpu', 'cuda' or 'cuda:N'"
        ) from None
    if target.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (target.index or 0) >= count:
            raise ConfigError(
                f"device={device!r}: this process sees {count} CUDA GPU(s) (torch "
                f"{torch.__version__}, CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}); load on device='cpu'"
                + (f" or 'cuda:0' to 'cuda:{count - 1}'" if count else "")
            )
    return target


def evaluate_checkpoint(
    cfg: Config,
    run_dir: RunDir,
    which: str,
    split: str = "test",
    data_overrides: Sequence[str] = (),
    shown: Optional[Callable[[dict[str, Any]], None]] = None,
) -> dict[str, Any]:
    """Metrics (and a confusion matrix) of one checkpoint on one split of the run's data,
    or of the data that `cfg` points at with `data_overrides` (as they resolved: they name
    the output folder and are recorded). Written to eval/<checkpoint>/ for the run's test
    split, else eval/<checkpoint>[-<split>][-<hash of the overrides>]/. `shown(report)` is
    called before they are written: a run dir that cannot be written still shows them."""
    path = _checkpoint_for(run_dir, which)
    state = read_checkpoint(path, mmap=True)
    feed = _inference_feed(cfg, state, split)
    if _num_samples(feed, split) == 0:
        others = [
            s for s in ("test", "val", "train", ALL_SPLIT) if s != split and _num_samples(feed, s)
        ]
        raise ConfigError(
            f"hpcdl evaluate: the {split} split of {_whose(data_overrides, run_dir)} is empty "
            f"(data.{split}_fraction=0, or no {split} dataset); nothing to evaluate"
            + ("; evaluate " + " or ".join(f"--split {s}" for s in others) if others else "")
        )
    model = _model_for(cfg, state, str(path))
    batches = _split_batches(feed, split, cfg.trainer.batch_size)
    task = build_task(cfg.task, _target_stats(state))
    info = state["data_info"]
    num_classes, class_names = int(info["num_classes"]), list(info["class_names"])
    regression = isinstance(cfg.task, RegressionTaskConfig)
    device = torch.device("cpu")
    try:
        result = evaluate(model, batches, task, num_classes, device, keep_predictions=regression)
    except HpcdlError:
        raise
    except Exception as exc:  # the user's model, step or dataset, on this data: one line
        doing = f"evaluating the {split} split of {_whose(data_overrides, run_dir)}"
        raise _users_code_failed(cfg, exc, model, task, doing) from exc
    report: dict[str, Any] = {
        "checkpoint": str(path),
        "split": split,
        f"{split}_loss": result.loss,
        **{f"{split}_{name}": value for name, value in result.metrics.items()},
        f"num_{split}_samples": result.num_samples,
    }
    if data_overrides:
        report["data_overrides"] = list(data_overrides)
    if result.confusion is not None:
        report["confusion_matrix"] = result.confusion.tolist()
        report["class_names"] = class_names
    if shown is not None:
        shown(report)
    name = eval_name(path.stem, split, data_overrides)
    write_json_atomic(run_dir.eval_metrics_file(name), report)
    if result.confusion is not None:
        plot_confusion_matrix(result.confusion, class_names, run_dir.eval_confusion_png(name))
    if result.predictions is not None:
        predicted, true = result.predictions
        plot_predicted_vs_true(predicted.reshape(-1), true, run_dir.eval_scatter_png(name))
    report["output_dir"] = str(run_dir.eval_dir(name))
    return report


def eval_name(checkpoint: str, split: str, data_overrides: Sequence[str]) -> str:
    """The folder in eval/: the checkpoint's name for the run's own test split (as before
    other data could be given), with -<split> and -<8 hex digits of the overrides> added
    otherwise, so that the run's own results are never overwritten by other data's."""
    parts = [checkpoint]
    if split != "test":
        parts.append(split)
    if data_overrides:
        parts.append(hashlib.sha256("\n".join(data_overrides).encode()).hexdigest()[:8])
    return "-".join(parts)


def _whose(data_overrides: Sequence[str], run_dir: RunDir) -> str:
    return " ".join(data_overrides) if data_overrides else f"{run_dir.path}'s data"


def predict_rows(
    cfg: Config,
    run_dir: RunDir,
    input_path: Optional[str],
    which: str,
    output: Optional[str],
    split: Optional[str] = None,
    id_column: Optional[str] = None,
) -> int:
    """`hpcdl predict`: predictions() as CSV, on stdout or in the --output file (checked
    before anything is computed). Returns the number of rows."""
    path = _checkpoint_for(run_dir, which)
    reads = {path: "the checkpoint"}
    if input_path is not None:
        reads[Path(input_path).expanduser()] = "the --input file"
    target = _output_file(output, run_dir, reads)
    table = predictions(
        cfg, run_dir, which, input_path=input_path, split=split, id_column=id_column
    )
    _write_csv(table, target)
    return len(table.rows)


@dataclass
class Predictions:
    """One row per sample, in the samples' order: `columns` names each row's values (row,
    predicted, class_name, probability[, true]; row, predicted[, true] for regression;
    row and task.predict's names for task=custom), as Python numbers and strings."""

    columns: list[str]
    rows: list[list[Any]]
    # Columns whose CSV text is not str(value): a rounding, or a dtype's shortest form.
    text: dict[str, Callable[[Any], str]] = field(default_factory=dict)

    def as_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]

    def add_column(self, name: str, values: Sequence[Any], what: str) -> None:
        """`name` after `row`, one value per row (`what`: the values, for the error)."""
        if len(values) != len(self.rows):
            raise DataError(f"{what}: {len(values)} values for {len(self.rows)} rows read")
        self.columns.insert(1, name)
        self.rows = [[row[0], v, *row[1:]] for v, row in zip(values, self.rows, strict=True)]

    def csv_rows(self) -> Iterator[list[Any]]:
        formats = [self.text.get(name) for name in self.columns]
        for row in self.rows:
            yield [v if f is None else f(v) for f, v in zip(formats, row, strict=True)]


def predictions(
    cfg: Config,
    run_dir: RunDir,
    which: str,
    *,
    input_path: Optional[str] = None,
    split: Optional[str] = None,
    id_column: Optional[str] = None,
) -> Predictions:
    """Predictions for raw rows (input_path, with the run's training preprocessing applied)
    or for every sample of one split (of the run's data, or of the data `cfg` points at),
    with the true value beside it. task=custom: the columns its task.predict function
    returns."""
    source = f"--input {input_path}" if input_path is not None else f"--split {split or 'test'}"
    path = _checkpoint_for(run_dir, which)
    state = read_checkpoint(path, mmap=True)
    images = isinstance(cfg.data, ImageFolderConfig)
    ids = None if id_column is None else _id_values(input_path, id_column)
    if input_path is not None and not images:
        _refuse_input_without_rows(state, input_path)  # before task.predict's advice names it
    prediction = _custom_prediction(cfg, run_dir, source)
    model = _model_from_checkpoint(state, str(path))
    feed: Optional[Feed] = None
    files: Optional[list[str]] = None  # images: each row's file, to join predictions by
    if input_path is not None and images:
        batches, files = _image_batches(cfg, state, input_path)
    elif input_path is not None:
        batches = _row_batches(state, input_path, id_column)
    else:
        feed = _inference_feed(cfg, state, split or "test")
        batches = _predict_split_batches(cfg, feed, split or "test")
    if prediction is not None:
        table = _custom_rows(prediction, model, batches)
    else:
        try:
            table = _builtin_rows(cfg, state, model, batches)
        except HpcdlError:
            raise
        except Exception as exc:  # the user's model or dataset, on these rows: one line
            raise _users_code_failed(cfg, exc, model, None, f"predicting on {source}") from exc
    places = None if feed is None else _source_rows(feed, split or "test")
    if places is not None:  # `row` joins a split's predictions to the file they came from
        table.rows = [[int(r), *row[1:]] for r, row in zip(places, table.rows, strict=True)]
    if feed is not None and isinstance(cfg.data, ImageFolderConfig):
        files = _split_files(feed, split or "test", Path(cfg.data.path).expanduser())
    if files is not None:  # `path`: which image each row is
        table.add_column("path", files, f"{source}'s image paths")
    if ids is not None and id_column is not None:  # --id-column: the rows' own IDs
        table.add_column(id_column, ids, f"--id-column {id_column}")
    return table


def _id_values(input_path: Optional[str], id_column: str) -> list[str]:
    """--id-column: only for --input of a CSV with a header naming it."""
    if input_path is None or Path(input_path).suffix.lower() != ".csv":
        raise ConfigError(
            f"--id-column {id_column}: only with --input of a .csv (a --split's `row` is its "
            "row in the data file; --input arrays keep their order)"
        )
    return csv_column(Path(input_path).expanduser(), id_column)


def _image_batches(
    cfg: Config, state: dict[str, Any], input_path: str
) -> tuple[Iterator[tuple[torch.Tensor, None]], list[str]]:
    """--input images (a folder of them, with or without class folders, or one file),
    read as the run's val/test images are (its image_size, crop_size, channels, mean, std;
    no augmentation), as label-less batches; and their paths relative to the folder."""
    from hpcdl.data.imagefolder import ImageFolderDataset, unlabelled_images

    data = cfg.data
    assert isinstance(data, ImageFolderConfig)
    info = state["data_info"]
    root, files = unlabelled_images(Path(input_path).expanduser(), input_path)
    dataset = ImageFolderDataset(
        root,
        [(f, 0) for f in files],
        [str(n) for n in info["class_names"]],
        image_size=data.image_size,
        crop_size=data.crop_size,
        random_flip=False,
        random_crop=False,
        mean=data.mean,
        std=data.std,
        channels=data.channels,
    )
    _check_image_sizes(dataset, tuple(int(s) for s in info["input_shape"]), input_path)
    loader = torch.utils.data.DataLoader(dataset, batch_size=EVAL_BATCH_SIZE)
    return ((x, None) for x, _ in loader), files


def _check_image_sizes(dataset: Any, trained: tuple[int, ...], input_path: str) -> None:
    """--input images the model cannot take, named before any is predicted (from their
    headers): another size than training's where the run does not crop, or smaller than
    its crop. The run's data.image_size and data.crop_size are fixed by training."""
    width, height = trained[-1], trained[-2]
    crop = dataset.crop_size
    resized = "" if dataset.image_size is None else f" after data.image_size={dataset.image_size}"
    for relative, _ in dataset.samples:
        w, h = dataset.image_size_of(relative)
        if crop is None and (w, h) != (width, height):
            need = f"the model was trained on {width}x{height}; bring the images to that size"
        elif crop is not None and min(w, h) < crop:
            need = f"the run crops {crop}x{crop} (data.crop_size); give images at least that big"
        else:
            continue
        raise DataError(
            f"--input {input_path!r}: {dataset.root / relative} is {w}x{h} pixels{resized}; "
            f"{need} first"
        )


def _split_files(feed: Feed, split: str, data_path: Path) -> Optional[list[str]]:
    """data=imagefolder: each sample's image file of one split, in the split's order, as a
    path relative to data.path (None for other datasets)."""
    from hpcdl.data.feed import DatasetFeed
    from hpcdl.data.imagefolder import ImageFolderDataset

    if not isinstance(feed, DatasetFeed):
        return None
    files: list[str] = []
    for part in _parts(split):
        dataset: Any = feed.datasets[part]
        order: Optional[list[int]] = None
        if isinstance(dataset, torch.utils.data.Subset):
            dataset, order = dataset.dataset, [int(i) for i in dataset.indices]
        if len(dataset) == 0 or not isinstance(dataset, ImageFolderDataset):
            continue
        samples = dataset.samples if order is None else [dataset.samples[i] for i in order]
        base = dataset.root.relative_to(data_path) if dataset.root != data_path else Path()
        files += [(base / relative).as_posix() for relative, _ in samples]
    return files


def _users_code_failed(
    cfg: Config, exc: Exception, model: nn.Module, task: Any, doing: str
) -> ConfigError:
    """One line naming the key whose code raised (as `hpcdl train`'s probe does)."""
    from hpcdl.probe import culprit

    return ConfigError(f"{culprit(cfg, exc, model, task)}: {doing} failed: {raised(exc)}")


def _custom_prediction(cfg: Config, run_dir: RunDir, source: str) -> Optional[CustomPrediction]:
    """task=custom: its task.predict function (refused in one line when unset); None for the
    built-in tasks, whose outputs hpcdl knows."""
    if not isinstance(cfg.task, CustomTaskConfig):
        return None
    if cfg.task.predict is None:
        raise ConfigError(
            f"task.predict is not set: {run_dir.path} was trained with task=custom, whose model "
            "outputs only your code understands; write a function (model, batch) -> tensor or "
            "{name: tensor} with one entry per sample and name it, e.g. "
            f"hpcdl predict {run_dir.path} task.predict=package.module:function {source}"
        )
    return build_prediction(cfg.task)


def _output_file(output: Optional[str], run_dir: RunDir, reads: dict[Path, str]) -> Optional[Path]:
    """--output, checked before anything is computed: not a folder, not a file this command
    reads, not one of the run dir's own records. Missing parent folders are made when it is
    written."""
    if output is None:
        return None
    path = Path(output).expanduser()
    if path.is_dir():
        raise ConfigError(
            f"--output {output!r} is a folder; give a file name, e.g. {path / 'predictions.csv'}"
        )
    for other, what in reads.items():
        if _same_file(path, other):
            raise ConfigError(
                f"--output {output!r} is {what} '{other}'; write the predictions to another file"
            )
    inside = _relative_to(path, run_dir.path)
    owned = {name.split("/")[0] for name, _ in RUN_DIR_LAYOUT}
    if inside is not None and inside.parts and inside.parts[0] in owned:
        raise ConfigError(
            f"--output {output!r} would overwrite the run's own {inside.parts[0]}; write the "
            f"predictions to another file, e.g. {run_dir.path / 'predictions.csv'}"
        )
    folder = next(p for p in (path.parent, *path.parent.parents) if p.exists())
    if not folder.is_dir():
        raise ConfigError(f"--output {output!r}: '{folder}' is a file, not a folder")
    return path


def _same_file(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return a.samefile(b)
    return a.resolve() == b.resolve()


def _relative_to(path: Path, folder: Path) -> Optional[Path]:
    try:
        return path.resolve().relative_to(folder.resolve())
    except ValueError:
        return None


def _refuse_input_without_rows(state: dict[str, Any], input_path: str) -> None:
    if not state.get("preprocessing"):
        raise ConfigError(
            f"--input {input_path!r}: this run's data (data=custom) is not feature rows; "
            "predict on one of its splits with --split test|val|train, or on new data that "
            "your data.target builds: --split all data.kwargs.KEY=VALUE (docs/your-code.md)"
        )


def _row_batches(
    state: dict[str, Any], input_path: str, id_column: Optional[str] = None
) -> Iterator[tuple[torch.Tensor, None]]:
    """--input rows, prepared as the training rows were, as label-less (x, None) batches."""
    info = state["data_info"]
    # Checkpoints written before feature_columns was recorded give rows by position only.
    rows = load_feature_rows(
        input_path,
        tuple(info["input_shape"]),
        info.get("feature_columns"),
        info.get("label_column"),
        id_column,
    )
    if len(rows) == 0:
        raise DataError(f"--input {input_path!r}: no rows to predict")
    prepare = Preprocessing.from_state_dict(state["preprocessing"])
    # A batch at a time: the prepared copy of all rows (and of a memory-mapped .npy, all its
    # pages at once) is never made.
    return (
        (prepare.apply(rows[start : start + EVAL_BATCH_SIZE]), None)
        for start in range(0, len(rows), EVAL_BATCH_SIZE)
    )


def _predict_split_batches(cfg: Config, feed: Feed, split: str) -> Iterator[Any]:
    """Every sample of one split, rebuilt from `cfg` and prepared as in training, in order."""
    if _num_samples(feed, split) == 0:
        raise ConfigError(f"--split {split}: the {split} split is empty")
    return _split_batches(feed, split, cfg.trainer.batch_size)


def _source_rows(feed: Feed, split: str) -> Optional[np.ndarray]:
    """The samples' rows in their data file, for one split of a built-in source; None for
    --split all (its rows are the file's, in order, already) and for datasets (a split's
    own index is all hpcdl knows of them)."""
    if split == ALL_SPLIT or not isinstance(feed, TensorFeed):
        return None
    rows = feed.data.source_rows
    return None if rows is None else rows[split]


def _inference_feed(cfg: Config, state: dict[str, Any], split: str) -> Feed:
    """The data `cfg` names, prepared as the checkpoint's training data was: the training
    split's preprocessing (mean/std) from the checkpoint, never refitted on this data;
    class labels as indices into the checkpoint's classes. --split all reads the data
    with val_fraction=test_fraction=0, so that its train split holds every sample, in order."""
    data_cfg = cfg.data
    if split == ALL_SPLIT:
        data_cfg = replace(data_cfg, val_fraction=0.0, test_fraction=0.0, num_folds=0, fold=0)
    info = state["data_info"]
    device = torch.device("cpu")
    feed: Feed
    if isinstance(data_cfg, (CustomDataConfig, ImageFolderConfig)):
        # Their samples are prepared by the dataset's own code (or image_size/mean/std,
        # which evaluate refuses to change): nothing fitted to apply.
        trained = None
        if isinstance(data_cfg, ImageFolderConfig):
            # Every split read as val/test are: no random flip or crop (--split train and
            # all read the training split, which training augments).
            data_cfg = replace(data_cfg, random_flip=False, random_crop=False)
            if not numeric_targets(cfg.task):
                trained = [str(n) for n in info["class_names"]]
        feed = build_feed(
            data_cfg, device, seed=cfg.trainer.seed, task=cfg.task, class_names=trained
        )
        if state.get("data_state") is not None:  # its train dataset's fitted statistics
            feed.load_data_state(state["data_state"])
    else:
        fitted = state.get("preprocessing")  # {} in checkpoints of dataset runs
        regression = numeric_targets(cfg.task)
        _check_csv_header(data_cfg, info)
        data = build_data(
            data_cfg,
            regression=regression,
            preprocessing=Preprocessing.from_state_dict(fitted) if fitted else None,
            feature_columns=info.get("feature_columns"),
        )
        _check_columns(data, info)
        if not regression:
            _as_trained_classes(data, [str(n) for n in info["class_names"]])
        feed = TensorFeed(
            data, device, in_memory=data_cfg.in_memory, num_workers=data_cfg.num_workers
        )
    _check_fits(feed, info)
    return feed


def _check_csv_header(data_cfg: Any, info: dict[str, Any]) -> None:
    """Other CSV data for a run trained on a CSV, before it is read: every column but
    data.label_column is a feature, so the header must name the training CSV's feature
    columns and no other; a missing or extra column is named here, where reading the file
    would only find rows of the wrong width."""
    trained = info.get("feature_columns")
    if not isinstance(data_cfg, FilesConfig) or trained is None:
        return
    if Path(data_cfg.path).suffix.lower() != ".csv":
        return
    header = csv_header(Path(data_cfg.path))
    label = data_cfg.label_column
    if header is None or label not in header:
        return  # reading the file says what is wrong
    features = [name for name in header if name != label]
    missing = [name for name in trained if name not in features]
    extra = list(dict.fromkeys(name for name in features if name not in trained))
    where = f"data.path={data_cfg.path!r}"
    if missing:
        raise DataError(
            f"{where}: no {_columns(missing)} in its header ({', '.join(header)}); the model "
            f"was trained on the columns {', '.join(trained)}: add {_them(missing)}"
        )
    if extra and data_cfg.feature_columns is None:  # picked by name: the others go unread
        raise DataError(
            f"{where}: {_columns(extra)} not among the model's feature columns "
            f"({', '.join(trained)}); every column but data.label_column={label!r} is read as "
            f"a feature: drop {_them(extra)} from the file"
        )


def _columns(names: list[str]) -> str:
    return ("column " if len(names) == 1 else "columns ") + ", ".join(map(repr, names))


def _them(names: list[str]) -> str:
    return "it" if len(names) == 1 else "them"


def _check_columns(data: DataSplits, info: dict[str, Any]) -> None:
    """A CSV's feature columns, by name, are the training CSV's, in its order (build_data
    puts the same columns in that order): the fitted mean/std and the model's weights are
    per position."""
    trained = info.get("feature_columns")
    if trained is None or data.feature_columns is None or data.feature_columns == trained:
        return
    raise DataError(
        f"data.path: the CSV's feature columns ({', '.join(data.feature_columns)}) are not "
        f"the model's ({', '.join(trained)}); give those columns, in that order"
    )


def _as_trained_classes(data: DataSplits, trained: list[str]) -> None:
    """Labels as indices into the checkpoint's class names: data with fewer classes, or in
    another order, is encoded against its own names by the reader."""
    if data.class_names == trained:
        return
    unknown = [name for name in data.class_names if name not in trained]
    if unknown:
        raise DataError(
            f"data: class {unknown[0]!r} is not one of the model's classes "
            f"({', '.join(trained)}); give data with those labels only"
        )
    index = torch.tensor([trained.index(name) for name in data.class_names], dtype=torch.int64)
    data.y_train, data.y_val, data.y_test = (
        index[y] for y in (data.y_train, data.y_val, data.y_test)
    )
    data.class_names, data.num_classes = list(trained), len(trained)


def _check_fits(feed: Feed, info: dict[str, Any]) -> None:
    """Samples the model takes: the checkpoint's input shape, and no more classes."""
    trained = tuple(int(s) for s in info["input_shape"])
    if feed.input_shape and trained and tuple(feed.input_shape) != trained:
        raise DataError(
            f"the data's samples have shape {tuple(feed.input_shape)}, the model was trained "
            f"on samples of shape {trained}"
        )
    num_classes = int(info["num_classes"])
    if feed.num_classes > num_classes:
        raise DataError(
            f"the data has {feed.num_classes} classes, the model was trained on {num_classes}"
        )


def _num_samples(feed: Feed, split: str) -> int:
    return sum(feed.num_samples(part) for part in _parts(split))


def _split_batches(feed: Feed, split: str, batch_size: int) -> Iterator[Any]:
    device = torch.device("cpu")
    return itertools.chain.from_iterable(
        feed.eval_batches(part, 0, 1, device, batch_size) for part in _parts(split)
    )


def _parts(split: str) -> tuple[str, ...]:
    return ("train", "val", "test") if split == ALL_SPLIT else (split,)


def _model_for(cfg: Config, state: dict[str, Any], source: str) -> nn.Module:
    """The model the run's config describes, shaped as the checkpoint's data was, with the
    checkpoint's weights (a checkpoint that does not fit is refused, naming the parameter)."""
    info = state["data_info"]
    model = build_model(cfg.model, tuple(info["input_shape"]), int(info["num_classes"]))
    load_matching_weights(model, state["model"], source)
    model.eval()
    return model


def _target_stats(state: dict[str, Any]) -> Optional[tuple[float, float]]:
    """Regression on a built-in source: the training targets' mean and std."""
    info = state["data_info"]
    if "target_mean" not in info:
        return None
    return float(info["target_mean"]), float(info["target_std"])


def _builtin_rows(
    cfg: Config, state: dict[str, Any], model: nn.Module, batches: Iterable[Any]
) -> Predictions:
    """task=classification (class, name, probability) or regression (value in the target's
    units), with a `true` column when the batches carry labels."""
    outputs, truth = [], []
    with torch.no_grad():
        for batch in batches:
            x, y = input_and_target(batch, task=cfg.task.name)
            outputs.append(model(x).float())
            if y is not None:
                truth.append(y.reshape(-1))
    info = state["data_info"]
    logits = torch.cat(outputs)
    if isinstance(cfg.task, RegressionTaskConfig):
        task = build_task(cfg.task, _target_stats(state) or (0.0, 1.0))
        assert isinstance(task, RegressionTask)
        table = _regression_rows(task, logits)
    else:
        table = _class_rows(logits, list(info["class_names"]))
    if truth:
        table.columns.append("true")
        labels = torch.cat(truth)
        values = labels.tolist()
        table.rows = [[*row, value] for row, value in zip(table.rows, values, strict=True)]
        if labels.is_floating_point():  # regression targets, stored as float32
            table.text["true"] = _as_text_of(_numpy_dtype(labels))
    return table


def _custom_rows(
    prediction: CustomPrediction, model: nn.Module, batches: Iterable[Any]
) -> Predictions:
    """One row per sample: each output's values, flattened; a name with several values per
    sample becomes the columns name_0, name_1, ... (row-major)."""
    parts: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad():
        for batch in batches:
            for name, values in prediction.outputs(model, batch).items():
                parts.setdefault(name, []).append(values)
    columns, blocks, text = ["row"], [], {}
    for name, chunks in parts.items():
        array = torch.cat(chunks).numpy()
        array = array.reshape(array.shape[0], -1)
        width = array.shape[1]
        names = [name] if width == 1 else [f"{name}_{i}" for i in range(width)]
        columns += names
        blocks.append(array.tolist())
        # numpy's str() is the shortest text that reads back as the same float32/float64.
        text.update({n: _as_text_of(array.dtype) for n in names})
    table = [list(itertools.chain.from_iterable(cells)) for cells in zip(*blocks, strict=True)]
    return Predictions(columns, [[i, *row] for i, row in enumerate(table)], text)


def _as_text_of(dtype: np.dtype[Any]) -> Callable[[Any], str]:
    """A value's CSV text; for a float, the shortest that reads back as the same value of
    the dtype it was computed in (1201113.5, not 1.20111e+06; 0.50039226 for a float32)."""
    if dtype.kind != "f":
        return lambda value: str(dtype.type(value))
    return lambda value: _float_text(dtype.type(value))


def _float_text(x: np.floating[Any]) -> str:
    """Laid out as Python's repr: positional from 1e-4 up to 1e16 (numpy's str() of a
    float32 turns scientific from 1e6 on), else scientific."""
    if x == 0 or not np.isfinite(x) or 1e-4 <= abs(x) < 1e16:
        return np.format_float_positional(x, unique=True, trim="0")
    return str(x)


def _numpy_dtype(values: torch.Tensor) -> np.dtype[Any]:
    return values.detach().cpu()[:0].numpy().dtype


def _write_csv(table: Predictions, target: Optional[Path]) -> None:
    """To stdout, or to the --output file: written whole (a temporary name, then renamed),
    its missing parent folders made first."""
    if target is None:
        try:
            writer = csv.writer(sys.stdout)
            writer.writerow(table.columns)
            writer.writerows(table.csv_rows())
            sys.stdout.flush()
        except BrokenPipeError:
            # The reader has gone (`hpcdl predict ... | head`): stop quietly, as Unix tools
            # do; stdout to /dev/null so that the interpreter's last flush cannot fail too.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(table.columns)
    writer.writerows(table.csv_rows())
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise WriteError(target.parent, os_error_reason(err)) from err
    write_atomic(target, text.getvalue())


def _class_rows(outputs: torch.Tensor, names: list[str]) -> Predictions:
    probs = torch.softmax(outputs, dim=1)
    # One tensor op for all rows: per-row argmax and indexing took ~2.5 s for 200k rows.
    classes = probs.argmax(dim=1)
    best = probs.gather(1, classes[:, None]).squeeze(1)
    labels = [*names, *map(str, range(len(names), probs.shape[1]))]
    rows = [
        [i, k, labels[k], p]
        for i, (k, p) in enumerate(zip(classes.tolist(), best.tolist(), strict=True))
    ]
    columns = ["row", "predicted", "class_name", "probability"]
    return Predictions(columns, rows, {"probability": _as_text_of(_numpy_dtype(probs))})


def _regression_rows(task: RegressionTask, outputs: torch.Tensor) -> Predictions:
    values = task.predict(outputs)
    rows = [[i, v] for i, v in enumerate(values.tolist())]
    return Predictions(["row", "predicted"], rows, {"predicted": _as_text_of(_numpy_dtype(values))})
