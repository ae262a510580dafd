"""User files: .npz (x, y), .npy (+ labels .npy) and .csv (+ label column); rows to predict."""

from __future__ import annotations

import contextlib
import csv
import difflib
import itertools
import warnings
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from hpcdl.data.raw import RawData
from hpcdl.errors import DataError, DataWarning, plural

SUFFIXES = (".npz", ".npy", ".csv")
# The column dropped from prediction rows with a header, for runs whose checkpoint recorded
# no feature column names (the files source's default label column).
LABEL_COLUMN = "label"
# Rows parsed (CSV) or checked for NaN/inf (arrays) at a time. A CSV cell held as a Python str
# costs about 60 bytes, so a 200k x 21 CSV read whole as text took ~850 MB for 32 MB of
# float64 features; a chunk takes ~5 MB.
CHUNK_NUM_ROWS = 4096


def read_files(
    path: str,
    labels_path: Optional[str],
    label_column: str,
    regression: bool = False,
    feature_columns: Optional[list[str]] = None,
) -> RawData:
    file = Path(path).expanduser()
    suffix = file.suffix.lower()
    if suffix not in SUFFIXES:
        raise DataError(
            f"data.path={path!r}: unknown file type {suffix!r}; use .npz (arrays x and y), "
            ".npy (with data.labels_path) or .csv (with data.label_column)"
        )
    if not file.is_file():
        raise DataError(f"data.path={path!r}: no such file; point data.path at your data file")
    if feature_columns is not None and suffix != ".csv":
        raise DataError(
            f"data.feature_columns: picks a CSV's columns by name; {path!r} is a {suffix} file "
            "(its arrays hold the features): remove data.feature_columns"
        )
    columns: Optional[list[str]] = None
    if suffix == ".npz":
        x, labels = read_npz(file)
    elif suffix == ".npy":
        x, labels = read_npy_pair(file, labels_path)
    else:
        x, labels, columns = read_labelled_csv(file, label_column, feature_columns)
    if labels.ndim > 1 and int(np.prod(labels.shape[1:])) != 1:
        raise DataError(
            f"data.path={path!r}: the labels have shape {labels.shape}; give one label per row "
            "(an array of shape [N])"
        )
    if x.shape[0] != labels.shape[0]:
        raise DataError(
            f"data.path={path!r}: {x.shape[0]} feature rows but {labels.shape[0]} labels; "
            "give one label per row"
        )
    if x.ndim < 2:
        raise DataError(f"data.path={path!r}: features must be [N, ...], got shape {x.shape}")
    if x.shape[0] == 0:
        raise DataError(f"data.path={path!r}: no rows (features of shape {x.shape})")
    if int(np.prod(x.shape[1:])) == 0:
        raise DataError(
            f"data.path={path!r}: the rows hold no feature values (shape {x.shape}); add the "
            "feature columns (a CSV needs at least one besides data.label_column)"
        )
    rows_from = 2 if suffix == ".csv" else 0  # a CSV's header is line 1
    x = check_numeric(x, f"data.path={path!r}", columns, first_line=rows_from)
    warn_channels_last(x.shape, path)
    class_names: list[str] = []  # regression
    if regression:
        y = numeric_targets(labels, f"data.path={path!r}", first_line=rows_from or None)
    else:
        first_line = 2 if suffix == ".csv" else None  # a CSV's header is line 1
        y, class_names = encode_labels(labels, f"data.path={path!r}", first_line=first_line)
    label = label_column if columns is not None else None
    return RawData(x, y, class_names, feature_columns=columns, label_column=label)


def warn_channels_last(shape: tuple[int, ...], path: str) -> None:
    """Images stored [N, H, W, C] (NumPy's and PIL's order) are read as [N, C, H, W], as
    torch's conv layers take them: 16x16 RGB images became 16 channels of 16x3 pixels,
    and trained without a word. A last axis of 1, 3 or 4 behind two larger ones says so."""
    if len(shape) == 4 and shape[3] in (1, 3, 4) and min(shape[1], shape[2]) > 4:
        _, h, w, c = shape
        warnings.warn(
            f"data.path={path!r}: samples of shape {tuple(shape[1:])} are read as [C, H, W], "
            f"{h} channels of {w}x{c} pixels; if they are {h}x{w} images with {c} channel(s) "
            "last, save them as [N, C, H, W]: np.moveaxis(x, -1, 1)",
            DataWarning,
            stacklevel=2,
        )


def numeric_targets(labels: np.ndarray, where: str, first_line: Optional[int] = None) -> np.ndarray:
    """Regression targets as float32 [N]; refuses text and NaN/inf, naming the first by its
    place (first_line: the file line of labels[0], a CSV's; None: by its row index)."""
    labels = labels.reshape(-1)

    def place(row: int) -> str:
        return f"row {row}" if first_line is None else f"line {first_line + row}"

    try:
        values = labels.astype(np.float64)
    except ValueError:  # text; Python's float() names the cells NumPy's conversion cannot
        texts = labels.astype(str).tolist()  # bytes (an .npz of dtype S) decoded
        bad = [i for i, cell in enumerate(texts) if not is_number(cell)]
        if bad:
            fix = (
                "save the targets as numbers"
                if first_line is None  # an array's labels
                else "point data.label_column at a numeric column"
            )
            raise DataError(
                f"{where}: task=regression needs numeric labels, but {place(bad[0])} holds "
                f"{texts[bad[0]]!r} ({len(bad)} of {len(texts)} labels are not numbers); "
                f"fill in or drop those rows, or {fix}"
            ) from None
        values = np.array([float(cell) for cell in texts], dtype=np.float64)
    if not np.all(np.isfinite(values)):
        bad_rows = np.flatnonzero(~np.isfinite(values))
        first = int(bad_rows[0])
        raise DataError(
            f"{where}: {place(first)} holds the target {values[first]} "
            f"({plural(int(bad_rows.size), 'NaN or inf target')}); task=regression needs a "
            "finite number in every row: fill in or drop those rows"
        )
    return values.astype(np.float32)


def read_npz(file: Path) -> tuple[np.ndarray, np.ndarray]:
    names, arrays = load_npz(file, "data.path", lambda names: [k for k in ("x", "y") if k in names])
    missing = [key for key in ("x", "y") if key not in arrays]
    if missing:
        raise DataError(
            f"data.path='{file}': no array {missing[0]!r} (has {sorted(names)}); "
            "save with np.savez(path, x=features, y=labels)"
        )
    return arrays["x"], arrays["y"]


def read_npy_pair(file: Path, labels_path: Optional[str]) -> tuple[np.ndarray, np.ndarray]:
    if labels_path is None:
        raise DataError(
            f"data.path='{file}' is a .npy of features: set data.labels_path to a .npy of labels"
        )
    labels_file = Path(labels_path).expanduser()
    if not labels_file.is_file():
        raise DataError(f"data.labels_path={labels_path!r}: no such file")
    # Memory-mapped: build_data copies each split out of it, prepared, a chunk at a time.
    features = load_npy(file, "data.path", mapped=True)
    return features, load_npy(labels_file, "data.labels_path")


def read_labelled_csv(
    file: Path, label_column: str, feature_columns: Optional[list[str]] = None
) -> tuple[np.ndarray, np.ndarray, Optional[list[str]]]:
    """(features, labels, the feature columns' names: None when two header cells are the
    same, as then a name cannot pick one column). feature_columns: the columns to read, by
    name, in that order (None: every column but the label's)."""

    def columns(header: Optional[list[str]], width: int) -> CsvColumns:
        if header is None:
            raise DataError(
                f"data.path='{file}': the CSV has no header row; add one naming the columns, "
                f"with the labels' column named {label_column!r} (or set data.label_column to "
                "its name)"
            )
        if label_column not in header:
            raise DataError(
                f"data.label_column={label_column!r}: no such column in the header of "
                f"'{file}' ({header}); {_label_column_hint(header, label_column)}"
            )
        col = header.index(label_column)
        if feature_columns is not None:  # the others are not read: unnamed ones too
            picks = _picked(file, header, feature_columns, label_column)
            return CsvColumns(picks, list(feature_columns), label=col)
        unnamed = [i + 1 for i, name in enumerate(header) if not name]
        if unnamed:
            # Read as a feature it would be learned from unnoticed: pandas' row index, say.
            raise DataError(
                f"data.path='{file}': column {unnamed[0]} of {width} has no name in the header "
                "(a comma at the end of each line, or pandas' index written by to_csv without "
                "index=False?); name the column, remove it from the file, or pick the features "
                "with data.feature_columns"
            )
        picks = [i for i in range(width) if i != col]
        return CsvColumns(picks, [header[i] for i in picks], label=col)

    header, x, labels = read_csv(file, "data.path", columns)
    assert header is not None and labels is not None  # columns() refuses a file without them
    if len(x) == 0:
        raise DataError(f"data.path='{file}': the CSV has a header but no data rows")
    empty = np.flatnonzero(labels == "")
    if empty.size:
        raise DataError(
            f"data.path: '{file}' line {int(empty[0]) + 2} has an empty {label_column!r} cell "
            f"({plural(int(empty.size), 'row')} without a label); fill them in or drop those rows"
        )
    if feature_columns is not None:
        return x, labels, list(feature_columns)
    col = header.index(label_column)
    names = header[:col] + header[col + 1 :]
    return x, labels, names if len(set(header)) == len(header) else None


def _picked(file: Path, header: list[str], wanted: list[str], label_column: str) -> list[int]:
    """The positions of data.feature_columns in a CSV's header; one line naming a column
    that is not there (with a close name), the label column, or a column given twice."""
    if not wanted:
        raise DataError(
            "data.feature_columns=[]: name at least one column, or set it to null for every "
            "column but data.label_column"
        )
    for name in wanted:
        if name == label_column:
            raise DataError(
                f"data.feature_columns: {name!r} is data.label_column, the target; "
                "leave it out of the features"
            )
        if name not in header:
            close = difflib.get_close_matches(name, header, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"the header holds {header}"
            raise DataError(
                f"data.feature_columns: no column {name!r} in the header of '{file}'; {hint}"
            )
        if header.count(name) > 1:
            raise DataError(
                f"data.feature_columns: {name!r} names {header.count(name)} columns of '{file}'; "
                "give each column its own name in the header"
            )
    twice = sorted({name for name in wanted if wanted.count(name) > 1})
    if twice:
        raise DataError(f"data.feature_columns: {twice[0]!r} is given twice; give it once")
    return [header.index(name) for name in wanted]


def _label_column_hint(header: list[str], label_column: str) -> str:
    """How to fix a data.label_column that the header lacks: a close name, or a file that
    is not comma-separated (its header is then one cell holding the separators)."""
    separator = next((sep for sep in ";\t|" if len(header) == 1 and sep in header[0]), None)
    if separator is not None:
        return (
            f"the header is one cell: the file seems separated by {separator!r}; hpcdl reads "
            "comma-separated files, save it with commas"
        )
    close = difflib.get_close_matches(label_column, header, n=1, cutoff=0.6)
    if close:
        return f"did you mean data.label_column={close[0]}?"
    return "set data.label_column to the column holding the labels"


def encode_labels(
    labels: np.ndarray, where: str, first_line: Optional[int] = None
) -> tuple[np.ndarray, list[str]]:
    """Labels of any type -> int64 indices into the sorted class names (numbers sort by value).
    first_line: the file line of labels[0] (a CSV's), so that a label is named by its line;
    None: by its row index in the array."""
    labels = labels.reshape(-1)
    if labels.dtype.kind in "US":
        labels = labels.astype(str)
        with contextlib.suppress(ValueError):  # genuine class names stay strings
            labels = np.array([float(v) for v in labels])
    if labels.dtype.kind == "f":
        if not np.all(np.isfinite(labels)):
            raise DataError(
                f"{where}: some labels are NaN or inf (missing values?); give every row a class "
                "label, or drop the rows without one"
            )
        fractional = labels[labels != np.round(labels)]
        if fractional.size:
            raise DataError(
                f"{where}: labels must be integers or class names, got non-integer numbers "
                f"(e.g. {fractional[0]:.12g}); use task=regression for a numeric target (or "
                "task.labels=numbers with task=custom and your own loss)"
            )
        labels = labels.astype(np.int64)
    if labels.dtype.kind not in "iuUSb":
        raise DataError(
            f"{where}: labels of dtype {labels.dtype} are not class labels; give integers or "
            "class names"
        )
    classes, y, counts = np.unique(labels, return_inverse=True, return_counts=True)
    if len(classes) < 2:
        raise DataError(f"{where}: all labels are {classes.tolist()}; need at least two classes")
    lone = [c for c, n in zip(classes.tolist(), counts.tolist(), strict=True) if n == 1]
    if lone and len(lone) < len(classes):
        # A class of one sample is most often a stray label (a typo, a code for "missing"),
        # and no split can keep it in both training and test: name it instead of failing
        # later in the split.
        rows = [int(np.flatnonzero(labels.reshape(-1) == c)[0]) for c in lone[:3]]
        found = ", ".join(
            f"{c!r} (row {r})" if first_line is None else f"{c!r} (line {first_line + r})"
            for c, r in zip(lone[:3], rows, strict=True)
        )
        fix = "fix or drop that row (is it outside your classes?)"
        if labels.dtype.kind in "iu" and len(lone) > len(classes) // 2:
            # Mostly classes of one sample: a numeric target (prices, counts), not classes.
            fix = (
                f"{len(classes)} distinct numbers, {len(lone)} of them once: for a numeric "
                "target use task=regression"
            )
        raise DataError(
            f"{where}: label {found} occurs in one sample only, the other classes in "
            f"up to {int(counts.max())}; {fix}"
        )
    return y.astype(np.int64).reshape(-1), [str(c) for c in classes.tolist()]


def check_numeric(
    x: np.ndarray, where: str, names: Optional[Sequence[str]] = None, first_line: int = 0
) -> np.ndarray:
    """x, numeric and finite; the first NaN or inf is named by its place: a CSV's line and
    column (first_line: the file's line of row 0, 0 for arrays; names: the columns), else
    its row and feature index."""
    if x.dtype.kind not in "iufb":
        raise DataError(
            f"{where}: features of dtype {x.dtype} are not numeric; convert them to numbers "
            "(one-hot encode categories) first"
        )
    if x.dtype.kind == "f" and not _all_finite(x):
        rows = x.reshape(len(x), -1) if x.ndim else x.reshape(1, 1)
        row, col = (int(i) for i in np.argwhere(~np.isfinite(rows))[0])
        if first_line:
            name = repr(names[col]) if names is not None and col < len(names) else col + 1
            place = f"line {first_line + row}, column {name}"
        else:
            place = f"row {row}, feature {col}" if rows.shape[1] > 1 else f"row {row}"
        bad = int(np.count_nonzero(~np.isfinite(rows)))
        raise DataError(
            f"{where}: {place} holds {rows[row, col]} ({plural(bad, 'NaN or inf value')} in "
            "the features); clean or impute them first"
        )
    return x


def _all_finite(x: np.ndarray) -> bool:
    """np.isfinite over CHUNK_NUM_ROWS rows at a time: a mask of the whole array would be
    a quarter of a float32 array's size (of a memory-mapped .npy, in the process's memory)."""
    if x.ndim == 0:
        return bool(np.isfinite(x))
    return all(
        np.isfinite(x[start : start + CHUNK_NUM_ROWS]).all()
        for start in range(0, len(x), CHUNK_NUM_ROWS)
    )


# ----------------------------------------------------------------------------- readers
def load_npz(
    file: Path, key: str, pick: Callable[[list[str]], list[str]]
) -> tuple[list[str], dict[str, np.ndarray]]:
    """(every array's name, the arrays that pick(names) chose, read): a zip's other arrays,
    whatever their size or dtype, are never read."""
    try:
        with np.load(file, allow_pickle=False) as arrays:
            names = list(arrays.files)
            return names, {name: arrays[name] for name in pick(names)}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:  # a cut or foreign file
        raise DataError(f"{key}: cannot read '{file}' as .npz: {_numpy_reason(exc)}") from exc


def load_npy(file: Path, key: str, mapped: bool = False) -> np.ndarray:
    """mapped: a read-only memory map (pages read as they are touched, and reclaimable
    file cache rather than the process's own memory), else the array read whole."""
    try:
        return np.asarray(np.load(file, mmap_mode="r" if mapped else None, allow_pickle=False))
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(f"{key}: cannot read '{file}' as .npy: {_numpy_reason(exc)}") from exc


def _numpy_reason(exc: BaseException) -> str:
    """NumPy's error, but for a file that is no NumPy file at all: np.load then takes it for
    a pickle and suggests allow_pickle, which hpcdl never uses on data (it runs code)."""
    if "pickled" in str(exc):
        return "not a NumPy file (neither .npy nor a zip of arrays); save it with np.savez"
    if "Python objects in dtype" in str(exc) or "Object arrays cannot" in str(exc):
        return (
            "it holds Python objects (dtype object), which hpcdl does not unpickle; save "
            "numbers (features: x.astype(np.float32)) or, for labels, strings (y.astype(str))"
        )
    if "mmap length is greater than file size" in str(exc):  # a memory-mapped cut file
        return "it holds less data than its header says (file seems not fully written?)"
    return str(exc)


def has_text(cells: Sequence[str]) -> bool:
    """Training's header rule: a first row with any cell that is not a number is a header."""
    return not all(is_number(cell) for cell in cells)


@dataclass
class CsvColumns:
    """Which cells of each row to read: `picks` (in this order) as numbers, named `names` in
    messages (None: by their number), and the text column `label` (None: none)."""

    picks: list[int]
    names: Optional[list[str]] = None
    label: Optional[int] = None


def read_csv(
    file: Path,
    key: str,
    columns: Callable[[Optional[list[str]], int], CsvColumns],
    is_header: Callable[[list[str]], bool] = has_text,
) -> tuple[Optional[list[str]], np.ndarray, Optional[np.ndarray]]:
    """(header or None, the picked cells as float64 [N, len(picks)], the label cells stripped
    as str [N] or None). is_header(first row, its cells stripped) decides whether the first
    row is a header (training's rule: it is when a cell is not a number); it may raise a
    DataError for a first row that is neither. columns(header, width) says which cells to
    read, and may refuse the header. Rows are parsed CHUNK_NUM_ROWS at a time, so the
    file is never held as Python strings whole; the first ragged row or non-number is named
    by its line."""
    try:
        # utf-8-sig drops the byte-order mark that Excel's "CSV UTF-8" starts with, which
        # would otherwise become part of the first column's name.
        with file.open(newline="", encoding="utf-8-sig") as f:
            rows: Iterator[list[str]] = filter(None, csv.reader(f))  # blank lines skipped
            first = next(rows, None)
            if first is None:
                raise DataError(
                    f"{key}: '{file}' is empty (no rows); point {key} at a file holding the "
                    "rows (was it written completely?)"
                )
            header = None
            if is_header([cell.strip() for cell in first]):
                header = [cell.strip() for cell in first]
            else:
                rows = itertools.chain([first], rows)
            width = len(header) if header is not None else len(first)
            wanted = columns(header, width)
            line = 2 if header is not None else 1
            parts: list[np.ndarray] = []
            labels: list[np.ndarray] = []
            while chunk := list(itertools.islice(rows, CHUNK_NUM_ROWS)):
                _check_widths(chunk, width, file, key, line)
                # Equal widths, so a 2-D table; numpy calls float() on each picked cell.
                cells = np.array(chunk, dtype=object)[:, wanted.picks]
                parts.append(parse_numeric_rows(cells, file, key, line, wanted.names))
                if wanted.label is not None:
                    labels.append(np.array([row[wanted.label].strip() for row in chunk], str))
                line += len(chunk)
    except UnicodeDecodeError:
        raise DataError(_not_utf8(file, key)) from None
    except (OSError, csv.Error) as exc:
        raise DataError(f"{key}: cannot read '{file}' as CSV: {exc}") from exc
    x = np.concatenate(parts) if parts else np.zeros((0, len(wanted.picks)))
    if wanted.label is None:
        return header, x, None
    return header, x, np.concatenate(labels) if labels else np.zeros(0, str)


def _not_utf8(file: Path, key: str) -> str:
    """A CSV that is not UTF-8 (Excel's plain "CSV" is Windows-1252): its first such line,
    and how to convert it."""
    data = file.read_bytes()
    try:
        data.decode("utf-8-sig")
        where = ""
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        where = f" line {line} (byte 0x{data[exc.start]:02x})"
    return (
        f"{key}: '{file}'{where} is not UTF-8 text (Excel's plain \"CSV\" is Windows-1252); "
        f"save it as \"CSV UTF-8\", or convert it: iconv -f cp1252 -t utf-8 '{file}' > new.csv"
    )


def _check_widths(rows: list[list[str]], width: int, file: Path, key: str, first_line: int) -> None:
    for line, row in enumerate(rows, start=first_line):
        if len(row) != width:
            raise DataError(
                f"{key}: '{file}' line {line} has {len(row)} columns, expected {width}; give "
                "every row the same number of cells"
            )


def csv_header(file: Path) -> Optional[list[str]]:
    """The first row of a CSV, its cells stripped, when it is a header (training's rule);
    None for a file without one or that cannot be read (reading it in full says why)."""
    try:
        with file.open(newline="", encoding="utf-8-sig") as f:
            first = next((row for row in csv.reader(f) if row), None)
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    cells = [cell.strip() for cell in first] if first is not None else None
    return cells if cells is not None and has_text(cells) else None


def csv_column(file: Path, name: str) -> list[str]:
    """`hpcdl predict --id-column NAME`: that column's cells, one per data row, as written
    (the file must have a header naming it)."""
    header = csv_header(file)
    if header is None or name not in header:
        named = f"its header: {_names(header)}" if header else "it has no header row"
        raise DataError(f"--id-column {name}: not a column of '{file}' ({named})")
    index = header.index(name)
    with file.open(newline="", encoding="utf-8-sig") as f:
        rows = [row for row in csv.reader(f) if row][1:]
    return [row[index].strip() if index < len(row) else "" for row in rows]


def parse_numeric_rows(
    rows: np.ndarray,
    file: Path,
    key: str,
    first_line: int = 1,
    names: Optional[Sequence[str]] = None,
) -> np.ndarray:
    """float64 [N, columns] from an object array of str cells [N, columns], each read as
    float() reads it (2.5x faster than a float() per cell in Python); a cell that is not a
    number is named by line and column (first_line: the file's line of rows[0])."""
    try:
        return rows.astype(np.float64)
    except ValueError:
        pass
    line, col, cell = next(
        (first_line + i, j, cell)
        for i, row in enumerate(rows)
        for j, cell in enumerate(row)
        if not is_number(cell)
    )
    column = repr(names[col]) if names is not None and col < len(names) else str(col + 1)
    fix = "fill in missing values and drop (or encode as numbers) non-numeric feature columns"
    text_column = cell.strip() and not any(is_number(c) for c in rows[:, col])
    if key.startswith("data.") and names is not None and text_column and len(names) > 1:
        others = ",".join(n for i, n in enumerate(names) if i != col)  # an ID, a note
        fix = f"leave text columns in the file unread with data.feature_columns=[{others}]"
    raise DataError(
        f"{key}: '{file}' line {line}, column {column}: {cell!r} is not a number; {fix}"
    )


def is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


# ----------------------------------------------------------------------------- prediction
def load_feature_rows(
    path: str,
    input_shape: Sequence[int],
    feature_columns: Optional[Sequence[str]] = None,
    label_column: Optional[str] = None,
    id_column: Optional[str] = None,
) -> np.ndarray:
    """Raw feature rows from .csv/.npy/.npz as float32 [N, *input_shape], for `hpcdl predict`
    (a .npy's memory-mapped, read-only when it holds float32).
    feature_columns, label_column: the training CSV's names (None for a run trained without
    them); a CSV with a header then gives its columns by name, others in training order."""
    file = Path(path).expanduser()
    suffix = file.suffix.lower()
    if file.is_dir():
        raise DataError(
            f"--input {path!r}: a folder; a folder of images is predicted by data=imagefolder "
            "runs, this one takes rows: a .csv, .npy or .npz file"
        )
    if suffix not in SUFFIXES:
        raise DataError(f"--input {path!r}: unknown file type {suffix!r}; use .csv, .npy or .npz")
    if not file.is_file():
        raise DataError(f"--input {path!r}: no such file")
    if suffix == ".npz":
        names, arrays = load_npz(
            file,
            "--input",
            lambda names: ["x"] if "x" in names else names if len(names) == 1 else [],
        )
        if "x" not in names and len(names) != 1:
            raise DataError(f"--input '{file}': no array 'x' (has {sorted(names)})")
        x = arrays["x"] if "x" in arrays else next(iter(arrays.values()))
    elif suffix == ".npy":
        x = load_npy(file, "--input", mapped=True)  # predict reads it a batch at a time
    else:
        x = read_feature_csv(file, feature_columns, label_column, id_column)
    x = check_numeric(np.asarray(x), f"--input '{file}'")
    num_features = int(np.prod(input_shape))
    if x.ndim == 1 and x.size == num_features:
        x = x[None]  # a single row
    per_row = int(np.prod(x.shape[1:])) if x.ndim >= 2 else 1
    if x.ndim < 2 or per_row != num_features:
        trained_on = ""
        if feature_columns is not None:
            trained_on = (
                f", the training CSV's columns {_names(feature_columns)} (not its label "
                f"column {label_column!r}); give those columns in that order"
                + (", or a header row naming them" if suffix == ".csv" else "")
            )
        raise DataError(
            f"--input '{file}': rows have {per_row} values, the model expects {num_features} "
            f"features (input_shape {tuple(input_shape)}){trained_on}"
        )
    # A float32 .npy stays its memory map: no copy of the whole file is made.
    return x.reshape(-1, *input_shape).astype(np.float32, copy=False)


def read_feature_csv(
    file: Path,
    feature_columns: Optional[Sequence[str]],
    label_column: Optional[str] = None,
    id_column: Optional[str] = None,
) -> np.ndarray:
    """float64 [N, columns]. For a run that recorded the training CSV's names, the first row
    decides (_is_named_header): a header's feature columns are picked by name in training
    order, its label column dropped, any other column dropped with a warning; a headerless
    file's columns are taken in training order. For a run without names: training's rule (a
    first row with text is a header) and the columns as they are, less a column `label`."""
    names = list(feature_columns) if feature_columns is not None else None
    chosen: list[CsvColumns] = []  # the columns read, to name a NaN's place

    def columns(header: Optional[list[str]], width: int) -> CsvColumns:
        if header is None:
            chosen.append(CsvColumns(list(range(width))))
        elif names is None:
            left = (_index(header, LABEL_COLUMN), _index(header, id_column or LABEL_COLUMN))
            keep = [i for i in range(width) if i not in left]
            chosen.append(CsvColumns(keep, [header[i] for i in keep]))
        else:
            picks = _column_indices(file, header, names)
            _warn_unused_columns(file, header, names, label_column, id_column)
            chosen.append(CsvColumns(picks, names))
        return chosen[0]

    if names is None:
        header, x, _ = read_csv(file, "--input", columns)
    else:
        header, x, _ = read_csv(
            file,
            "--input",
            columns,
            lambda cells: _is_named_header(file, cells, names, label_column),
        )
    if len(x) == 0:  # a header alone (read_csv refuses an empty file)
        raise DataError(f"--input '{file}': a header but no rows; add the rows to predict")
    # A NaN or inf is named by its line and column, as in training's CSV.
    first_line = 1 if header is None else 2
    return check_numeric(x, f"--input '{file}'", chosen[0].names, first_line=first_line)


def _index(header: list[str], name: str) -> Optional[int]:
    return header.index(name) if name in header else None


def _is_named_header(
    file: Path, cells: list[str], names: list[str], label_column: Optional[str]
) -> bool:
    """Whether an input CSV's first row is a header, for a run that recorded the training
    CSV's names: it is when it holds every feature column's name, or has text and names one
    training column (the missing ones are then refused by name); a row of numbers is data.
    Any other first row is refused: a header would name the columns, data would be numbers."""
    if set(names) <= set(cells):
        return True
    if not has_text(cells):
        return False
    if {*names, label_column} & set(cells):
        return True
    separator = next((sep for sep in ";\t|" if len(cells) == 1 and sep in cells[0]), None)
    if separator is not None:  # as training says it (_label_column_hint)
        raise DataError(
            f"--input '{file}': line 1 is one cell: the file seems separated by {separator!r}; "
            "hpcdl reads comma-separated files, save it with commas"
        )
    lower = {name.lower(): name for name in names}
    recased = [lower[cell.lower()] for cell in cells if cell.lower() in lower]
    if recased and not set(recased) & set(cells):
        raise DataError(
            f"--input '{file}': line 1 names the training columns in other letter case "
            f"({_names(cells)}); write them as training did: {_names(names)}"
        )
    col = next(j for j, cell in enumerate(cells) if not is_number(cell))
    shown = [cell if len(cell) <= 20 else cell[:17] + "..." for cell in cells]
    raise DataError(
        f"--input '{file}': line 1 ({_names(shown)}) is neither a header naming the training "
        f"columns ({_names(names)}) nor numbers ({shown[col]!r} in column {col + 1} is not a "
        "number); start the file with a header row naming those columns, or give numbers only"
    )


def _warn_unused_columns(
    file: Path,
    header: list[str],
    names: list[str],
    label_column: Optional[str],
    id_column: Optional[str] = None,
) -> None:
    """One warning naming the input CSV's columns that the model does not take, its label
    column and --id-column aside (an id or a note column is common; a misspelt feature name
    is seen here)."""
    left = (label_column, id_column)
    unused = list(dict.fromkeys(c for c in header if c not in names and c not in left))
    if unused:
        which = "column" if len(unused) == 1 else "columns"
        it = "it" if len(unused) == 1 else "them"
        warnings.warn(
            f"--input '{file}': {which} {_names([repr(c) for c in unused])} not used, the "
            f"model takes {_names(names)}; predicting without {it} (an ID column goes into "
            f"the output with --id-column {unused[0]})",
            DataWarning,
            stacklevel=2,
        )


def _column_indices(file: Path, header: list[str], names: Sequence[str]) -> list[int]:
    missing = [name for name in names if name not in header]
    if missing:
        which = "column" if len(missing) == 1 else "columns"
        raise DataError(
            f"--input '{file}': no {which} {_names([repr(n) for n in missing])} in its header "
            f"({_names(header)}); the model was trained on the columns {_names(names)}: add "
            f"the missing {which}"
        )
    repeated = next((name for name in names if header.count(name) > 1), None)
    if repeated is not None:
        raise DataError(
            f"--input '{file}': column {repeated!r} appears {header.count(repeated)} times in "
            "its header; keep one"
        )
    return [header.index(name) for name in names]


def _names(names: Sequence[str], most: int = 12) -> str:
    """'a, b, c', or the first ones and how many there are in all."""
    if len(names) <= most:
        return ", ".join(names)
    return f"{', '.join(names[: most - 2])}, ... ({len(names)} in all)"
