"""One-line messages as users meet them: a sweep value without -m, counts in words."""

from __future__ import annotations

from pathlib import Path


def test_a_comma_list_without_m_names_the_override_and_says_add_m(hpcdl, tmp_path: Path) -> None:
    cases = [
        (
            ["train", "optim.lr=0.1,0.01"],
            "error: optim.lr=0.1,0.01: several values are a sweep: add -m for one run per "
            "value; for one value, quote it: \"optim.lr='0.1,0.01'\" or write a list: "
            "optim.lr=[0.1,0.01]",
        ),
        # A group's options: no string to quote.
        (["train", "model=mlp,cnn"], "error: model=mlp,cnn: several values are a sweep: add -m"),
        (["train", "optim.lr=range(1,3)"], "error: optim.lr=range(1,3): several values"),
        # hpcdl run -m sweeps the program's command only: -m would not help.
        (
            ["run", "cluster.gpus_per_node=1,2", "--", "echo", "hi"],
            "error: cluster.gpus_per_node=1,2: hpcdl run takes one value per key (its -m "
            "sweeps only the lists in the command after --",
        ),
    ]
    for args, expected in cases:
        out = hpcdl(*args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(expected), (args, out.stderr)
        if args[0] == "train":
            assert lines[0].endswith(("add -m for one run per value", "[0.1,0.01]")), lines
    assert list(tmp_path.iterdir()) == []


def test_counts_of_one_are_singular() -> None:
    from hpcdl.config.schema import EarlyStoppingConfig
    from hpcdl.early_stop import nothing_to_train_line
    from hpcdl.errors import plural
    from hpcdl.nothing_to_train import limit_reached_line
    from hpcdl.state import Progress

    assert [plural(n, "trial") for n in (0, 1, 2)] == ["0 trials", "1 trial", "2 trials"]
    line = limit_reached_line(Progress(epoch=1, global_step=5), max_epochs=1, max_steps=None)
    assert line is not None and line.startswith("the run has trained 1 epoch, trainer."), line
    line = limit_reached_line(Progress(epoch=0, global_step=1), max_epochs=3, max_steps=1)
    assert line is not None and line.startswith("the run has taken 1 step, trainer."), line
    stopped = Progress(
        epoch=2, best_metric=0.5, best_epoch=1, num_evals_without_improvement=1, early_stopped=True
    )
    line = nothing_to_train_line(stopped, None, EarlyStoppingConfig(patience=1))
    assert "did not improve on epoch 1's 0.5 in 1 evaluation, trainer." in line, line


def test_a_sweep_of_one_trial_says_1_trial(hpcdl) -> None:
    out = hpcdl("train", "-m", "optim.lr=choice(0.1)", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("1 trial:\n"), out.stdout
