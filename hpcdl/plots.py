"""PNG plots of a finished run: learning curves and the confusion matrix.

matplotlib is imported inside the functions and drawn with Figure + FigureCanvasAgg: no
pyplot global state, no display needed, nothing at import time.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from hpcdl.atomic import write_atomic

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PathLike = Union[str, Path]

# Above this many classes the per-cell counts are unreadable, so they are left out.
MAX_ANNOTATED_CLASSES = 30
# Learning-curve panels side by side; more go in further rows.
MAX_PANELS_PER_ROW = 4


def plot_learning_curves(rows: Sequence[Mapping[str, Any]], out_png: PathLike) -> None:
    """One panel per metric against epoch, train and val (rows of metrics.csv): loss first,
    then the task's metrics (accuracy for classification)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    metrics = ["loss"]
    for key in rows[0] if rows else ():
        split, _, metric = key.partition("_")
        if split in ("train", "val") and metric and metric not in metrics:
            metrics.append(metric)
    if metrics == ["loss"]:
        metrics.append("accuracy")  # an empty panel rather than a different picture
    # At most MAX_PANELS_PER_ROW panels a row, more rows below: a task with many metrics made
    # one row of them, a picture 23 panels (13800 pixels) wide.
    num_cols = min(len(metrics), MAX_PANELS_PER_ROW)
    num_rows = -(-len(metrics) // num_cols)
    # Fixed margins (in inches: tick labels and one axis label a side) instead of
    # constrained layout, which measured every text and took more than half the time.
    width, height = 5.0 * num_cols, 4.0 * num_rows
    fig = Figure(figsize=(width, height))
    grid = fig.subplots(num_rows, num_cols, squeeze=False)
    fig.subplots_adjust(
        left=0.85 / width,
        right=1 - 0.2 / width,
        bottom=0.55 / height,
        top=1 - 0.35 / height,
        wspace=1.05 / 3.95,  # the gap between panels, as a share of a panel's width
        hspace=0.9 / 3.1,  # between rows: the x label and the next title, of a panel's height
    )
    axes = [ax for row in grid for ax in row]
    for ax in axes[len(metrics) :]:
        ax.set_visible(False)
    for ax, metric in zip(axes, metrics, strict=False):
        for split in ("train", "val"):
            _plot_series(ax, rows, f"{split}_{metric}", split)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no epoch 1.5
        ax.set_ylabel(metric)
        ax.set_title(metric)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend()
    save_png(fig, out_png)


def _plot_series(ax: Axes, rows: Sequence[Mapping[str, Any]], key: str, label: str) -> None:
    points = [
        (float(row["epoch"]), float(row[key]))
        for row in rows
        if row.get("epoch") is not None and row.get(key) is not None
    ]
    if points:
        epochs, values = zip(*points, strict=True)
        ax.plot(epochs, values, marker="o", markersize=3, label=label)


def plot_confusion_matrix(cm: Any, class_names: Sequence[str], out_png: PathLike) -> None:
    """Counts [true, predicted] as a heat map, each cell annotated, axes labeled by class."""
    import numpy as np
    from matplotlib.figure import Figure

    counts = np.asarray(cm.cpu() if hasattr(cm, "cpu") else cm, dtype=np.int64)
    num_classes = counts.shape[0]
    if counts.shape != (num_classes, num_classes) or len(class_names) != num_classes:
        raise ValueError(
            f"confusion matrix of shape {counts.shape} does not match "
            f"{len(class_names)} class names"
        )
    side_in = min(4 + 0.5 * num_classes, 30)
    # Margins from the longest class name (about 0.085 in a character at the default 10
    # pt; the x labels are turned 45 degrees) instead of constrained layout, which
    # measured every text and took more than half the time.
    name_in = 0.085 * max((len(str(name)) for name in class_names), default=1)
    left_in, bottom_in = 0.6 + name_in, 0.6 + 0.71 * name_in
    width, height = side_in + 1.5 + name_in, side_in + 0.71 * name_in
    fig = Figure(figsize=(width, height))
    ax = fig.subplots()
    fig.subplots_adjust(
        left=left_in / width, right=1 - 0.2 / width, bottom=bottom_in / height, top=1 - 0.4 / height
    )
    image = ax.imshow(counts, cmap="Blues", vmin=0)
    fig.colorbar(image, ax=ax, label="samples")
    ticks = list(range(num_classes))
    ax.set_xticks(ticks, [str(name) for name in class_names], rotation=45, ha="right")
    ax.set_yticks(ticks, [str(name) for name in class_names])
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(f"confusion matrix ({int(counts.sum())} samples)")
    if num_classes <= MAX_ANNOTATED_CLASSES:
        threshold = counts.max() / 2 if counts.size else 0
        for true in range(num_classes):
            for pred in range(num_classes):
                value = int(counts[true, pred])
                color = "white" if value > threshold else "black"
                ax.text(pred, true, str(value), ha="center", va="center", color=color)
    save_png(fig, out_png)


def plot_predicted_vs_true(predicted: Any, true: Any, out_png: PathLike) -> None:
    """Regression: one point per test sample, with the y = x line of perfect predictions."""
    import numpy as np
    from matplotlib.figure import Figure

    pred = np.asarray(predicted, dtype=np.float64).reshape(-1)
    target = np.asarray(true, dtype=np.float64).reshape(-1)
    if pred.shape != target.shape:
        raise ValueError(f"{pred.size} predictions but {target.size} targets")
    fig = Figure(figsize=(5.5, 5))  # fixed margins: see plot_learning_curves
    ax = fig.subplots()
    fig.subplots_adjust(left=0.9 / 5.5, right=1 - 0.2 / 5.5, bottom=0.55 / 5, top=1 - 0.35 / 5)
    ax.scatter(target, pred, s=8, alpha=0.6)
    if target.size:
        low = float(min(target.min(), pred.min()))
        high = float(max(target.max(), pred.max()))
        ax.plot([low, high], [low, high], color="black", linewidth=1, label="y = x")
        ax.legend()
    ax.set_xlabel("true value")
    ax.set_ylabel("predicted value")
    ax.set_title(f"predicted vs true ({target.size} test samples)")
    ax.grid(alpha=0.3)
    save_png(fig, out_png)


def save_png(fig: Figure, out_png: PathLike, dpi: int = 120) -> None:
    """Draw with the Agg canvas and write the PNG atomically (folders made as needed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, buffer.getvalue())
