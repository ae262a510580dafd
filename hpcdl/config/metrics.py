"""The built-in tasks' metrics and which way each is better: the one table that the tasks
(hpcdl.tasks), the check of trainer.early_stopping.monitor, its mode when left to auto
(monitor_mode) and sweep rankings read; and the guess from the name for any other metric.
Stdlib only (login node)."""

from __future__ import annotations

from typing import Optional

from hpcdl.config.schema import Mode

# Every task's loss: lower is better.
LOSS = "loss"
# Besides the loss, what each built-in task reports, in the order it reports them (a custom
# task's metrics are known only once its function has run).
TASK_METRICS: dict[str, dict[str, Mode]] = {
    "classification": {"accuracy": Mode.max},
    "regression": {"mae": Mode.min, "rmse": Mode.min, "r2": Mode.max},
}
# Names of metrics where lower is better, for a metric hpcdl does not define (a custom task's,
# a program's own in its metrics_file): parts of the name, and whole words between underscores.
LOWER_PARTS = ("loss", "error", "perplexity")
LOWER_WORDS: tuple[str, ...] = ("err", "mae", "mse", "rmse", "ppl", "nll", "wer", "cer")
LOWER_WORDS += ("ce", "xent", "kl", "bpc", "bpd", "mape")
LOWER_WORDS += ("dist", "distance", "time", "seconds")
# Whole words of names where higher is better: early stopping's auto mode and sweep rankings
# follow them; a name that reads like neither is min, the mode's default before auto existed.
HIGHER_WORDS: tuple[str, ...] = ("acc", "accuracy", "f1", "auc", "r2", "dice", "iou")
HIGHER_WORDS += ("precision", "recall")
HIGHER_WORDS += ("score", "map", "bleu", "psnr", "ssim")
HIGHER_WORDS += ("reward", "ndcg", "mrr", "kappa", "top1", "top5")
HIGHER_WORDS += ("pearson", "spearman", "corr", "correlation", "rho", "mcc")
HIGHER_WORDS += ("auroc", "auprc", "aupr", "ap", "jaccard", "sensitivity", "specificity")
# A name ending in a unit of time is a duration (wall_s, step_ms); one with "per" a rate.
DURATION_UNITS = ("s", "ms", "min")
# The prefixes of a metric's name in metrics.csv and summary.json: val_mae, test_accuracy.
SPLITS = ("train", "val", "test")


def unprefixed(metric: str) -> str:
    """The metric without its split: val_mae -> mae, test_loss -> loss, wall_s -> wall_s."""
    split, _, name = metric.partition("_")
    return name if split in SPLITS and name else metric


def builtin_mode(metric: str) -> Optional[Mode]:
    """min or max for the loss or a built-in task's metric on any split (val_mae,
    test_accuracy); None for any other name."""
    name = unprefixed(metric)
    if name == LOSS:
        return Mode.min
    for metrics in TASK_METRICS.values():
        if name in metrics:
            return metrics[name]
    return None


def lower_by_name(metric: str) -> bool:
    """A guess for a metric hpcdl does not define: lower is better for losses, errors,
    perplexities and durations (val_error, wer_err, rmse, wall_s, epoch_time)."""
    name = metric.lower()
    words = name.replace("-", "_").split("_")
    if any(part in name for part in LOWER_PARTS) or any(w in LOWER_WORDS for w in words):
        return True
    return words[-1] in DURATION_UNITS and "per" not in words  # not a rate: samples_per_s


def monitor_mode(monitor: str, mode: Optional[Mode]) -> Mode:
    """trainer.early_stopping.mode as it applies: `mode` when set (min or max); for null
    (auto) the monitored metric's own direction, from the table (val_r2: max, val_loss: min),
    else, for a custom task's metric, max for a name that reads as a score (val_dice,
    val_f1) and min otherwise (a loss-like name, or one that reads like neither)."""
    if mode is not None:
        return mode
    builtin = builtin_mode(monitor)
    return builtin if builtin is not None else guessed_mode(monitor)


def reads_as_neither(metric: str) -> bool:
    """A metric whose direction hpcdl cannot tell: not its own, and a name that reads as
    neither a loss nor a score (val_foo): guessed_mode takes min for it."""
    if builtin_mode(metric) is not None or lower_by_name(metric):
        return False
    words = metric.lower().replace("-", "_").split("_")
    return not any(w in HIGHER_WORDS for w in words)


def guessed_mode(metric: str) -> Mode:
    """A metric hpcdl does not define (a custom task's, a program's own): max for a name
    that reads as a score (val_dice, val_f1, reward), min for a loss-like one or one that
    reads like neither (min, early stopping's mode before auto existed). The one guess for
    early stopping's auto mode and a sweep's ranking, so both call the same trial best."""
    words = metric.lower().replace("-", "_").split("_")
    if not lower_by_name(metric) and any(w in HIGHER_WORDS for w in words):
        return Mode.max
    return Mode.min
