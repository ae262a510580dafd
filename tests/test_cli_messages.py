"""One-line messages for mistakes typed on the command line: they name what was typed."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.cli.compose import apply_overrides, compose_config
from hpcdl.cli.expand import plan_sweep
from hpcdl.errors import ConfigError

MODELS = "choose one of cnn, custom, mlp, resnet18"
OPTIMS = "choose one of adam, adamw, rmsprop, sgd"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["model=transformer"], f"model=transformer: unknown option; {MODELS}"),
        (
            ["task=regresion"],
            "task=regresion: unknown option; did you mean task=regression? (or choose one of "
            "classification, custom, regression)",
        ),
        (
            ["trainer.max_epochs=2", "optim=adamm"],
            f"optim=adamm: unknown option; did you mean optim=adam? (or {OPTIMS})",
        ),
        (["cluster=lcoal"], "cluster=lcoal: unknown option; did you mean cluster=local? (or "),
        (
            ["cluster=uni"],
            "cluster=uni: unknown option; choose one of cpu_partition, debug, devcluster, local, "
            "rivanna_a100, slurm; a profile of your own: --config-dir DIR with "
            "DIR/cluster/uni.yaml, or ~/.config/hpcdl/cluster/uni.yaml",
        ),
    ],
)
def test_a_bad_group_choice_on_the_command_line_names_the_override(
    overrides: list[str], expected: str
) -> None:
    """Not conf/config.yaml, whose defaults list Hydra names as the place of the choice."""
    with pytest.raises(ConfigError) as info:
        compose_config(overrides)
    assert str(info.value) == expected or (
        expected.endswith("(or ") and str(info.value).startswith(expected)
    )


def test_a_bad_group_choice_in_a_sweep_or_resume_names_the_override() -> None:
    with pytest.raises(ConfigError) as info:
        plan_sweep(["optim=sgd,sgdd"])
    assert str(info.value) == (
        f"trial 1 (optim=sgdd): optim=sgdd: unknown option; did you mean optim=sgd? (or {OPTIMS})"
    )
    with pytest.raises(ConfigError) as info:
        apply_overrides(compose_config([]), ["optim=adamm"])
    assert str(info.value) == f"optim=adamm: unknown option; did you mean optim=adam? (or {OPTIMS})"


def test_a_bad_group_choice_as_the_user_meets_it(hpcdl, tmp_path: Path) -> None:
    out = hpcdl("train", "model=transformer")
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == f"error: model=transformer: unknown option; {MODELS}"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["resume", "runs/reg2", "optim.lr=0.001", "--form", "660"],
            "hpcdl resume: unknown option --form; did you mean --from? (hpcdl resume --help)",
        ),
        (
            ["resume", "runs/reg2", "--form=660", "optim.lr=0.001"],
            "hpcdl resume: unknown option --form; did you mean --from? (hpcdl resume --help)",
        ),
        (
            ["train", "--dry-run", "--nope", "run_dir=r"],
            "hpcdl train: unknown option --nope (hpcdl train --help)",
        ),
        (
            ["sweep", "summary", "sw", "--metrc", "loss"],
            "hpcdl sweep summary: unknown option --metrc; did you mean --metric? "
            "(hpcdl sweep summary --help)",
        ),
        (
            ["predict", "r", "--split", "test", "--outptu", "p.csv"],
            "hpcdl predict: unknown option --outptu; did you mean --output? (hpcdl predict --help)",
        ),
        (
            ["run", "cluster=local", "--lr=0.1"],
            "hpcdl run: unknown option --lr; a program's own options go after --: "
            "hpcdl run [overrides] -- COMMAND ... (hpcdl run --help)",
        ),
        (["--verbose", "train"], "hpcdl: unknown option --verbose (hpcdl --help)"),
        (  # was argparse's "the following arguments are required: --failed"
            ["sweep", "rerun", "sw", "--faild"],
            "hpcdl sweep rerun: unknown option --faild; did you mean --failed? "
            "(hpcdl sweep rerun --help)",
        ),
    ],
)
def test_an_unknown_option_is_one_line_naming_the_command(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Not argparse's usage of the whole of hpcdl and `unrecognized arguments`."""
    from hpcdl.cli.main import main

    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: {expected}\n"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["evaluate", "runs/r1", "--split", "tset"],
            "hpcdl evaluate: argument --split: invalid choice: 'tset' (choose from 'test', "
            "'val', 'train', 'all'); did you mean test? (hpcdl evaluate --help)",
        ),
        (
            ["status"],
            "hpcdl status: the following arguments are required: RUN_DIR|JOB_ID "
            "(hpcdl status --help)",
        ),
        (["trian"], "did you mean train? (hpcdl --help)"),
        (
            [],
            "hpcdl: give a command: train, run, resume, status, logs, sweep, bench, cancel, "
            "completion, evaluate, predict (hpcdl --help)",
        ),
        (["sweep"], "hpcdl sweep: give a command: status, summary, rerun (hpcdl sweep --help)"),
        (["status", "--watch", "x", "r"], "argument --watch: invalid float value: 'x'"),
    ],
)
def test_argparses_own_errors_are_one_line_naming_the_command(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Were argparse's usage block (three lines for evaluate) and then the error."""
    from hpcdl.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: hpcdl") and err.count("\n") == 1 and expected in err, err


HYDRA_OWN = (
    "a setting of Hydra's own, which hpcdl does not read; set the run's folder with "
    "run_dir=... (a sweep's with -m hydra.sweep.dir=...)"
)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["train", "hydra.run.dir=runs/x"], f"hydra.run.dir: {HYDRA_OWN}"),
        (["run", "hydra.run.dir=runs/x", "--", "python", "-c", "1"], f"hydra.run.dir: {HYDRA_OWN}"),
        (["train", "-m", "+hydra.job.chdir=true", "seed=1,2"], f"hydra.job.chdir: {HYDRA_OWN}"),
        (
            ["train", "hydra.sweep.dir=sw"],
            "hydra.sweep.dir: the folder of a sweep's trials, and this is one run; add -m to "
            "sweep, or set run_dir=... for this run's folder",
        ),
    ],
)
def test_hydras_own_settings_are_refused_not_ignored(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Before, each was composed into the config and read by nothing: the run went to the
    default run dir, not the one typed."""
    from hpcdl.cli.main import main

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        assert main(argv) == 2
    assert capsys.readouterr().err == f"error: {expected}\n"
    assert list(tmp_path.iterdir()) == []


def test_overrides_mix_with_options_in_any_order() -> None:
    from hpcdl.cli.main import build_parser, parse_anywhere

    argv = ["resume", "r", "a=1", "--from", "best", "b=2", "--no-preflight", "c=3"]
    args = parse_anywhere(build_parser(), argv)
    assert (args.run_dir, args.from_checkpoint, args.no_preflight) == ("r", "best", True)
    assert args.overrides == ["a=1", "b=2", "c=3"]


def test_a_programs_own_options_after_the_double_dash_pass_through(hpcdl) -> None:
    program = ["python", "-c", "import sys; print(sys.argv[1:])", "--form", "-x", "a=1"]
    out = hpcdl("run", "run_dir=r1", "--", *program)
    assert out.returncode == 0, out.stderr
    assert "['--form', '-x', 'a=1']" in out.stdout


def fake_run(root: Path, steps: list[int]) -> Path:
    """A run dir with a config and checkpoint files by name only: the names are all that a
    refused --checkpoint reads."""
    from hpcdl.config.convert import save_config
    from hpcdl.rundir import RunDir

    run_dir = RunDir(root / "run")
    run_dir.checkpoint_dir.mkdir(parents=True)
    for step in steps:
        (run_dir.checkpoint_dir / f"step_{step:09d}.pt").write_bytes(b"")
    (run_dir.checkpoint_dir / "best.pt").write_bytes(b"")
    save_config(compose_config([f"run_dir={run_dir.path}"]), run_dir.config_file)
    return run_dir.path


def test_an_unknown_checkpoint_lists_what_is_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpcdl import Job
    from hpcdl.cli.main import main
    from hpcdl.errors import CheckpointError

    run = fake_run(tmp_path, [13, 26])
    monkeypatch.chdir(tmp_path)
    expected = (
        f"bset: no such checkpoint file, nor one in {run / 'checkpoints'} (the checkpoints "
        "there: step_000000013.pt, step_000000026.pt, best); give best, last (or newest), "
        "one of those names, or a checkpoint file's path"
    )
    assert main(["predict", "run", "--checkpoint", "bset", "--split", "test"]) == 2
    assert capsys.readouterr().err == f"error: {expected}\n"
    assert main(["evaluate", "run", "--checkpoint", "bset"]) == 2
    assert capsys.readouterr().err == f"error: {expected}\n"
    with pytest.raises(CheckpointError) as info:
        Job.from_run_dir(run).load_model("step_999.pt")
    assert str(info.value) == expected.replace("bset", "step_999.pt")


def test_a_run_without_best_pt_is_pointed_at_its_newest_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A run with data.val_fraction=0 saves no best.pt, and `evaluate` asks for it by default.
    from hpcdl.cli.main import main

    run = fake_run(tmp_path, [16, 32])
    (run / "checkpoints" / "best.pt").unlink()
    monkeypatch.chdir(tmp_path)
    assert main(["evaluate", "run"]) == 2
    assert capsys.readouterr().err == (
        f"error: {run}: no best.pt in {run / 'checkpoints'} (a run saves it at its best "
        "validated epoch: this one has no validation split, none so far, or it went on from a "
        "checkpoint older than its run's best.pt (hpcdl resume --from) and has not beaten that "
        "best yet); use its newest checkpoint: --checkpoint last\n"
    )


def test_a_long_list_of_checkpoints_is_shortened(tmp_path: Path) -> None:
    from hpcdl import Job
    from hpcdl.errors import CheckpointError

    run = fake_run(tmp_path, [10, 20, 30, 40, 50, 60, 70])
    with pytest.raises(CheckpointError) as info:
        Job.from_run_dir(run).load_model("step_999.pt")
    assert (
        "(the checkpoints there: step_000000010.pt, step_000000020.pt, (2 more), "
        "step_000000050.pt, step_000000060.pt, step_000000070.pt, best)"
    ) in str(info.value)


def test_ctrl_c_before_a_command_handles_it_is_one_line_and_status_130(tmp_path: Path) -> None:
    """A real SIGINT while a command runs without its own handler (a training run's comes
    only once it starts): no traceback, the shell's status for Ctrl-C."""
    import subprocess
    import sys

    program = (
        "import os, signal, sys\n"
        "import hpcdl.cli.main as m\n"
        "m.cmd_status = lambda args: os.kill(os.getpid(), signal.SIGINT)\n"
        "sys.exit(m.main(['status', 'anything']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip() == "interrupted (Ctrl-C)"


def test_ctrl_c_while_python_exits_after_a_completed_run_keeps_its_status(tmp_path: Path) -> None:
    """After `done:` the process still spends about a second in Python's exit (torch's and
    the plots' teardown); a Ctrl-C there ended a completed run with 130 and no word."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "hpcdl.cli.main", "train", "trainer.max_epochs=1", "run_dir=r"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("done:"):
            time.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            break
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (tmp_path / "r" / "summary.json").is_file()


@pytest.mark.parametrize(
    "value",
    [
        "prix (€)",  # before: cut at the space, "quote it: data.label_column='prix'"
        "price (usd)",  # before: Hydra's "Error parsing override ...", no fix
    ],
)
def test_a_value_hydra_cannot_read_is_quoted_whole_in_the_fix(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        compose_config(["data=files", "data.path=/tmp/x.csv", f"data.label_column={value}"])
    assert str(info.value) == (
        f"data.label_column={value}: Hydra cannot read this value unquoted; quote it: "
        f"\"data.label_column='{value}'\" (the double quotes are for the shell)"
    )


def test_regression_with_the_models_default_dropout_is_warned_about(tmp_path: Path) -> None:
    # Measured: val_r2 0.83 with the MLP's default 0.5 against 0.9997 with 0 (a linear target).
    import warnings

    from hpcdl.cli.main import warn_regression_dropout
    from hpcdl.errors import HpcdlWarning

    (tmp_path / "h.csv").write_text("a,y\n1,2\n")
    regression = ["task=regression", "data=files", f"data.path={tmp_path / 'h.csv'}"]
    with pytest.warns(HpcdlWarning, match=r"^task=regression with model.dropout=0.5, model=mlp"):
        warn_regression_dropout(compose_config(regression), regression)
    with pytest.warns(HpcdlWarning, match=r"model.dropout=0.25, model=cnn's default"):
        cnn = [*regression, "model=cnn"]
        warn_regression_dropout(compose_config(cnn), cnn)
    quiet = [
        [*regression, "model.dropout=0.5"],  # chosen: meant
        [*regression, "model.dropout=0"],
        [*regression, "model=resnet18"],
        ["data=files", f"data.path={tmp_path / 'h.csv'}"],  # classification
    ]
    for overrides in quiet:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            warn_regression_dropout(compose_config(overrides), overrides)


def test_a_checkpoint_given_for_the_run_dir_is_named_with_its_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpcdl.cli.main import main

    run = fake_run(tmp_path, [13, 26])
    monkeypatch.chdir(tmp_path)
    for command, name in (("resume", "step_000000026.pt"), ("evaluate", "best.pt")):
        assert main([command, f"run/checkpoints/{name}"]) == 2
        shown = "best" if name == "best.pt" else name
        assert capsys.readouterr().err == (
            f"error: run/checkpoints/{name}: a checkpoint of the run {run}; pass the run dir, "
            f"and the checkpoint as `hpcdl resume {run} --from {shown}` or `--checkpoint "
            f"{shown}` (evaluate, predict)\n"
        )
