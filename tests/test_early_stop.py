"""Early stopping across a resume (hpcdl.early_stop), as pure functions of the progress."""

from __future__ import annotations

from hpcdl import early_stop
from hpcdl.config.schema import EarlyStoppingConfig, Mode
from hpcdl.state import Progress

STOPPED = Progress(epoch=24, best_metric=0.98, best_epoch=21, num_evals_without_improvement=3)
STOPPED.early_stopped = True
PATIENCE_3 = EarlyStoppingConfig(monitor="val_accuracy", mode=Mode.max, patience=3)


def test_the_settings_it_stopped_under_stop_it_and_others_let_it_go_on() -> None:
    saved = early_stop.settings(PATIENCE_3)
    assert early_stop.resumed(STOPPED, saved, PATIENCE_3) is STOPPED
    for patience in (0, 5):
        es = EarlyStoppingConfig(monitor="val_accuracy", mode=Mode.max, patience=patience)
        on = early_stop.resumed(STOPPED, saved, es)
        assert not on.early_stopped
        assert (on.best_metric, on.num_evals_without_improvement) == (0.98, 3)  # kept
    assert STOPPED.early_stopped  # the loaded progress is not changed


def test_another_monitor_tracks_its_best_anew() -> None:
    on = early_stop.resumed(STOPPED, early_stop.settings(PATIENCE_3), EarlyStoppingConfig())
    assert not on.early_stopped
    assert (on.best_metric, on.best_epoch, on.num_evals_without_improvement) == (None, None, 0)


def test_a_checkpoint_without_the_settings_goes_on_where_these_would_not_stop_it() -> None:
    assert early_stop.resumed(STOPPED, None, PATIENCE_3).early_stopped
    assert not early_stop.resumed(STOPPED, None, EarlyStoppingConfig(patience=4)).early_stopped
    assert early_stop.resumed(STOPPED, None, EarlyStoppingConfig(target=0.1)).early_stopped


def test_a_run_that_did_not_stop_early_is_untouched() -> None:
    running = Progress(epoch=3, num_evals_without_improvement=1)
    assert early_stop.resumed(running, None, EarlyStoppingConfig(patience=1)) is running


def test_the_line_says_why_it_stopped_and_how_to_go_on() -> None:
    target = EarlyStoppingConfig(monitor="val_accuracy", mode=Mode.max, target=0.95)
    line = early_stop.nothing_to_train_line(STOPPED, early_stop.settings(target), target)
    assert line == (
        "the run stopped early after epoch 24 (val_accuracy reached "
        "trainer.early_stopping.target=0.95): nothing to train; to train on, resume with "
        "trainer.early_stopping.target=null or another target"
    )
