"""What a run leaves behind for people: summary.json and the plots. Rank 0 only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from hpcdl.evaluation import EvalResult
from hpcdl.plots import plot_confusion_matrix, plot_learning_curves, plot_predicted_vs_true
from hpcdl.rundir import RunDir


def write_curves(run_dir: RunDir) -> None:
    rows = run_dir.metrics.read()
    if rows:
        plot_learning_curves(rows, run_dir.curves_png)


def finalize_run(
    run_dir: RunDir,
    summary: Mapping[str, Any],
    test: Optional[EvalResult],
    class_names: list[str],
) -> None:
    """summary.json (its presence marks the run complete), learning curves, and the test
    set's confusion matrix (classification) or predicted-vs-true plot (regression)."""
    run_dir.write_summary(summary)
    write_curves(run_dir)
    if test is not None and test.confusion is not None:
        plot_confusion_matrix(test.confusion, class_names, run_dir.confusion_png)
    if test is not None and test.predictions is not None:
        predicted, true = test.predictions
        plot_predicted_vs_true(predicted.reshape(-1), true, run_dir.scatter_png)
