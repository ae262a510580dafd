"""trainer.early_stopping.mode left at its default (null, auto): the monitored metric's own
direction decides best.pt, early stopping, the checkpoint's record and a sweep's ranking."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from hpcdl.config.schema import EarlyStoppingConfig, Mode
from hpcdl.errors import ConfigError
from hpcdl.state import Progress


@pytest.mark.parametrize(
    ("monitor", "mode"),
    [
        ("val_loss", Mode.min),
        ("train_loss", Mode.min),
        ("val_mae", Mode.min),
        ("val_r2", Mode.max),
        ("val_accuracy", Mode.max),
        ("val_dice", Mode.max),  # a custom task's: guessed from the name
        ("val_f1", Mode.max),
        ("val_error_rate", Mode.min),
        ("val_dist", Mode.min),  # a distance
        ("val_wobble", Mode.min),  # reads like neither: min, the default before auto
        # Scores biologists use, taken as losses before (persona, sweeps): best.pt kept the worst.
        ("val_pearson", Mode.max),
        ("val_spearman_r", Mode.max),
        ("val_auroc", Mode.max),
        ("val_mcc", Mode.max),
    ],
)
def test_auto_mode_is_the_monitors_direction_and_an_explicit_mode_wins(
    monitor: str, mode: Mode
) -> None:
    from hpcdl.config.metrics import monitor_mode

    assert EarlyStoppingConfig().mode is None  # the default is auto
    assert monitor_mode(monitor, None) == mode
    other = Mode.max if mode == Mode.min else Mode.min
    assert monitor_mode(monitor, other) == other


STEPS = """
import torch.nn.functional as F


def step(model, batch):
    x, y = batch
    loss = F.cross_entropy(model(x), y)
    return loss, {"wobble": 1.0, "pearson": 0.5}
"""


def test_a_monitor_whose_name_reads_as_neither_is_warned_about_as_training_starts(
    hpcdl, tmp_path: Path
) -> None:
    (tmp_path / "wobbly.py").write_text(STEPS)
    common = ["task=custom", "task.target=wobbly:step", "trainer.max_epochs=1"]
    env = {"PYTHONPATH": str(tmp_path)}
    out = hpcdl("train", "run_dir=a", *common, "trainer.early_stopping.monitor=val_wobble", env=env)
    assert out.returncode == 0, out.stderr
    warning = (
        "warning: trainer.early_stopping.monitor=val_wobble: its name says neither whether "
        "lower or higher is better; best.pt and early stopping take lower (min). Set "
        "trainer.early_stopping.mode=max if higher is better (or =min to say so)"
    )
    assert out.stdout.splitlines().count(warning) == 1, out.stdout
    said = "trainer.early_stopping.monitor=val_wobble", "trainer.early_stopping.mode=min"
    for extra in (["trainer.early_stopping.monitor=val_pearson"], said):
        out = hpcdl("train", f"run_dir=b{len(extra)}", *common, *extra, env=env)
        assert out.returncode == 0 and "warning: trainer.early_stopping" not in out.stdout, (
            out.stdout
        )


def test_the_composed_default_is_auto() -> None:
    from hpcdl.cli.compose import compose_config

    es = compose_config(["trainer.early_stopping.monitor=val_accuracy"]).trainer.early_stopping
    assert es.mode is None
    assert compose_config(["trainer.early_stopping.mode=min"]).trainer.early_stopping.mode == (
        Mode.min
    )
    # 'auto', the word the docs use for null, is null; anything else names its choices
    auto = compose_config(["trainer.early_stopping.mode=auto"]).trainer.early_stopping
    assert auto.mode is None
    with pytest.raises(ConfigError, match=r"^trainer.early_stopping.mode: .*min, max.*auto"):
        compose_config(["trainer.early_stopping.mode=highest"])


def test_a_regression_run_monitoring_val_r2_keeps_its_highest_epoch(hpcdl, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 3))
    y = 3 * x[:, 0] - 2 * x[:, 1] + 0.5 * x[:, 2] + rng.normal(scale=0.3, size=300)
    rows = [
        "a,b,c,target",
        *(",".join(f"{v:.4f}" for v in (*r, t)) for r, t in zip(x, y, strict=True)),
    ]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    out = hpcdl(
        "train",
        "run_dir=run",
        "data=files",
        "data.path=train.csv",
        "data.label_column=target",
        "task=regression",
        "trainer.early_stopping.monitor=val_r2",
        "trainer.max_epochs=4",
    )
    assert out.returncode == 0, out.stderr
    r2 = [float(r["val_r2"]) for r in csv.DictReader((tmp_path / "run/metrics.csv").open())]
    assert r2.index(max(r2)) != r2.index(min(r2)), r2  # the test can tell the two modes apart
    s = json.loads((tmp_path / "run/summary.json").read_text())
    assert (s["best_metric"], s["best_epoch"]) == (max(r2), r2.index(max(r2)) + 1), (s, r2)
    # config.yaml keeps what was asked for (auto), so a resume that changes the monitor
    # changes the direction with it.
    assert "  mode: null\n" in (tmp_path / "run/config.yaml").read_text()


def test_a_checkpoint_records_the_resolved_mode_and_an_old_min_is_no_change() -> None:
    from hpcdl import early_stop

    auto = EarlyStoppingConfig()
    assert early_stop.settings(auto)["mode"] == "min"
    assert early_stop.settings(EarlyStoppingConfig(monitor="val_r2"))["mode"] == "max"
    # A run saved before auto (mode "min" on record) that stopped early, resumed with auto
    # for val_loss: the same settings, so it stays stopped.
    stopped = Progress(epoch=4, best_metric=0.2, best_epoch=2, num_evals_without_improvement=2)
    stopped.early_stopped = True
    old = {**early_stop.settings(auto), "mode": "min", "patience": 2}
    resumed = early_stop.resumed(stopped, old, EarlyStoppingConfig(patience=2))
    assert resumed.early_stopped and resumed.best_metric == 0.2
    # An old val_r2 run kept its "min" (the default then): auto is max now, a change in
    # direction, so its best is forgotten and it trains on.
    old_r2 = {**old, "monitor": "val_r2"}
    r2 = early_stop.resumed(stopped, old_r2, EarlyStoppingConfig(monitor="val_r2", patience=2))
    assert not r2.early_stopped and r2.best_metric is None
    assert "mode min -> max" in early_stop.going_on_line(
        r2, old_r2, EarlyStoppingConfig(monitor="val_r2", patience=2)
    )


def test_a_sweep_of_trials_monitoring_val_r2_ranks_the_highest_first(
    tmp_path: Path, capsys
) -> None:
    from hpcdl.cli.expand import plan_sweep
    from hpcdl.cli.main import main
    from tests.test_sweeps import _completed_sweep, _ranked

    (tmp_path / "houses.csv").write_text("rooms,price\n3,200\n4,260\n")
    plan = plan_sweep(
        [
            "task=regression",
            "data=files",
            f"data.path={tmp_path / 'houses.csv'}",
            "data.label_column=price",
            "trainer.early_stopping.monitor=val_r2",
            "optim.lr=0.1,0.01,0.001",
            f"hydra.sweep.dir={tmp_path / 'sw'}",
        ]
    )
    sweep = _completed_sweep(plan, [{"val_r2": 0.5}, {"val_r2": 0.9}, {"val_r2": 0.1}])
    assert main(["sweep", "summary", str(sweep)]) == 0  # the default metric: the monitor
    out = capsys.readouterr().out
    assert out.startswith(
        "ranked by val_r2, highest first (the trials' trainer.early_stopping.mode, auto: max);"
    ), out
    assert _ranked(out) == ["optim.lr=0.01", "optim.lr=0.1", "optim.lr=0.001"]


@pytest.mark.parametrize(
    ("metric", "mode"),
    [
        ("val_ce", Mode.min),  # a cross-entropy: ranked highest first before (the worst trial best)
        ("val_kl", Mode.min),
        ("val_macro_f1", Mode.max),
        ("mean_reward", Mode.max),
        ("val_thing", Mode.min),  # reads like neither: min, as early stopping always had it
    ],
)
def test_a_sweep_ranks_an_unknown_metric_as_early_stopping_chooses_its_best(
    metric: str, mode: Mode
) -> None:
    from hpcdl.config.metrics import monitor_mode
    from hpcdl.sweep.direction import direction
    from hpcdl.sweep.ledger import Ledger

    assert monitor_mode(metric, None) == mode
    empty = Ledger("/nowhere", "local", "local", swept_keys=[], common_overrides=[])
    assert direction(empty, metric).mode == mode
