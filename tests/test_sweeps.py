"""Sweeps: Hydra's sweep syntax, refusal of bad trials, the ledger, local pool, rerun, k-fold."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from hpcdl.cli.expand import plan_sweep
from hpcdl.errors import ConfigError, HpcdlError


def test_lists_range_choice_and_glob_expand_like_hydra() -> None:
    plan = plan_sweep(["model=mlp,cnn", "data=digits", "optim.lr=choice(0.1,0.01)"])
    assert [t.overrides for t in plan.trials] == [
        ["model=mlp", "optim.lr=0.1"],
        ["model=mlp", "optim.lr=0.01"],
        ["model=cnn", "optim.lr=0.1"],
        ["model=cnn", "optim.lr=0.01"],
    ]
    assert plan.common == ["data=digits"] and plan.swept_keys == ["model", "optim.lr"]
    folds = plan_sweep(["data.num_folds=4", "data.fold=range(0,4)"])
    assert [t.config.data.fold for t in folds.trials] == [0, 1, 2, 3]
    globbed = plan_sweep(["optim=glob(adam*)"])
    assert [t.overrides for t in globbed.trials] == [["optim=adam"], ["optim=adamw"]]


def test_a_float_range_gives_the_values_people_write() -> None:
    """Hydra adds a float range's step up in binary: range(0.1,0.5,0.1) gave a trial
    optim.lr=0.30000000000000004 and range(0.7,1.0,0.1) a fourth one at the stop, 1.0.
    Rounded to the decimals given, and the stop left out as in Python; shuffle() kept."""
    plan = plan_sweep(["optim.lr=range(0.1,0.5,0.1)"])
    lrs = ("0.1", "0.2", "0.3", "0.4")
    assert [t.overrides for t in plan.trials] == [[f"optim.lr={v}"] for v in lrs]
    assert [t.config.optim.lr for t in plan.trials] == [0.1, 0.2, 0.3, 0.4]
    up_to = plan_sweep(["model.dropout=range(0.7,1.0,0.1)"])
    assert [t.config.model.dropout for t in up_to.trials] == [0.7, 0.8, 0.9]
    down = plan_sweep(["optim.lr=tag(log,range(0.5,0.1,-0.1))"])
    assert [t.config.optim.lr for t in down.trials] == [0.5, 0.4, 0.3, 0.2]
    shuffled = plan_sweep(["optim.lr=shuffle(range(0.1,0.5,0.1))"])
    assert sorted(t.config.optim.lr for t in shuffled.trials) == [0.1, 0.2, 0.3, 0.4]


def test_each_trial_config_equals_composing_it_from_scratch(monkeypatch) -> None:
    # The sweep composes once per distinct group choice (model x optim: 4 here), then
    # applies the scalar keys; every trial must come out as compose_config makes it alone.
    from hpcdl.cli import compose as compose_mod
    from hpcdl.cli.compose import compose_config
    from hpcdl.cli.expand import expand_sweep
    from hpcdl.config.convert import to_plain

    overrides = [
        "optim.lr=0.1,0.01",  # a value of a group given before the group's choice
        "model=mlp,cnn",
        "data=digits",
        "optim=sgd,adam",
        "model.dropout=0.25",
        "trainer.early_stopping.patience=3",
        "cluster.partition=gpu",  # not in cluster=debug's YAML: added (+) as compose does
        "cluster.env.MY_FLAG=1",
    ]
    compositions = []
    real_compose = compose_mod.compose
    monkeypatch.setattr(
        compose_mod,
        "compose",
        lambda ovs, dirs=None: compositions.append(ovs) or real_compose(ovs, dirs),
    )
    plan = plan_sweep(overrides)
    assert len(compositions) == 4, compositions
    combos = expand_sweep(overrides).combos
    assert len(plan.trials) == len(combos) == 8
    seen = set()
    for trial, combo in zip(plan.trials, combos, strict=True):
        alone = to_plain(compose_config(combo))
        assert to_plain(trial.config) == alone, combo
        seen.add((alone["model"]["name"], alone["optim"]["name"], alone["optim"]["lr"]))
        assert alone["cluster"]["partition"] == "gpu"
        assert alone["cluster"]["env"] == {"MY_FLAG": "1"}
    assert len(seen) == 8


@pytest.mark.parametrize(
    "overrides",
    [
        ["optim.lr=0.5", "optim=adam", "optim.lr=0.2"],  # the last value wins, as in Hydra
        ["+optim.lr=0.5"],  # Hydra refuses + on a key that exists
        ["++optim.lr=0.5", "~model.dropout"],
        ["trainer.max_epoch=1"],  # unknown key: the same one-line error
        ["optim=adam", "optim.momentum=0.9"],  # a key of another optim
        ["model=cnn"],  # cnn on breast cancer's flat rows: refused by validate
        ["model=zz"],
        ["trainer.seed=[1"],  # bad override syntax
        ["init_from=/nonexistent"],
        ["hydra.job.name=x", "optim.lr=0.3"],  # composed from scratch
    ],
)
def test_sweep_composer_gives_what_compose_config_gives(overrides) -> None:
    from hpcdl.cli.compose import SweepComposer, compose_config

    def outcome(make):
        try:
            return make(overrides)
        except ConfigError as err:
            return f"error: {err}"

    composer = SweepComposer()
    assert outcome(composer.config) == outcome(compose_config)
    assert outcome(composer.config) == outcome(compose_config)  # a second time: reused


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["data.fold=range(0,0)"], "data.fold=range(0,0): empty sweep for data.fold"),
        (
            ["trainer.max_epoch=1,2"],
            "trial 0 (trainer.max_epoch=1): trainer.max_epoch: unknown key",
        ),
        (["optim.lr=0.1,-1"], "trial 1 (optim.lr=-1): optim.lr=-1.0: must be > 0"),
        (["model=mlp,cnn"], "trial 1 (model=cnn): model=cnn needs image samples"),
        (["trainer.max_epochs=2"], "no swept key; give the values to try as a=1,2"),
        # What one config refuses is said first; choice() was to be quoted; a shared key
        # was trial 0's fault (persona, sweeps).
        (["optim.lr="], "optim.lr=: must be a number"),
        (
            ["optim.lr=choice()"],
            "optim.lr=choice(): choice() needs values to try, e.g. optim.lr=choice(0.1,0.01)",
        ),
        (
            ["optim.lr=0.1,0.2", "cluster.array_parallelism=-1"],
            "cluster.array_parallelism=-1: must be >= 0",
        ),
        (
            ["optim.lr=[0.1,0.01]"],
            "no swept key: optim.lr=[0.1,0.01] is one value (a list); to try each, write "
            "optim.lr=0.1,0.01",
        ),
        (["optim.lr=interval(0.01,0.1)"], "interval() is a range for an adaptive search"),
        (["optim.lr=tag(log,interval(0.01,0.1))"], "interval() is a range for an adaptive"),
        (["run_dir=x", "optim.lr=1,2"], "run_dir: a sweep gives each trial its own run dir"),
        (["model=glob(zz*)"], "the glob matches no model option"),
        # The usual typo, a space after a comma: Hydra's token list or its lexer's name for
        # the error named no word (persona, sweeps).
        (
            ["data=digits", "optim.lr=0.1,", "0.01"],
            "optim.lr=0.1,: ends in a comma; a list of values is one word, commas without "
            "spaces (optim.lr=0.1,0.01), or quote the whole override",
        ),
        (
            ["data=digits", "optim.lr=0.1,0.01", "0.03"],
            "0.03: not an override (key=value); a list of values is one word, commas without "
            "spaces (optim.lr=0.1,0.01,0.03), or quote the whole override",
        ),
    ],
)
def test_bad_sweeps_are_refused_naming_trial_and_key(overrides, expected) -> None:
    with pytest.raises(ConfigError) as info:
        plan_sweep(overrides)
    assert expected in str(info.value)
    if "trial" not in expected:
        assert not str(info.value).startswith("trial")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["optim.lr=0.1,0.1"],
            "optim.lr=0.1,0.1: 0.1 is given twice; give each value of optim.lr once (optim.lr=0.1)",
        ),
        (
            ["data=digits", "optim.lr=0.1,0.01,1e-2"],
            "optim.lr=0.1,0.01,1e-2: 0.01 is given twice; give each value of optim.lr once "
            "(optim.lr=0.1,0.01)",
        ),
        (["model=mlp,mlp"], "model=mlp,mlp: mlp is given twice; give each value of model once"),
        (["trainer.seed=range(0,3)", "optim.lr=choice(0.1,0.1)"], "0.1 is given twice;"),
        (
            ["optim.lr=0.1,0.2", "trainer.seed=1", "optim.lr=0.3"],
            "optim.lr=0.1,0.2 optim.lr=0.3: optim.lr is given twice (Hydra's sweep would keep "
            "the last alone); give all its values in one override (optim.lr=0.1,0.2,0.3)",
        ),
        (
            ["optim.lr=0.1", "optim.lr=range(1,3)"],
            "optim.lr=0.1 optim.lr=range(1,3): optim.lr is given twice (Hydra's sweep would keep "
            "the last alone); give all its values in one override\n",
        ),
    ],
)
def test_a_swept_key_or_value_given_twice_is_refused(overrides, expected) -> None:
    # Before: optim.lr=0.1,0.1 made two trials alike, and optim.lr=0.1,0.2 optim.lr=0.3
    # one trial of 0.3 (Hydra's basic sweeper keeps a repeated key's last value alone).
    with pytest.raises(ConfigError) as info:
        plan_sweep(overrides)
    assert expected in str(info.value) + "\n"


def test_a_key_swept_nowhere_may_repeat_and_the_last_wins() -> None:
    plan = plan_sweep(["trainer.seed=1", "trainer.seed=2", "optim.lr=0.1,0.2"])
    assert [t.config.trainer.seed for t in plan.trials] == [2, 2]


def test_new_sweep_arrays_come_from_its_plan_and_a_rerun_reads_its_run_dirs(
    tmp_path: Path, monkeypatch
) -> None:
    from hpcdl.launch import slurm
    from hpcdl.sweep import launch

    overrides = ["cluster=rivanna_a100", "cluster.gpus_per_node=1,2", "optim.lr=0.1,0.01"]
    plan = plan_sweep([*overrides, f"hydra.sweep.dir={tmp_path / 'sw'}"])
    ledger = launch.create_sweep(plan)
    arrays: list[tuple[int, list[str]]] = []

    class Executor:  # submitit's SlurmExecutor, without sbatch
        def __init__(self, cfg) -> None:
            self.gpus = cfg.cluster.gpus_per_node

        def update_parameters(self, **_) -> None:
            pass

        def map_array(self, _fn, run_dirs):
            arrays.append((self.gpus, [Path(d).name for d in run_dirs]))
            return [SimpleNamespace(job_id=f"{len(arrays)}_{k}") for k in range(len(run_dirs))]

    monkeypatch.setattr(slurm, "make_executor", lambda cfg, _base, job_name=None: Executor(cfg))
    monkeypatch.setattr(launch, "max_array_size", lambda: 1001)
    reads: list[str] = []
    real_open = launch.open_run_dir
    monkeypatch.setattr(launch, "open_run_dir", lambda ref: reads.append(ref) or real_open(ref))

    planned = {t.index: t.config for t in plan.trials}
    assert launch.submit_arrays(ledger, [0, 1, 2, 3], planned) == ["1", "2"]
    assert reads == []  # the configs just planned, none read back
    assert arrays == [(1, ["0", "1"]), (2, ["2", "3"])]
    assert [(t.job_id, t.attempts) for t in ledger.trials] == [
        ("1_0", 1),
        ("1_1", 1),
        ("2_0", 1),
        ("2_1", 1),
    ]
    from_plan = list(arrays)
    arrays.clear()
    assert launch.submit_arrays(ledger, [0, 1, 2, 3]) == ["1", "2"]  # as `sweep rerun` does
    assert len(reads) == 4 and arrays == from_plan
    assert [t.attempts for t in ledger.trials] == [2, 2, 2, 2]


class _RecordingExecutor:
    """submitit's SlurmExecutor without sbatch: each array's trials and the parameters it
    was given (job ids 1_0, 1_1, ... for the first array; a lone trial a plain job)."""

    def __init__(self, arrays: list[dict], cfg, base) -> None:
        from hpcdl.launch.slurm import job_parameters

        self.arrays = arrays
        extra = job_parameters(cfg, base)["additional_parameters"]
        self.parameters: dict = {"additional_parameters": extra}

    def update_parameters(self, **params) -> None:
        self.parameters.update(params)

    def map_array(self, _fn, run_dirs):
        self.arrays.append({"trials": [Path(d).name for d in run_dirs], **self.parameters})
        n = len(self.arrays)
        if len(run_dirs) == 1:
            return [SimpleNamespace(job_id=str(n))]
        return [SimpleNamespace(job_id=f"{n}_{k}") for k in range(len(run_dirs))]


def test_arrays_split_for_max_array_size_hold_array_parallelism_across_them(
    tmp_path: Path, monkeypatch
) -> None:
    """Split arrays each had `%N`: two arrays ran 2N trials at once. A later array now waits
    for the one before it (afterany: however it ended), so at most N run at once, and
    every trial still runs. Without a limit, or in one array, nothing changes."""
    from hpcdl.launch import slurm
    from hpcdl.sweep import launch

    arrays: list[dict] = []
    monkeypatch.setattr(
        slurm, "make_executor", lambda cfg, base, **_: _RecordingExecutor(arrays, cfg, base)
    )
    monkeypatch.setattr(launch, "max_array_size", lambda: 3)  # at most 2 trials an array

    def submitted(name: str, *overrides: str) -> list[str]:
        lrs = "optim.lr=0.1,0.05,0.02,0.01,0.005"
        plan = plan_sweep(
            ["cluster=rivanna_a100", lrs, *overrides, f"hydra.sweep.dir={tmp_path / name}"]
        )
        arrays.clear()
        return launch.submit_arrays(launch.create_sweep(plan), [0, 1, 2, 3, 4])

    assert submitted("limited", "cluster.array_parallelism=2") == ["1", "2", "3"]
    assert [a["trials"] for a in arrays] == [["0", "1"], ["2", "3"], ["4"]]
    assert [a.get("array_parallelism") for a in arrays] == [2, 2, 2]
    assert [a["additional_parameters"].get("dependency") for a in arrays] == [
        None,
        "afterany:1",
        "afterany:2",
    ]
    assert all(a["additional_parameters"]["signal"] == "USR2@180" for a in arrays)  # kept
    # A dependency of the user's own (cluster.sbatch_extra) is kept: both must hold.
    submitted("own", "cluster.array_parallelism=2", "+cluster.sbatch_extra.dependency=after:7")
    assert arrays[1]["additional_parameters"]["dependency"] == "after:7,afterany:1"
    # No limit: the arrays run side by side, as before.
    submitted("unlimited")
    assert [a["additional_parameters"].get("dependency") for a in arrays] == [None] * 3
    monkeypatch.setattr(launch, "max_array_size", lambda: 1001)
    submitted("fits", "cluster.array_parallelism=2")
    assert arrays == [
        {
            "trials": ["0", "1", "2", "3", "4"],
            "additional_parameters": {"signal": "USR2@180", "requeue": True},
            "array_parallelism": 2,
        }
    ]


def test_a_split_sweeps_dry_run_shows_each_array_as_submitted(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """The dry run of a sweep larger than MaxArraySize printed one `--array=0-1499%3`
    script, which sbatch refuses; it now shows the split the submission makes."""
    from hpcdl.cli.main import main
    from hpcdl.sweep import launch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launch, "max_array_size", lambda: 3)
    args = ["train", "-m", "cluster=devcluster", "optim.lr=0.1,0.05,0.02,0.01,0.005"]
    assert main([*args, "hydra.sweep.dir=sw", "cluster.array_parallelism=1", "--dry-run",
                 "--no-preflight"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert (
        "# 5 trials in 3 job arrays: MaxArraySize=3, so at most 2 trials in one; each waits "
        "for the one before it to end (--dependency=afterany), so that at most "
        "cluster.array_parallelism=1 of the 5 trials run at once\n"
        "# job array 1 of 3: trials 0-1\n#!/bin/bash\n"
    ) in out, out
    assert "#SBATCH --array=0-1%1\n" in out and "--array=0-4" not in out
    assert (
        "# job array 2 of 3: trials 2-3: the script of job array 1, with\n"
        "#SBATCH --dependency=afterany:<job array 1>\n# job 3 of 3: trial 4\n#!/bin/bash\n"
    ) in out, out
    # The last, a lone trial, is a plain job: its whole script, waiting for array 2.
    last = out.split("# job 3 of 3: trial 4\n")[1]
    assert "#SBATCH --dependency=afterany:<job array 2>\n" in last and "--array" not in last
    assert "/sw/logs/%j_0_log.out" in last
    assert out.count("#!/bin/bash") == 2
    # A sweep that fits in one array: one script, as before, no word of a split.
    monkeypatch.setattr(launch, "max_array_size", lambda: 1001)
    assert main([*args, "hydra.sweep.dir=sw2", "cluster.array_parallelism=1", "--dry-run",
                 "--no-preflight"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out.count("#!/bin/bash") == 1 and "#SBATCH --array=0-4%1\n" in out
    assert "job array" not in out and "dependency" not in out, out


def test_a_cluster_key_sweeps_dry_run_says_which_trials_each_script_runs(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """Trials with different cluster keys go in different job arrays (an array's tasks share
    its #SBATCH header); the dry run printed their scripts one after the other without
    saying which trials each runs, nor which trial an array task is."""
    from hpcdl.cli.main import main
    from hpcdl.sweep import launch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launch, "max_array_size", lambda: 1001)
    args = ["train", "-m", "cluster=devcluster", "optim.lr=0.1,0.01,0.001"]
    assert main([*args, "cluster.nodes=1,2", "--dry-run", "--no-preflight"]) == 0
    out = capsys.readouterr().out
    one = "# cluster config 1 of 2: trials 0, 2, 4, one job array (its tasks 0-2, in this order)\n"
    two = "# cluster config 2 of 2: trials 1, 3, 5, one job array (its tasks 0-2, in this order)\n"
    assert one in out and two in out, out
    first, second = out.split(one)[1].split(two)
    assert "#SBATCH --nodes=1\n" in first and "#SBATCH --nodes=2\n" in second
    assert out.count("#!/bin/bash") == 2
    # A lone trial of its cluster config is a plain job.
    assert main(["train", "-m", "cluster=devcluster", "cluster.nodes=1,2", "--dry-run",
                 "--no-preflight"]) == 0  # fmt: skip
    assert "# cluster config 2 of 2: trial 1, one plain job\n" in capsys.readouterr().out


def test_two_reruns_at_once_submit_a_failed_trial_once(tmp_path: Path, monkeypatch, capsys) -> None:
    # Before: both decided from the states before either submitted, and both submitted.
    from hpcdl.cli import sweep_cmd as cli
    from hpcdl.sweep import launch, report
    from hpcdl.sweep import ledger as ledger_mod

    plan = plan_sweep(
        ["cluster=rivanna_a100", "optim.lr=0.1,0.01", f"hydra.sweep.dir={tmp_path}/sw"]
    )
    ledger = launch.create_sweep(plan)
    ledger.trials[0].state, ledger.trials[1].state = "COMPLETED", "FAILED"
    ledger_mod.save(ledger)
    real_refresh = report.refresh

    def refresh_then_the_other_rerun_submits(sweep_dir: Path, metric=None):
        seen = real_refresh(sweep_dir, metric)
        with ledger_mod.locked(sweep_dir) as led:
            led.trials[1].job_id, led.trials[1].state = "7_0", "PENDING"
        return seen

    submitted: list[list[int]] = []
    monkeypatch.setattr(report, "refresh", refresh_then_the_other_rerun_submits)
    monkeypatch.setattr(launch, "submit_arrays", lambda _led, idx: submitted.append(idx) or [])
    assert cli.rerun_failed(tmp_path / "sw") == ([], 0)
    assert submitted == []
    assert capsys.readouterr().out == (
        "no failed trials to rerun (a rerun beside this one submitted them)\n"
    )


def test_a_trial_resumed_by_hand_runs_its_sweeps_frozen_code(tmp_path: Path, monkeypatch) -> None:
    # Before: its job froze the code of the moment into the trial's own code/, so a
    # resume ran other code than `sweep rerun` and the trial's array task did.
    from hpcdl.launch import slurm
    from hpcdl.rundir import RunDir, SweepDir, open_run_dir
    from hpcdl.sweep import launch

    plan = plan_sweep(
        ["cluster=rivanna_a100", "optim.lr=0.1,0.01", f"hydra.sweep.dir={tmp_path}/sw"]
    )
    launch.create_sweep(plan)
    sweep = SweepDir(tmp_path / "sw")
    bases: list[Path] = []

    class Executor:
        def submit(self, _fn, _run_dir):
            return SimpleNamespace(job_id="9")

    def make_executor(_cfg, base, job_name=None):
        bases.append(base.path)
        return Executor()

    monkeypatch.setattr(slurm, "make_executor", make_executor)
    cfg, trial = open_run_dir(sweep.path / "1")
    slurm.submit(cfg, trial)
    assert bases == [sweep.path] and not trial.code_dir.exists()
    assert RunDir(trial.path).rank_log("9", 0) == sweep.log_dir / "9_0_log.out"
    text = slurm.sbatch_text(cfg, trial.job_base())
    assert f"export PYTHONPATH={sweep.code_dir}$" in text


def test_an_array_sbatch_refuses_is_one_line_and_a_sweep_never_submitted_is_removed(
    tmp_path: Path, monkeypatch
) -> None:
    from submitit.core.utils import FailedJobError

    from hpcdl.launch import slurm
    from hpcdl.launch.slurm import SubmitError
    from hpcdl.sweep import launch
    from hpcdl.sweep import ledger as ledger_mod

    class Executor:  # sbatch takes gpus_per_node=1 and refuses 2
        def __init__(self, cfg) -> None:
            self.gpus = cfg.cluster.gpus_per_node

        def update_parameters(self, **_) -> None:
            pass

        def map_array(self, _fn, run_dirs):
            if self.gpus == 2:
                raise FailedJobError(
                    "sbatch: error: Batch job submission failed: Invalid partition name specified"
                )
            return [SimpleNamespace(job_id=f"7_{k}") for k in range(len(run_dirs))]

    monkeypatch.setattr(slurm, "make_executor", lambda cfg, _base, job_name=None: Executor(cfg))
    monkeypatch.setattr(launch, "max_array_size", lambda: 1001)

    def submitted(sweep: Path, gpus: str) -> None:
        plan = plan_sweep(
            ["cluster=rivanna_a100", gpus, "optim.lr=0.1,0.01", f"hydra.sweep.dir={sweep}"]
        )
        launch.create_sweep(plan)
        with ledger_mod.locked(sweep) as led:
            launch.submit_arrays(led, [0, 1, 2, 3][: len(plan.trials)])

    with pytest.raises(SubmitError) as refused:  # was submitit's FailedJobError, two lines
        submitted(tmp_path / "new", "cluster.gpus_per_node=2")
    assert str(refused.value) == (
        "sbatch refused the job: sbatch: error: Batch job submission failed: Invalid partition "
        f"name specified (cluster.partition=gpu); nothing submitted (sweep dir {tmp_path / 'new'} "
        "removed)"
    )
    assert not (tmp_path / "new").exists()

    with pytest.raises(SubmitError, match=r"; trials \[2, 3\] not submitted \(arrays 7 were\)"):
        submitted(tmp_path / "half", "cluster.gpus_per_node=1,2")
    kept = ledger_mod.load(tmp_path / "half")  # the array queued is on record
    assert [t.job_id for t in kept.trials] == ["7_0", "7_1", None, None]


def test_bad_sweep_creates_and_runs_nothing(hpcdl, tmp_path: Path) -> None:
    out = hpcdl("train", "-m", "hydra.sweep.dir=sw", "optim.lr=0.1,-1")
    assert out.returncode == 2 and "trial 1 (optim.lr=-1)" in out.stderr
    assert not (tmp_path / "sw").exists()
    for dry in ([], ["--dry-run"]):  # the dry run refuses a value given twice the same way
        out = hpcdl("train", "-m", "hydra.sweep.dir=sw", "optim.lr=0.1,0.1", *dry)
        assert out.returncode == 2 and out.stdout == "", out.stdout
        assert out.stderr == (
            "error: optim.lr=0.1,0.1: 0.1 is given twice; give each value of optim.lr once "
            "(optim.lr=0.1)\n"
        )
        assert not (tmp_path / "sw").exists()


@pytest.mark.slow
def test_local_sweep_ledger_failed_trial_rerun_and_kfold_summary(hpcdl, tmp_path: Path) -> None:
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    np.savez(tmp_path / "good.npz", x=x, y=y)
    # Arrays of the wrong lengths: a file the login checks pass (they read names, not data).
    np.savez(tmp_path / "broken.npz", x=x, y=y[:100])
    out = hpcdl(
        "train",
        "-m",
        "hydra.sweep.dir=sw",
        "data=files",
        "data.path=good.npz,broken.npz",
        "data.num_folds=3",
        "data.fold=range(0,3)",
        "trainer.max_epochs=3",
    )
    sweep = tmp_path / "sw"
    assert out.returncode == 1, out.stderr + out.stdout  # a failed trial is the sweep's failure
    assert f"3 of 6 trials failed: hpcdl sweep status {sweep}" in out.stdout
    assert "trial 3 failed: data.path='broken.npz': 569 feature rows but 100 labels" in (
        out.stdout
    ), out.stdout
    ledger = json.loads((sweep / "sweep.json").read_text())
    assert len(ledger["trials"]) == 6
    states = {t["index"]: t["state"] for t in ledger["trials"]}
    assert [states[i] for i in range(3)] == ["COMPLETED"] * 3
    assert [states[i] for i in range(3, 6)] == ["FAILED"] * 3
    assert all(t["attempts"] == 1 for t in ledger["trials"])
    assert all(Path(t["run_dir"]).parent == sweep for t in ledger["trials"])

    status = hpcdl("sweep", "status", str(sweep))
    assert status.returncode == 1 and "3 COMPLETED, 3 FAILED" in status.stdout
    assert "trial 5 failed: data.path='broken.npz': 569 feature rows" in status.stdout

    # Fix the cause, rerun only the failed trials: the completed ones are not touched.
    mtimes = {i: (sweep / str(i) / "summary.json").stat().st_mtime for i in range(3)}
    np.savez(tmp_path / "broken.npz", x=x, y=y)
    dry = hpcdl("sweep", "rerun", str(sweep), "--failed", "--dry-run")
    assert dry.returncode == 0, dry.stderr + dry.stdout
    assert dry.stdout.splitlines() == [
        "would rerun 3 trials: 3-5",
        "# dry run: nothing submitted",
    ]
    assert json.loads((sweep / "sweep.json").read_text()) == ledger  # nothing ran
    rerun = hpcdl("sweep", "rerun", str(sweep), "--failed")
    assert rerun.returncode == 0, rerun.stderr + rerun.stdout
    assert "rerunning 3 trials: 3-5" in rerun.stdout
    ledger = json.loads((sweep / "sweep.json").read_text())
    assert [t["state"] for t in ledger["trials"]] == ["COMPLETED"] * 6
    assert [t["attempts"] for t in ledger["trials"]] == [1, 1, 1, 2, 2, 2]
    assert {i: (sweep / str(i) / "summary.json").stat().st_mtime for i in range(3)} == mtimes
    # A trial is a run dir; the sweep dir is not, and says where its trials are.
    predict = hpcdl("predict", str(sweep), "--split", "test")
    assert predict.returncode == 2 and predict.stderr == (
        f"error: {sweep}: a sweep dir, whose trials are run dirs: pass one of them, {sweep}/N "
        f"for trial N (`hpcdl sweep summary {sweep}` ranks them)\n"
    )
    # ... and a trial is not the sweep dir.
    trial_status = hpcdl("sweep", "status", str(sweep / "0"))
    assert trial_status.returncode == 2 and trial_status.stderr == (
        f"error: {sweep / '0'}: no sweep.json, so not a sweep dir; it is trial 0 of the sweep "
        f"{sweep}: pass that, or `hpcdl status {sweep / '0'}` for this trial alone\n"
    )

    summary = hpcdl("sweep", "summary", str(sweep), "--metric", "val_accuracy")
    assert summary.returncode == 0, summary.stderr
    assert "| std " in summary.stdout and "| 3 |" in summary.stdout  # mean +- std over 3 folds
    assert (sweep / "summary.csv").exists() and (sweep / "summary_val_accuracy.png").exists()
    rows = (sweep / "summary.csv").read_text().splitlines()
    assert len(rows) == 3  # header + one line per data.path, folds grouped


def _attempts(run_dir: Path, *records: dict, cut: str = "") -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in records)
    (run_dir / "attempts.jsonl").write_text(text + cut)


def test_a_job_that_left_the_queue_is_judged_by_its_run_dir(tmp_path: Path) -> None:
    # What `hpcdl status` and `hpcdl sweep status` say on a cluster without accounting.
    from hpcdl.launch.monitor import state_from_run_dir as state_of
    from hpcdl.rundir import RunDir

    def state_from_run_dir(path: Path) -> str:
        return state_of(RunDir(path))

    def requeues(path: Path) -> int:
        return RunDir(path).requeues()

    start = {"event": "start", "restart_count": 0}
    assert state_from_run_dir(tmp_path / "never") == "UNKNOWN"
    _attempts(tmp_path / "crashed", start, cut='{"event": "en')  # a line cut by a kill
    assert state_from_run_dir(tmp_path / "crashed") == "FAILED"
    timeout = {"event": "end", "reason": "timeout", "action": "not requeued"}
    _attempts(tmp_path / "timeout", start, timeout)
    assert state_from_run_dir(tmp_path / "timeout") == "TIMEOUT"
    preempted = {"event": "end", "reason": "preempted", "action": "requeued"}
    requeued = {"event": "start", "restart_count": 1}
    done = {"event": "end", "reason": "completed"}
    _attempts(tmp_path / "done", start, preempted, requeued, done)
    (tmp_path / "done" / "summary.json").write_text("{}")
    assert state_from_run_dir(tmp_path / "done") == "COMPLETED"
    assert requeues(tmp_path / "done") == 1 and requeues(tmp_path / "crashed") == 0
    # `hpcdl resume` after a cancel submits a new job: an attempt, not a requeue.
    cancelled = {"event": "end", "reason": "cancelled", "action": "exit"}
    _attempts(tmp_path / "resumed", start, cancelled, start, done)
    assert requeues(tmp_path / "resumed") == 0
    # The stops a job records itself keep their names (they were all FAILED).
    _attempts(tmp_path / "cancelled", start, cancelled)
    assert state_from_run_dir(tmp_path / "cancelled") == "CANCELLED"
    asked = {"event": "end", "reason": "requested", "action": "not requeued"}
    _attempts(tmp_path / "asked", start, asked)  # `hpcdl run`'s program stopped itself
    assert state_from_run_dir(tmp_path / "asked") == "INTERRUPTED"


def test_ledger_written_by_an_older_version_still_loads(tmp_path: Path) -> None:
    from hpcdl.sweep import ledger as ledger_mod

    old = {
        "sweep_dir": str(tmp_path),
        "cluster": "devcluster",
        "launcher": "slurm",
        "swept_keys": ["optim.lr"],
        "common_overrides": [],
        "trials": [{"index": 0, "overrides": ["optim.lr=0.1"], "run_dir": "x", "gone": 1}],
    }
    (tmp_path / "sweep.json").write_text(json.dumps(old))
    trial = ledger_mod.load(tmp_path).trials[0]
    assert trial.overrides == ["optim.lr=0.1"] and trial.requeues == 0


def test_a_trial_that_left_the_queue_without_running_is_cancelled(
    tmp_path: Path, monkeypatch
) -> None:
    from hpcdl.launch.foreground import record_end, record_start
    from hpcdl.rundir import RunDir
    from hpcdl.sweep import states
    from hpcdl.sweep.states import SchedulerView, task_state

    def sacct(*records: str) -> dict[str, str]:
        return states.parse_states("".join(r + "\n" for r in records))

    never = RunDir(tmp_path / "never")
    # `scancel 52` while 52_0 ran and 52_1, 52_2 waited (array_parallelism=1): sacct has
    # one record for the two that never ran.
    cancelled = sacct("52_0|CANCELLED by 0", "52_[1-2%1]|CANCELLED by 0")
    assert cancelled == {"52_0": "CANCELLED", "52_1": "CANCELLED", "52_2": "CANCELLED"}
    assert task_state(SchedulerView({}, cancelled), "52_2", never) == "CANCELLED"
    assert sacct("7_[1,3,5-6%2]|PENDING", "7_5|RUNNING") == {
        "7_1": "PENDING",
        "7_3": "PENDING",
        "7_5": "RUNNING",
        "7_6": "PENDING",
    }
    # `hpcdl cancel SWEEP/2` of a queued task: its array's record still says PENDING, and
    # once the array has run on, sacct has no record of it at all.
    queued = {"53_0": "RUNNING", "53_1": "PENDING"}
    view = SchedulerView(queued, sacct("53_0|RUNNING", "53_[1-2%1]|PENDING"))
    assert task_state(view, "53_1", never) == "PENDING"
    assert task_state(view, "53_2", never) == "CANCELLED"
    view = SchedulerView({}, sacct("53_0|COMPLETED", "53_1|COMPLETED"))
    assert task_state(view, "53_2", never) == "CANCELLED"
    # A rerun cancelled while queued: the earlier job's records do not count.
    earlier = {"event": "start", "job_id": "54", "array_job": "53", "array_task": "2"}
    _attempts(tmp_path / "rerun", earlier, {"event": "end", "reason": "failed"})
    assert task_state(view, "60_0", RunDir(tmp_path / "rerun")) == "CANCELLED"
    # sacct not yet told that a task which ran has ended: the run dir decides.
    lagging = SchedulerView({}, {"53_2": "RUNNING"})
    assert task_state(lagging, "53_2", RunDir(tmp_path / "rerun")) == "FAILED"
    assert task_state(lagging, "53_2", never) == "CANCELLED"
    # A task resumed by hand in the foreground (`hpcdl resume SWEEP/2 cluster=local`),
    # then stopped with Ctrl-C: its own end record says so.
    local = RunDir(tmp_path / "local")
    _attempts(local.path, earlier)
    record_start(local, "local", "4711", 1)
    record_end(local, "local", "4711", 3)
    assert task_state(lagging, "53_2", local) == "INTERRUPTED"  # was FAILED
    # Without accounting a task that never started stays UNKNOWN (rerunnable too); with the
    # controller down, nothing is guessed.
    assert task_state(SchedulerView({}, None), "53_2", never) == "UNKNOWN"
    assert task_state(SchedulerView(None, {}), "53_2", never) is None

    # squeue -j fails once the controller has purged every one of the ids: still a queue.
    calls: list[list[str]] = []
    monkeypatch.setattr(
        states, "query", lambda cmd: calls.append(cmd) or (None if "-j" in cmd else "")
    )
    assert states.slurm_states(["52"]) == SchedulerView({}, None)
    assert calls[-1][:2] == ["squeue", "--me"]


def test_a_trial_resumed_by_hand_with_other_settings_is_noted(tmp_path: Path) -> None:
    """`hpcdl resume SWEEP/1 trainer.max_epochs=50` changes what trial 1 is, not its row: a
    note says so (the swept key's own edit has its note already). The sweep's attempts and
    a plain resume leave none."""
    from hpcdl.sweep import launch
    from hpcdl.sweep.report import edit_notes, refresh

    sweep = tmp_path / "sw"
    launch.create_sweep(plan_sweep(["optim.lr=0.1,0.01", f"hydra.sweep.dir={sweep}"]))
    (sweep / "0" / "commands.log").write_text(
        f"2026-11-26T07:00:00 sweep: trial 0 of {sweep}\n"
        f"2026-11-26T07:05:00 resume: /usr/bin/hpcdl resume {sweep}/0\n"
    )
    (sweep / "1" / "commands.log").write_text(
        f"2026-11-26T07:00:00 sweep: trial 1 of {sweep}\n"
        f"2026-11-26T07:05:00 resume: /usr/bin/hpcdl resume {sweep}/1 optim.lr=0.2 "
        "trainer.max_epochs=50 -- python x.py a=b\n"
    )
    ledger, _ = refresh(sweep)
    assert edit_notes(ledger) == "trial 1: resumed by hand with trainer.max_epochs=50\n"


def test_status_and_summary_show_a_value_edited_in_a_trials_config(tmp_path: Path) -> None:
    # The documented fix of a failed trial: edit its config.yaml, then `sweep rerun --failed`.
    from hpcdl.sweep import launch
    from hpcdl.sweep.direction import direction
    from hpcdl.sweep.report import refresh, status_table, summarize

    sweep = tmp_path / "sw"
    launch.create_sweep(plan_sweep(["optim.lr=0.1,1e+30,0.01", f"hydra.sweep.dir={sweep}"]))
    config = sweep / "1" / "config.yaml"
    config.write_text(config.read_text().replace("lr: 1.0e+30", "lr: 0.05"))
    ledger, metric = refresh(sweep)
    assert [t.overrides for t in ledger.trials] == [
        ["optim.lr=0.1"],
        ["optim.lr=0.05"],
        ["optim.lr=0.01"],
    ]
    assert "trial 1: its config.yaml has optim.lr=0.05 (the sweep planned optim.lr=1e+30)\n" in (
        status_table(ledger, metric)
    )
    entries = summarize(ledger, metric, direction(ledger, metric))
    assert "optim.lr=0.05" in [e["overrides"] for e in entries]
    stored = json.loads((sweep / "sweep.json").read_text())["trials"][1]
    assert (stored["overrides"], stored["planned"]) == (["optim.lr=0.05"], ["optim.lr=1e+30"])


def test_overrides_as_run_take_values_from_the_config() -> None:
    from hpcdl.sweep.overrides import as_run

    config = {
        "model": {"name": "custom", "hidden_sizes": [64, 32]},
        "data": {"path": "good.npz", "fold": 2},
        "optim": {"lr": 0.001},
        "trainer": {"compile": True, "max_steps": None},
    }
    planned = ["model=mine", "data.fold=2", "trainer.compile=True", "trainer.max_steps=null"]
    assert as_run(planned, config) == planned  # a group's choice is no value in the config
    assert as_run(["optim.lr=1e-3"], config) == ["optim.lr=1e-3"]  # as typed where it agrees
    assert as_run(["data.path='good.npz'", "experiment=x", "+extra=1"], config) == [
        "data.path='good.npz'",
        "experiment=x",
        "+extra=1",
    ]
    edited = ["data.fold=0", "trainer.compile=false", "model.hidden_sizes=[64]", "data.path=b"]
    assert as_run(edited, config) == [
        "data.fold=2",
        "trainer.compile=true",
        "model.hidden_sizes=[64,32]",
        "data.path=good.npz",
    ]
    assert as_run(["model.hidden_sizes=[64, 32]"], config) == ["model.hidden_sizes=[64, 32]"]


def test_a_program_trials_swept_arguments_come_from_the_command_in_its_config() -> None:
    """`hpcdl run -m` trials: `hpcdl resume SWEEP_DIR/N -- COMMAND...` replaces the command
    in config.yaml; status and summary show what it now runs with, in each form a list can
    take (`--lr=`, `--lr VALUE`, a bare token argN, a Hydra app's `seed=`)."""
    from hpcdl.sweep.overrides import as_run

    resumed = ["python", "/sw/code/script/fit.py", "--lr=0.05", "--seed", "7", "run2", "bs=64"]
    config = {"script": {"command": resumed}, "optim": {"lr": 0.1}}
    planned = ["--lr=-1", "--seed=1", "arg5=run1", "bs=32"]
    assert as_run(planned, config) == ["--lr=0.05", "--seed=7", "arg5=run2", "bs=64"]
    as_planned = ["python", "fit.py", "--lr=-1", "--seed", "1", "run1", "bs=32"]
    assert as_run(planned, {"script": {"command": as_planned}}) == planned
    # The swept script itself (python 'fit_{a,b}.py'): its path is the frozen copy's.
    frozen = {"script": {"command": ["python", "/sw/code/script/fit_b.py", "--lr=0.1"]}}
    assert as_run(["arg1=fit_b.py"], frozen) == ["arg1=fit_b.py"]
    assert as_run(["arg1=fit_a.py"], frozen) == ["arg1=/sw/code/script/fit_b.py"]
    # An argument the new command no longer has: as planned (the program's default is unknown).
    assert as_run(["--hidden=8", "arg9=x"], config) == ["--hidden=8", "arg9=x"]


def test_a_metric_no_trial_reports_is_refused_and_nothing_is_written(
    tmp_path: Path, capsys
) -> None:
    from hpcdl.cli.main import main
    from hpcdl.sweep import launch

    sweep = tmp_path / "sw"
    launch.create_sweep(plan_sweep(["optim.lr=0.1,0.01", f"hydra.sweep.dir={sweep}"]))
    (sweep / "0" / "summary.json").write_text('{"val_accuracy": 0.9, "outcome": "completed"}')
    ledger = (sweep / "sweep.json").read_bytes()
    for command in ("summary", "status"):
        assert main(["sweep", command, str(sweep), "--metric", "val_acuracy"]) == 2
        err = capsys.readouterr().err
        assert err == (
            "error: --metric val_acuracy: no trial reports it; did you mean val_accuracy? "
            "choose one the trials report (summary.json, metrics.csv): val_accuracy\n"
        )
    assert sorted(p.name for p in sweep.iterdir()) == [".sweep.lock", "0", "1", "sweep.json"]
    assert (sweep / "sweep.json").read_bytes() == ledger


def test_a_sweep_refused_by_preflight_names_the_trial(tmp_path: Path, monkeypatch, capsys) -> None:
    from hpcdl.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    overrides = ["cluster=local", "cluster.tasks_per_node=1", "cluster.gpus_per_node=1,2"]
    assert main(["train", "-m", *overrides, "optim.lr=0.1,0.01", "hydra.sweep.dir=sw"]) == 2
    assert capsys.readouterr().err.startswith(
        "error: trial 2 (cluster.gpus_per_node=2 optim.lr=0.1): cluster.gpus_per_node=2: "
        "CUDA_VISIBLE_DEVICES='0' shows 1 GPU(s)"
    )
    assert not (tmp_path / "sw").exists()


def test_a_trial_resumed_by_hand_counts_as_an_attempt(tmp_path: Path, monkeypatch) -> None:
    # `hpcdl resume SWEEP_DIR/1` submits a job the sweep does not know: `hpcdl status` of
    # the trial counts its start, and so does the ledger.
    from hpcdl.sweep import launch, report, states
    from hpcdl.sweep import ledger as ledger_mod

    sweep = tmp_path / "sw"
    launch.create_sweep(plan_sweep(["optim.lr=0.1,0.01", f"hydra.sweep.dir={sweep}"]))
    with ledger_mod.locked(sweep) as led:
        led.launcher = "slurm"
        led.submissions.append({"array_job_id": "52", "trials": [0, 1], "time": 0.0})
        for t in led.trials:
            t.job_id, t.attempts = f"52_{t.index}", 1
    start = {"event": "start", "restart_count": 0}
    _attempts(sweep / "0", {**start, "job_id": "53", "array_job": "52", "array_task": "0"})
    requeued = {"event": "start", "job_id": "54", "array_job": "52", "array_task": "1"}
    _attempts(
        sweep / "1",
        {**requeued, "restart_count": 0},
        {**requeued, "restart_count": 1},  # Slurm's requeue: no submission
        {**start, "job_id": "60", "array_job": None, "array_task": None},  # by hand
    )
    monkeypatch.setattr(states, "query", lambda cmd: "")  # squeue and sacct: nothing known
    ledger, _ = report.refresh(sweep)
    assert [(t.attempts, t.requeues) for t in ledger.trials] == [(1, 0), (2, 1)]


@pytest.mark.slow
def test_a_local_trial_resumed_by_hand_counts_as_an_attempt(hpcdl, tmp_path: Path) -> None:
    # As on Slurm: `hpcdl resume SWEEP_DIR/1` of a cluster=local sweep's trial is an attempt
    # of the trial (the ledger counted only the pool's), and its end is the trial's state.
    from sklearn.datasets import load_breast_cancer

    from hpcdl.launch.foreground import record_end, record_start
    from hpcdl.rundir import RunDir

    x, y = load_breast_cancer(return_X_y=True)
    np.savez(tmp_path / "good.npz", x=x, y=y)
    np.savez(tmp_path / "broken.npz", x=x, y=y[:100])  # passes the checks before it runs
    local = ["cluster=local", "cluster.tasks_per_node=1", "trainer.max_epochs=1", "data=files"]
    out = hpcdl("train", "-m", *local, "data.path=good.npz,broken.npz", "hydra.sweep.dir=sw")
    assert out.returncode == 1, out.stdout + out.stderr
    sweep = tmp_path / "sw"

    def table() -> list[tuple[str, str]]:
        status = hpcdl("sweep", "status", str(sweep))
        rows = [line.split("|") for line in status.stdout.splitlines()[2:4]]
        return [(row[4].strip(), row[5].strip()) for row in rows]  # state, attempts

    assert table() == [("COMPLETED", "1"), ("FAILED", "1")]
    # A resume by hand stopped with Ctrl-C, as `hpcdl resume` with cluster=local records it.
    record_start(RunDir(sweep / "1"), "local", "4711", 1)
    record_end(RunDir(sweep / "1"), "local", "4711", 3)
    assert table() == [("COMPLETED", "1"), ("INTERRUPTED", "2")]
    np.savez(tmp_path / "broken.npz", x=x, y=y)  # fixed, then resumed for real
    resumed = hpcdl("resume", str(sweep / "1"))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert table() == [("COMPLETED", "1"), ("COMPLETED", "3")]
    rerun = hpcdl("sweep", "rerun", str(sweep), "--failed")  # nothing failed: nothing run
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert table() == [("COMPLETED", "1"), ("COMPLETED", "3")]  # the pool's are not recounted


def test_sweep_status_exits_1_once_a_trial_ended_without_completing(tmp_path: Path, capsys) -> None:
    # For a script polling the sweep: 0 while trials are waiting, running or completed.
    from hpcdl.cli.main import main
    from hpcdl.rundir import RunDir
    from hpcdl.sweep import launch

    sweep = tmp_path / "sw"
    launch.create_sweep(plan_sweep(["optim.lr=0.1,0.01,0.001", f"hydra.sweep.dir={sweep}"]))
    assert main(["sweep", "status", str(sweep)]) == 0  # NOT_STARTED: nothing failed
    launch._finish_trial(sweep, 0, 0)  # as the local pool records its trials' ends
    launch._finish_trial(sweep, 1, 3)  # stopped with Ctrl-C
    assert main(["sweep", "status", str(sweep)]) == 1
    assert "1 COMPLETED, 1 INTERRUPTED, 1 NOT_STARTED" in capsys.readouterr().out
    launch._finish_trial(sweep, 1, 0)  # rerun: now complete
    RunDir(sweep / "1").write_summary({"val_accuracy": 0.9})
    assert main(["sweep", "status", str(sweep)]) == 0
    launch._finish_trial(sweep, 2, 1)
    assert main(["sweep", "status", str(sweep)]) == 1
    assert "2 COMPLETED, 1 FAILED" in capsys.readouterr().out


def _slurm_sweep_ended(tmp_path: Path, monkeypatch, ends: list[tuple[str, dict]]) -> Path:
    """A Slurm sweep of len(ends) trials in array 9, trial i as sacct's state ends[i][0]
    with ends[i][1] the end record its job wrote (squeue: none of them queued)."""
    from hpcdl.rundir import RunDir
    from hpcdl.sweep import launch, states
    from hpcdl.sweep import ledger as ledger_mod

    lrs = ",".join(f"1e-{i + 1}" for i in range(len(ends)))
    plan = plan_sweep(["cluster=rivanna_a100", f"optim.lr={lrs}", f"hydra.sweep.dir={tmp_path}/sw"])
    sweep = Path(launch.create_sweep(plan).sweep_dir)
    with ledger_mod.locked(sweep) as ledger:
        for t, (_, end) in zip(ledger.trials, ends, strict=True):
            t.job_id = f"9_{t.index}"
            run = RunDir(Path(t.run_dir))
            start = {"event": "start", "job_id": str(90 + t.index), "array_job": "9"}
            run.append_attempt({**start, "array_task": str(t.index)})
            run.append_attempt({"event": "end", "job_id": str(90 + t.index), **end})
            if end["reason"] == "completed":
                run.write_summary({"outcome": "completed", "val_accuracy": 0.9})
    sacct = "".join(f"9_{i}|{state}\n" for i, (state, _) in enumerate(ends))
    monkeypatch.setattr(states, "query", lambda cmd: sacct if cmd[0] == "sacct" else "")
    return sweep


def test_a_trial_stopped_at_its_time_limit_is_timeout_and_status_filters_by_state(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    # Before: a trial past cluster.max_requeues at its time limit (exit 3: Slurm's FAILED)
    # showed FAILED, and a 2000-trial table had no way to show the failed ones alone.
    from hpcdl.cli.main import main

    limit = {"reason": "timeout", "action": "not requeued: cluster.max_requeues=0 timeouts reached"}
    sweep = _slurm_sweep_ended(
        tmp_path,
        monkeypatch,
        [
            ("COMPLETED", {"reason": "completed"}),
            ("FAILED", limit),
            ("FAILED", {"reason": "failed", "error": "ValueError: boom"}),
            ("TIMEOUT", {"reason": "preempted", "action": "requeued"}),  # killed at its limit
        ],
    )
    assert main(["sweep", "status", str(sweep)]) == 1
    out = capsys.readouterr().out
    assert [_cells(row)[3] for row in _rows(out)] == ["COMPLETED", "TIMEOUT", "FAILED", "TIMEOUT"]
    assert "4 trials: 1 COMPLETED, 1 FAILED, 2 TIMEOUT" in out
    assert "trial 1 timed out: not requeued: cluster.max_requeues=0 timeouts reached" in out
    assert f"hpcdl sweep rerun {sweep} --failed cluster.timeout_min=MINUTES" in out
    assert main(["sweep", "status", str(sweep), "--state", "timed-out"]) == 1
    out = capsys.readouterr().out
    assert [_cells(row)[0] for row in _rows(out)] == ["1", "3"]
    assert "shown: 2 in state TIMEOUT\n" in out and "trial 2" not in out
    assert main(["sweep", "status", str(sweep), "--state", "Failed,completed"]) == 1
    assert [_cells(row)[0] for row in _rows(capsys.readouterr().out)] == ["0", "2"]
    assert main(["sweep", "status", str(sweep), "--state", "failed", "--state", "timeout"]) == 1
    assert [_cells(row)[0] for row in _rows(capsys.readouterr().out)] == ["1", "2", "3"]
    assert main(["sweep", "status", str(sweep), "--state", "pending"]) == 1
    assert _rows(capsys.readouterr().out) == []
    ledger = (sweep / "sweep.json").read_bytes()
    assert main(["sweep", "status", str(sweep), "--state", "faild"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and (sweep / "sweep.json").read_bytes() == ledger
    assert captured.err.startswith("error: --state faild: no trial state of that name; give one ")
    assert (
        "completed, failed, cancelled, timeout (timed-out), " in captured.err
        and captured.err.count("\n") == 1
    )
    # The summary's state column says TIMEOUT too, and `rerun --failed` takes them.
    assert main(["sweep", "summary", str(sweep)]) == 0
    assert [_cells(row)[-1] for row in _rows(capsys.readouterr().out)][1:] == [
        "TIMEOUT",
        "FAILED",
        "TIMEOUT",
    ]
    assert main(["sweep", "rerun", str(sweep), "--failed", "--dry-run"]) == 0
    assert "would rerun 3 trials: 1-3\n" in capsys.readouterr().out


def test_rerun_trials_reruns_those_whatever_their_state_and_refuses_queued_ones(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    # Before: only `--failed`; a completed trial with a suspicious result could not be rerun.
    from hpcdl import Sweep
    from hpcdl.cli.main import main
    from hpcdl.rundir import RunDir
    from hpcdl.sweep import launch, states
    from hpcdl.sweep.report import edit_notes, refresh

    sweep = _slurm_sweep_ended(
        tmp_path,
        monkeypatch,
        [
            ("COMPLETED", {"reason": "completed"}),
            ("FAILED", {"reason": "failed"}),
            ("COMPLETED", {"reason": "completed"}),
            ("RUNNING", {"reason": "preempted", "action": "requeued"}),
        ],
    )
    sacct = "9_0|COMPLETED\n9_1|FAILED\n9_2|COMPLETED\n"
    monkeypatch.setattr(
        states, "query", lambda cmd: sacct if cmd[0] == "sacct" else "9_3|RUNNING\n"
    )
    submitted: list[list[int]] = []
    monkeypatch.setattr(launch, "submit_arrays", lambda _led, idx: submitted.append(idx) or ["11"])
    refresh(sweep)  # the states as the scheduler has them: no refusal changes them
    ledger = (sweep / "sweep.json").read_bytes()
    for args, said in [
        (["--trials", "0,3"], "--trials: 1 trial: 3 still queued or running (RUNNING); leave"),
        (["--trials", "2,9-12"], f"--trials 9-12: no such trial in {sweep}; its trials are 0-3"),
        (["--trials", "1,x"], "--trials 1,x: 'x' is no number or range (e.g. 3,4,10-12)"),
        (["--trials", "1", "--failed"], "give --failed (it reruns the trials in a failed state"),
    ]:
        assert main(["sweep", "rerun", str(sweep), *args]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith(f"error: {said}") or said in err, err
        assert err.count("\n") == 1 and submitted == []
    assert (sweep / "sweep.json").read_bytes() == ledger
    assert main(["sweep", "rerun", str(sweep), "--trials", "2,0-1", "trainer.max_epochs=7"]) == 0
    assert submitted == [[0, 1, 2]]
    assert "rerunning 3 trials: 0-2\n" in capsys.readouterr().out
    for index in (0, 1, 2):
        assert RunDir(sweep / str(index)).load_config().trainer.max_epochs == 7
    assert RunDir(sweep / "3").load_config().trainer.max_epochs != 7
    log = (sweep / "0" / "commands.log").read_text()
    assert f"rerun: hpcdl sweep rerun {sweep} --trials 0,1,2 trainer.max_epochs=7" in log
    assert "trial 2: rerun with trainer.max_epochs=7" in edit_notes(refresh(sweep)[0])
    assert Sweep(sweep).rerun([2]) == [2] and submitted[-1] == [2]
    # --from-scratch: from its first epoch, its checkpoints set aside, as `hpcdl resume
    # --from-scratch` does it.
    (sweep / "0" / "checkpoints").mkdir()
    (sweep / "0" / "checkpoints" / "step_000000013.pt").write_bytes(b"x")
    assert main(["sweep", "rerun", str(sweep), "--trials", "0", "--from-scratch"]) == 0
    assert submitted[-1] == [0]
    assert (sweep / "0" / "checkpoints.set-aside-1" / "step_000000013.pt").is_file()
    assert not (sweep / "0" / "summary.json").exists()
    assert "trial 0: rerun with --from-scratch" in edit_notes(refresh(sweep)[0])


def _rows(out: str) -> list[str]:
    """The rows of the first markdown table in `out`, without its header."""
    return [line for line in out.splitlines() if line.startswith("| ")][1:]


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.split("|")[1:-1]]


def test_sweep_status_never_imports_torch(tmp_path: Path) -> None:
    from hpcdl.sweep import launch
    from tests.conftest import run_without_torch

    sweep = tmp_path / "sw"
    launch.create_sweep(plan_sweep(["optim.lr=0.1,0.01", f"hydra.sweep.dir={sweep}"]))
    launch._finish_trial(sweep, 0, 1)
    code = (
        f"from hpcdl.cli.main import main\nassert main(['sweep', 'status', {str(sweep)!r}]) == 1\n"
    )
    out = run_without_torch(code, cwd=tmp_path)
    assert "2 trials: 1 FAILED, 1 NOT_STARTED" in out.stdout


# ----------------------------------------------------------------------------- ranking
def _completed_sweep(plan, rows: list[dict]) -> Path:
    """A sweep made by the planner and ledger; each trial completed, with its last epoch's
    row in metrics.csv (`rows[i]`), as the trainer writes it, or a program's summary.json."""
    from hpcdl.rundir import RunDir
    from hpcdl.sweep import launch

    ledger = launch.create_sweep(plan)
    for t, row in zip(ledger.trials, rows, strict=True):
        run_dir = RunDir(Path(t.run_dir))
        if plan.trials[0].config.script is None:
            run_dir.metrics.append({"epoch": 1, **row})
            run_dir.write_summary({"outcome": "completed", "best_epoch": 1})
        else:  # as hpcdl.script_job writes it: the program's metrics after hpcdl's own
            run_dir.write_summary({"outcome": "completed", "exit_code": 0, "wall_s": 2.0, **row})
    return Path(ledger.sweep_dir)


def _ranked(table: str) -> list[str]:
    """The overrides column of a summary table, best first."""
    rows = [line.split("|") for line in table.splitlines() if line.startswith("| ")]
    return [row[2].strip() for row in rows[1:]]


def _regression_sweep(tmp_path: Path) -> Path:
    (tmp_path / "houses.csv").write_text("rooms,price\n3,200\n4,260\n")
    overrides = ["task=regression", "data=files", f"data.path={tmp_path / 'houses.csv'}"]
    plan = plan_sweep(
        [
            *overrides,
            "data.label_column=price",
            "optim.lr=0.1,0.01,0.001",
            f"hydra.sweep.dir={tmp_path / 'sw'}",
        ]
    )
    rows = [
        {"val_loss": 0.3, "val_mae": 5.0, "val_rmse": 7.0, "val_r2": 0.5},
        {"val_loss": 0.1, "val_mae": 2.0, "val_rmse": 3.0, "val_r2": 0.9},
        {"val_loss": 0.6, "val_mae": 9.0, "val_rmse": 11.0, "val_r2": 0.1},
    ]
    return _completed_sweep(plan, rows)


@pytest.mark.parametrize("metric", ["val_mae", "val_rmse"])
def test_a_sweep_ranked_by_an_error_metric_puts_the_smallest_first(
    tmp_path: Path, capsys, metric: str
) -> None:
    from hpcdl.cli.main import main

    sweep = _regression_sweep(tmp_path)
    assert main(["sweep", "summary", str(sweep), "--metric", metric]) == 0
    out = capsys.readouterr().out
    header = (
        f"ranked by {metric}, lowest first ({metric[4:]}: lower is better); --mode max reverses it"
    )
    assert _ranked(out) == ["optim.lr=0.01", "optim.lr=0.1", "optim.lr=0.001"]
    assert out.startswith(header + "\n")
    assert (sweep / "summary.md").read_text().startswith(header + "\n\n| rank |")
    csv_rows = (sweep / "summary.csv").read_text().splitlines()[1:]
    assert [row.split(",")[1] for row in csv_rows] == _ranked(out)
    assert all(row.split(",")[3] == "" for row in csv_rows)  # one trial each: no std ("nan")
    # r2, the same task's other metric, is higher-better.
    assert main(["sweep", "summary", str(sweep), "--metric", "val_r2"]) == 0
    assert _ranked(capsys.readouterr().out) == ["optim.lr=0.01", "optim.lr=0.1", "optim.lr=0.001"]


def test_sweep_summary_never_imports_torch(tmp_path: Path) -> None:
    # The ranking reads the trials' config.yaml and the metric table on the login node.
    from tests.conftest import run_without_torch

    sweep = _regression_sweep(tmp_path)
    code = (
        "from hpcdl.cli.main import main\n"
        f"assert main(['sweep', 'summary', {str(sweep)!r}, '--metric', 'val_mae']) == 0\n"
    )
    out = run_without_torch(code, cwd=tmp_path)
    assert out.stdout.startswith("ranked by val_mae, lowest first")


def test_mode_max_overrides_the_metrics_own_direction(tmp_path: Path, capsys) -> None:
    from hpcdl.cli.main import main
    from hpcdl.client import Sweep

    sweep = _regression_sweep(tmp_path)
    assert main(["sweep", "summary", str(sweep), "--metric", "val_mae", "--mode", "max"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ranked by val_mae, highest first (--mode max); --mode min reverses it\n")
    assert _ranked(out) == ["optim.lr=0.001", "optim.lr=0.1", "optim.lr=0.01"]
    # The Python API ranks as the command does, and says which way.
    api = Sweep.from_sweep_dir(sweep)
    ranked = api.summary(metric="val_mae")
    assert [(e["overrides"], e["mode"]) for e in ranked] == [
        ("optim.lr=0.01", "min"),
        ("optim.lr=0.1", "min"),
        ("optim.lr=0.001", "min"),
    ]
    assert [e["overrides"] for e in api.summary(metric="val_mae", mode="max")] == _ranked(out)
    with pytest.raises(HpcdlError, match="mode='up': choose 'min'"):
        api.summary(metric="val_mae", mode="up")


def _custom_task_sweep(tmp_path: Path, mode: str) -> Path:
    plan = plan_sweep(
        [
            "task=custom",
            "task.target=mylab.tasks:step",
            "trainer.early_stopping.monitor=val_dist",
            f"trainer.early_stopping.mode={mode}",
            "optim.lr=0.1,0.01,0.001",
            f"hydra.sweep.dir={tmp_path / 'sw'}",
        ]
    )
    return _completed_sweep(plan, [{"val_dist": 3.0}, {"val_dist": 1.0}, {"val_dist": 2.0}])


@pytest.mark.parametrize(
    ("mode", "ranked"),
    [
        ("min", ["optim.lr=0.01", "optim.lr=0.001", "optim.lr=0.1"]),
        ("max", ["optim.lr=0.1", "optim.lr=0.001", "optim.lr=0.01"]),
    ],
)
def test_the_trials_early_stopping_mode_ranks_their_monitor(
    tmp_path: Path, capsys, mode: str, ranked: list[str]
) -> None:
    # val_dist is the custom task's own metric: nothing in its name says which way is better.
    from hpcdl.cli.main import main
    from hpcdl.config.schema import Mode
    from hpcdl.sweep import ledger as ledger_mod
    from hpcdl.sweep.direction import Direction, direction

    sweep = _custom_task_sweep(tmp_path, mode)
    assert main(["sweep", "summary", str(sweep)]) == 0  # the default metric: the monitor
    out = capsys.readouterr().out
    assert _ranked(out) == ranked
    assert out.startswith(
        f"ranked by val_dist, {'lowest' if mode == 'min' else 'highest'} first "
        f"(the trials' trainer.early_stopping.mode={mode});"
    )
    # The same metric on another split, and summary.json's best_metric, go the same way.
    ledger = ledger_mod.load(sweep)
    reason = f"the trials' trainer.early_stopping.mode={mode} for val_dist"
    assert direction(ledger, "test_dist") == Direction(Mode(mode), reason)
    assert direction(ledger, "best_metric") == Direction(Mode(mode), reason)


def test_trials_whose_early_stopping_modes_disagree_are_refused_without_mode(
    tmp_path: Path, capsys
) -> None:
    from hpcdl.cli.main import main

    plan = plan_sweep(
        [
            "task=custom",
            "task.target=mylab.tasks:step",
            "trainer.early_stopping.monitor=val_dist",
            "trainer.early_stopping.mode=min,max",
            f"hydra.sweep.dir={tmp_path / 'sw'}",
        ]
    )
    sweep = _completed_sweep(plan, [{"val_dist": 3.0}, {"val_dist": 1.0}])
    assert main(["sweep", "summary", str(sweep)]) == 2
    assert capsys.readouterr().err == (
        "error: val_dist: the trials monitor it with different trainer.early_stopping.mode "
        "(max in trials 1; min in trials 0); choose the ranking with --mode min (lowest "
        "first) or --mode max\n"
    )
    assert not (sweep / "summary.md").exists()
    assert main(["sweep", "summary", str(sweep), "--mode", "min"]) == 0
    assert _ranked(capsys.readouterr().out) == [
        "trainer.early_stopping.mode=max",
        "trainer.early_stopping.mode=min",
    ]


def test_best_metric_of_trials_that_monitor_different_metrics_is_refused(
    tmp_path: Path, capsys
) -> None:
    # Each trial's best_metric is its own monitor's: a loss and an accuracy do not rank
    # together, whichever way --mode turns them (before, the table mixed them).
    from hpcdl.cli.main import main
    from hpcdl.client import Sweep

    plan = plan_sweep(
        [
            "trainer.early_stopping.monitor=val_loss,val_accuracy",
            f"hydra.sweep.dir={tmp_path / 'sw'}",
        ]
    )
    sweep = _completed_sweep(plan, [{"best_metric": 0.2}, {"best_metric": 0.9}])
    said = (
        "error: best_metric: the trials' best_metric is not one metric, they monitor different "
        "ones (trainer.early_stopping.monitor: val_accuracy in trials 1; val_loss in trials 0); "
        "rank by one of those with --metric val_accuracy\n"
    )
    for mode in ([], ["--mode", "min"]):
        assert main(["sweep", "summary", str(sweep), "--metric", "best_metric", *mode]) == 2
        assert capsys.readouterr().err == said
    assert not (sweep / "summary.md").exists() and not (sweep / "summary.csv").exists()
    with pytest.raises(HpcdlError, match="best_metric is not one metric"):
        Sweep.from_sweep_dir(sweep).summary(metric="best_metric", mode="max")


def test_a_kfold_summary_shows_no_spread_for_one_fold_and_names_the_folds_left_out(
    tmp_path: Path, capsys
) -> None:
    # Trial 3 (lr 0.01, fold 1) ended without a val_accuracy: its configuration's mean is
    # one fold's. Before, the table showed that fold's std as 0.0000 (as if the folds
    # agreed) and said nothing of the fold left out; a configuration with no value, nan.
    from hpcdl.cli.main import main
    from hpcdl.rundir import RunDir
    from hpcdl.sweep import ledger as ledger_mod

    plan = plan_sweep(
        [
            "optim.lr=0.1,0.01,0.001",
            "data.num_folds=2",
            "data.fold=range(0,2)",
            f"hydra.sweep.dir={tmp_path / 'sw'}",
        ]
    )
    rows = [{"val_accuracy": 0.9}, {"val_accuracy": 0.8}, {"val_accuracy": 0.95}]
    sweep = _completed_sweep(plan, [*rows, *[{"val_loss": 1.0}] * 3])
    with ledger_mod.locked(sweep) as ledger:
        for index in (3, 4, 5):
            ledger.trial(index).state = "FAILED"
            (RunDir(sweep / str(index)).summary_file).unlink()
    assert main(["sweep", "summary", str(sweep)]) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert [[cell.strip() for cell in line.split("|")[1:-1]] for line in table[1:]] == [
        ["1", "optim.lr=0.01", "0.9500", "-", "1", "2-3", "1 COMPLETED, 1 FAILED"],
        ["2", "optim.lr=0.1", "0.8500", "0.0707", "2", "0-1", "COMPLETED"],
        ["3", "optim.lr=0.001", "-", "-", "0", "4-5", "FAILED"],
    ]
    note = (
        "optim.lr=0.01: trial 3 reports no val_accuracy (FAILED); its mean is over the other "
        "1 of 2 only"
    )
    assert note in out.splitlines()
    assert (sweep / "summary.md").read_text().splitlines()[-1] == note


def test_a_summary_says_which_trials_are_ranked_before_they_completed(
    tmp_path: Path, capsys
) -> None:
    # A running (or failed) trial is ranked by its last epoch's value so far: said below
    # the table (it was ranked beside final values with no word).
    from hpcdl.cli.main import main
    from hpcdl.rundir import RunDir
    from hpcdl.sweep import ledger as ledger_mod

    plan = plan_sweep(["optim.lr=0.1,0.01,0.001", f"hydra.sweep.dir={tmp_path / 'sw'}"])
    rows = [{"val_accuracy": 0.9}, {"val_accuracy": 0.8}, {"val_accuracy": 0.95}]
    sweep = _completed_sweep(plan, rows)
    assert main(["sweep", "summary", str(sweep)]) == 0
    assert "not completed" not in capsys.readouterr().out
    with ledger_mod.locked(sweep) as ledger:
        ledger.trial(2).state = "RUNNING"
        (RunDir(sweep / "2").summary_file).unlink()
    assert main(["sweep", "summary", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert _ranked(out)[0] == "optim.lr=0.001"
    note = (
        "trial 2 has not completed (RUNNING): its val_accuracy is the last value it reported so far"
    )
    assert note in out.splitlines()
    assert (sweep / "summary.md").read_text().splitlines()[-1] == note


def test_a_programs_error_metric_ranks_lowest_first_and_the_summary_says_why(
    tmp_path: Path, capsys
) -> None:
    from hpcdl.cli.compose import compose_config
    from hpcdl.cli.main import main
    from hpcdl.cli.run import plan_program_sweep, script_from

    command = ["python", "fit.py", "--lr={0.1,0.3,0.9}"]
    script, overrides = script_from(
        ["metrics_file=m.json", f"hydra.sweep.dir={tmp_path / 'sw'}"], command
    )
    plan = plan_program_sweep(compose_config(overrides, script=script, multirun=True), overrides)
    sweep = _completed_sweep(plan, [{"error": 0.2}, {"error": 0.0}, {"error": 0.6}])
    assert main(["sweep", "summary", str(sweep)]) == 0  # the default: the program's first metric
    out = capsys.readouterr().out
    assert _ranked(out) == ["--lr=0.3", "--lr=0.1", "--lr=0.9"]
    assert out.startswith(
        "ranked by error, lowest first (a metric hpcdl does not define: guessed from its "
        "name); --mode max reverses it\n"
    )
    assert main(["sweep", "summary", str(sweep), "--metric", "wall_s", "--format", "csv"]) == 0
    err = capsys.readouterr().err
    assert "ranked by wall_s, lowest first" in err  # stdout: the CSV
    assert "report no metric of their own" not in err  # wall_s asked for by name
    # Programs that report nothing: ranked by run time, which is said (a user trial took
    # the fastest lr for the best).
    quiet = _completed_sweep(
        plan_program_sweep(
            compose_config([f"hydra.sweep.dir={tmp_path / 'quiet'}"], script=script, multirun=True),
            [f"hydra.sweep.dir={tmp_path / 'quiet'}"],
        ),
        [{}, {}, {}],
    )
    assert main(["sweep", "summary", str(quiet)]) == 0
    err = capsys.readouterr().err
    assert "the programs report no metric of their own" in err and "wall_s" in err, err


@pytest.mark.parametrize(
    ("metric", "lower"),
    [
        ("error", True),
        ("val_error_rate", True),
        ("TrainLoss", True),
        ("perplexity", True),
        ("val_ppl", True),
        ("test_mse", True),
        ("wall_s", True),
        ("step_ms", True),
        ("epoch_time", True),
        ("val_score", False),
        ("bleu", False),
        ("samples_per_s", False),
    ],
)
def test_a_metric_hpcdl_does_not_define_is_guessed_from_its_name(metric: str, lower: bool) -> None:
    from hpcdl.config.metrics import lower_by_name

    assert lower_by_name(metric) is lower


def test_every_metric_of_a_built_in_task_has_a_direction() -> None:
    # The tasks report the table's metrics (hpcdl.config.metrics), so none ranks by a guess.
    from hpcdl.config.metrics import TASK_METRICS, builtin_mode
    from hpcdl.config.schema import RegressionLoss
    from hpcdl.tasks import ClassificationTask, RegressionTask

    reported = {
        "classification": ClassificationTask().metrics({"correct": 3.0}, 4, 0.5),
        "regression": RegressionTask(RegressionLoss.mse).metrics(
            {"abs_err": 1.0, "sq_err": 1.0, "y": 2.0, "y2": 5.0}, 2, 0.5
        ),
    }
    assert {task: set(m) for task, m in reported.items()} == {
        task: set(m) for task, m in TASK_METRICS.items()
    }
    assert [builtin_mode(f"val_{m}") for m in ("loss", "accuracy", "mae", "rmse", "r2")] == [
        "min",
        "max",
        "min",
        "min",
        "max",
    ]


def test_a_one_trial_sweeps_status_says_1_trial(tmp_path: Path) -> None:
    from hpcdl.sweep import launch
    from hpcdl.sweep.report import status_table

    ledger = launch.create_sweep(
        plan_sweep(["optim.lr=choice(0.1)", f"hydra.sweep.dir={tmp_path}"])
    )
    table = status_table(ledger, "val_accuracy")
    assert "\n1 trial: 1 NOT_STARTED\n" in table, table
    # A local sweep (cluster=debug here) runs its trials as processes: the column says pid.
    assert table.split("\n")[0].split("|")[3].strip() == "pid", table


def test_a_local_sweep_on_data_that_cannot_be_read_is_refused_before_its_sweep_dir(
    hpcdl, tmp_path: Path
) -> None:
    """As `hpcdl train` refuses it: the sweep dir and a FAILED trial each (exit 1) were made
    first (helper A's CSV). The first trial is probed; trials that differ in their data are
    checked by their own runs (test_local_sweep_ledger_failed_trial_rerun_and_kfold_summary)."""
    (tmp_path / "num.csv").write_text("a,b,price\n1,2,3\n4,x,6\n")
    data = ["task=regression", "data=files", "data.path=num.csv", "data.label_column=price"]
    out = hpcdl("train", "-m", *data, "optim.lr=0.01,0.003", "hydra.sweep.dir=sw")
    assert out.returncode == 2, out.stderr + out.stdout
    assert out.stderr.startswith("error: trial 0 (optim.lr=0.01): data.path: 'num.csv' line 3")
    assert out.stderr.count("\n") == 1 and not (tmp_path / "sw").exists()


def test_summary_has_no_std_for_one_value_or_none(tmp_path: Path) -> None:
    import math

    from hpcdl.rundir import RunDir
    from hpcdl.sweep import launch
    from hpcdl.sweep.direction import direction
    from hpcdl.sweep.report import refresh, summarize

    sweep = tmp_path / "sw"
    launch.create_sweep(plan_sweep(["optim.lr=0.1,0.01", f"hydra.sweep.dir={sweep}"]))
    RunDir(sweep / "0").write_summary({"val_accuracy": 0.9})  # trial 1 failed: no value
    ledger, metric = refresh(sweep)
    entries = summarize(ledger, metric, direction(ledger, metric))
    assert [(e["overrides"], e["n"], e["mean"]) for e in entries[:1]] == [("optim.lr=0.1", 1, 0.9)]
    assert all(math.isnan(e["std"]) for e in entries)  # 0.0 claimed that the folds agree


def test_sweeps_started_in_the_same_second_get_their_own_default_dir(
    tmp_path: Path, monkeypatch
) -> None:
    from hpcdl.sweep import launch

    monkeypatch.setattr(launch, "default_sweep_dir", lambda: tmp_path / "multirun" / "12-00-00")
    dirs = [launch.create_sweep(plan_sweep(["optim.lr=0.1,0.01"])).sweep_dir for _ in range(3)]
    assert [Path(d).name for d in dirs] == ["12-00-00", "12-00-00-1", "12-00-00-2"]


def test_two_sweeps_started_at_once_each_get_their_own_default_dir(
    tmp_path: Path, monkeypatch
) -> None:
    from hpcdl.sweep import launch

    monkeypatch.setattr(launch, "default_sweep_dir", lambda: tmp_path / "multirun" / "12-00-00")
    fill, others, started = launch._fill_sweep, [], []

    def another_sweep_meanwhile(plan, sweep_dir):  # a thread or process, same second
        if not started:
            started.append(sweep_dir)
            others.append(launch.create_sweep(plan_sweep(["optim.lr=0.1,0.01"])))
        return fill(plan, sweep_dir)

    monkeypatch.setattr(launch, "_fill_sweep", another_sweep_meanwhile)
    first = launch.create_sweep(plan_sweep(["optim.lr=0.3,0.03"]))
    assert first.sweep_dir != others[0].sweep_dir  # it took the name the first had looked at
    for ledger in (first, others[0]):  # and neither's cleanup removed the other's trials
        assert (Path(ledger.sweep_dir) / "sweep.json").is_file()
        assert (Path(ledger.sweep_dir) / "1" / "config.yaml").is_file()


def test_sweep_summary_rows_carry_the_notes_the_command_prints(tmp_path: Path) -> None:
    from hpcdl import Sweep
    from hpcdl.rundir import RunDir
    from hpcdl.sweep import launch
    from hpcdl.sweep.report import edit_notes, refresh

    sweep = tmp_path / "sw"
    launch.create_sweep(plan_sweep(["optim.lr=0.1,0.01", f"hydra.sweep.dir={sweep}"]))
    for i, value in ((0, 0.9), (1, 0.8)):
        RunDir(sweep / str(i)).write_summary({"val_accuracy": value})
    with open(sweep / "1" / "commands.log", "a") as log:
        log.write(f"2026-11-26T07:05:00 resume: hpcdl resume {sweep}/1 trainer.max_epochs=50\n")
    rows = Sweep(sweep).summary()
    assert [(r["overrides"], r["notes"]) for r in rows] == [
        ("optim.lr=0.1", []),
        ("optim.lr=0.01", ["trial 1: resumed by hand with trainer.max_epochs=50"]),
    ]  # the command printed it below its table; the rows did not say
    assert edit_notes(refresh(sweep)[0]) == "trial 1: resumed by hand with trainer.max_epochs=50\n"


def test_a_sweep_ranked_by_hpcdls_own_wall_time_says_so(tmp_path: Path) -> None:
    # Before: "ranked by wall_s, lowest first (a metric hpcdl does not define: guessed ...)".
    from hpcdl.sweep import launch
    from hpcdl.sweep.direction import direction
    from hpcdl.sweep.report import refresh

    sweep = tmp_path / "sw"
    launch.create_sweep(plan_sweep(["optim.lr=0.1,0.01", f"hydra.sweep.dir={sweep}"]))
    ledger, _ = refresh(sweep)
    assert direction(ledger, "wall_s").header("wall_s") == (
        "ranked by wall_s, lowest first (wall_s: hpcdl's wall time, lower is better); "
        "--mode max reverses it"
    )


def test_a_summary_averages_over_seeds_with_over(tmp_path: Path, capsys) -> None:
    """`--over trainer.seed` groups the seeds of each configuration, as data.fold is grouped:
    mean, std and n across them, and the trials named; a key no trial sweeps is one line."""
    from hpcdl import Sweep
    from hpcdl.cli.main import main

    plan = plan_sweep(
        ["optim.lr=0.1,0.01", "trainer.seed=1,2,3", f"hydra.sweep.dir={tmp_path / 'sw'}"]
    )
    values = [0.90, 0.80, 0.85, 0.95, 0.97, 0.96]  # lr 0.1: trials 0-2; lr 0.01: 3-5
    sweep = _completed_sweep(plan, [{"val_accuracy": v} for v in values])
    assert main(["sweep", "summary", str(sweep), "--over", "trainer.seed"]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [[cell.strip() for cell in line.split("|")[1:-1]] for line in table] == [
        ["rank", "overrides", "val_accuracy mean", "std", "n", "trials", "state"],
        ["1", "optim.lr=0.01", "0.9600", "0.0100", "3", "3-5", "COMPLETED"],
        ["2", "optim.lr=0.1", "0.8500", "0.0500", "3", "0-2", "COMPLETED"],
    ]
    rows = Sweep(sweep).summary(over=["trainer.seed"])
    assert [(r["overrides"], r["trials"], r["n"]) for r in rows] == [
        ("optim.lr=0.01", [3, 4, 5], 3),
        ("optim.lr=0.1", [0, 1, 2], 3),
    ]
    assert main(["sweep", "summary", str(sweep), "--over", "seed"]) == 2
    assert capsys.readouterr().err == (
        "error: --over seed: not a swept key of this sweep; its swept keys are optim.lr, "
        "trainer.seed\n"
    )


def test_status_and_summary_read_no_typed_config_of_a_trial_run_as_planned(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    # Each trial's config.yaml converted to a typed config took 98% of `sweep status` and
    # `sweep summary`: about 30 ms a trial, a minute on 2000 trials. A config.yaml with the
    # planned values is read as plain YAML; an edited one still through its typed config.
    from hpcdl.cli.main import main
    from hpcdl.config import convert
    from hpcdl.sweep import launch

    sweep = tmp_path / "sw"
    launch.create_sweep(plan_sweep(["optim.lr=0.1,1e+30,0.01", f"hydra.sweep.dir={sweep}"]))
    converted = []
    real = convert.from_dict
    monkeypatch.setattr(convert, "from_dict", lambda raw: converted.append(raw) or real(raw))
    assert main(["sweep", "status", str(sweep)]) == 0
    assert len(converted) == 1  # trial 0's, for the default metric: not one per trial
    assert main(["sweep", "summary", str(sweep), "--metric", "val_loss"]) == 0
    assert len(converted) == 1
    config = sweep / "1" / "config.yaml"
    config.write_text(config.read_text().replace("lr: 1.0e+30", "lr: 0.05"))
    assert main(["sweep", "status", str(sweep)]) == 0
    assert "| optim.lr=0.05 |" in capsys.readouterr().out
    assert len(converted) == 3  # trial 0's again, and the edited trial 1's


def test_summary_as_csv_puts_the_csv_alone_on_stdout(tmp_path: Path, capsys) -> None:
    # The direction's line and `written:` came after the CSV on stdout (`> out.csv` got two
    # rows that were no CSV), and the notes under the table were not printed at all.
    import csv

    from hpcdl.cli.main import main
    from hpcdl.rundir import RunDir
    from hpcdl.sweep import ledger as ledger_mod

    plan = plan_sweep(["optim.lr=0.1,0.01", f"hydra.sweep.dir={tmp_path / 'sw'}"])
    sweep = _completed_sweep(plan, [{"val_accuracy": 0.9}, {"val_accuracy": 0.8}])
    with ledger_mod.locked(sweep) as ledger:
        ledger.trial(1).state = "RUNNING"
        (RunDir(sweep / "1").summary_file).unlink()
    assert main(["sweep", "summary", str(sweep), "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    assert out == (sweep / "summary.csv").read_text()
    assert [row[:2] for row in csv.reader(out.splitlines())] == [
        ["rank", "overrides"],
        ["1", "optim.lr=0.1"],
        ["2", "optim.lr=0.01"],
    ]
    lines = err.splitlines()
    assert lines[0].startswith("ranked by val_accuracy, highest first")
    assert lines[1].startswith("trial 1 has not completed (RUNNING)")
    assert lines[2].startswith("written: ")


def test_sweep_status_help_does_not_say_it_ranks(capsys) -> None:
    from hpcdl.cli.main import main

    with pytest.raises(SystemExit):
        main(["sweep", "status", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--metric METRIC the metric to show in each trial's row" in out
    assert "rank by" not in out


def test_a_rerun_names_its_trials_as_ranges(tmp_path: Path, capsys) -> None:
    # `sweep rerun --failed --dry-run` of 1870 trials printed each index: an 11 kB line.
    from hpcdl.cli.main import main
    from hpcdl.sweep import launch

    sweep = tmp_path / "sw"
    launch.create_sweep(plan_sweep(["trainer.seed=range(0,40)", f"hydra.sweep.dir={sweep}"]))
    for index in (3, 7):
        launch._finish_trial(sweep, index, 0)
    capsys.readouterr()
    assert main(["sweep", "rerun", str(sweep), "--failed", "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "would rerun 38 trials: 0-2, 4-6, 8-39",
        "# dry run: nothing submitted",
    ]


def test_summary_at_best_ranks_by_each_trials_best_epoch(tmp_path: Path, capsys) -> None:
    # Before: only the last epoch's value; lr=0.1 peaked at epoch 2 (its best.pt) and then
    # overfitted, and ranked below lr=0.01 by its last epoch.
    from hpcdl import Sweep
    from hpcdl.cli.main import main
    from hpcdl.rundir import RunDir
    from hpcdl.sweep import launch

    sweep = tmp_path / "sw"
    ledger = launch.create_sweep(plan_sweep(["optim.lr=0.1,0.01", f"hydra.sweep.dir={sweep}"]))
    epochs = {  # per trial: (val_accuracy, val_loss) of epochs 1-3
        0: [(0.95, 0.10), (0.99, 0.02), (0.90, 0.30)],
        1: [(0.80, 0.50), (0.93, 0.20), (0.94, 0.15)],
    }
    for t in ledger.trials:
        run = RunDir(Path(t.run_dir))
        for epoch, (acc, loss) in enumerate(epochs[t.index], 1):
            run.metrics.append({"epoch": epoch, "val_accuracy": acc, "val_loss": loss})
        best = min(range(3), key=lambda e: epochs[t.index][e][1]) + 1
        run.write_summary(
            {"outcome": "completed", "best_epoch": best, "best_metric_name": "val_loss",
             "test_accuracy": 0.9}
        )  # fmt: skip
        launch._finish_trial(sweep, t.index, 0)
    capsys.readouterr()
    assert main(["sweep", "summary", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert _ranked(out) == ["optim.lr=0.01", "optim.lr=0.1"] and "0.9000" in out
    assert main(["sweep", "summary", str(sweep), "--at", "best"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        "ranked by val_accuracy at each trial's best epoch (its best.pt's, by val_loss), "
        "highest first (accuracy: higher is better); --mode min reverses it"
    )
    assert "| val_accuracy (best epoch) mean |" in out
    assert _ranked(out) == ["optim.lr=0.1", "optim.lr=0.01"]
    assert [_cells(row)[2] for row in _rows(out.split("\n\n", 1)[1])] == ["0.9900", "0.9400"]
    assert (sweep / "summary.csv").read_text().splitlines()[:2] == [
        "rank,overrides,val_accuracy_at_best_mean,val_accuracy_at_best_std,n,trials,state",
        "1,optim.lr=0.1,0.99,,1,0,COMPLETED",
    ]
    rows = Sweep(sweep).summary(at="best", metric="val_loss")
    assert [(r["overrides"], r["mean"]) for r in rows] == [
        ("optim.lr=0.1", 0.02),
        ("optim.lr=0.01", 0.15),
    ]
    assert main(["sweep", "summary", str(sweep), "--at", "best", "--metric", "test_accuracy"]) == 2
    assert capsys.readouterr().err == (
        "error: --at best: test_accuracy is in no trial's metrics.csv (measured once, at the "
        "end, not per epoch); give --at best a per-epoch metric with --metric (val_accuracy, "
        "val_loss), or rank by this one with --at last\n"
    )


def test_a_summary_shows_each_rows_state_and_leaves_failed_folds_out_of_the_mean(
    tmp_path: Path, capsys
) -> None:
    # A failed trial was ranked beside completed ones with no mark, and a fold that failed
    # (diverged) had its last value in its configuration's mean, n counting it.
    import csv

    from hpcdl import Sweep
    from hpcdl.cli.main import main
    from hpcdl.sweep import ledger as ledger_mod

    plan = plan_sweep(
        [
            "optim.lr=0.1,0.01",
            "data.num_folds=3",
            "data.fold=range(0,3)",
            f"hydra.sweep.dir={tmp_path / 'sw'}",
        ]
    )
    values = [0.9, 0.3, 0.8, 0.7, 0.7, 0.7]  # lr 0.1: trials 0-2; trial 1 failed at 0.3
    sweep = _completed_sweep(plan, [{"val_accuracy": v} for v in values])
    with ledger_mod.locked(sweep) as ledger:
        ledger.trial(1).state = "FAILED"
        (sweep / "1" / "summary.json").unlink()
    assert main(["sweep", "summary", str(sweep)]) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert [[cell.strip() for cell in line.split("|")[1:-1]] for line in table[1:]] == [
        ["1", "optim.lr=0.1", "0.8500", "0.0707", "2", "0-2", "2 COMPLETED, 1 FAILED"],
        ["2", "optim.lr=0.01", "0.7000", "0.0000", "3", "3-5", "COMPLETED"],
    ]
    note = (
        "optim.lr=0.1: trial 1 has not completed (FAILED); its mean is over the other 2 of 3 only"
    )
    assert note in out.splitlines()
    assert "its val_accuracy is the last value" not in out  # not ranked by it
    rows = list(csv.DictReader((sweep / "summary.csv").read_text().splitlines()))
    assert [(r["n"], r["state"]) for r in rows] == [
        ("2", "2 COMPLETED, 1 FAILED"),
        ("3", "COMPLETED"),
    ]
    assert [r["state"] for r in Sweep(sweep).summary()] == ["2 COMPLETED, 1 FAILED", "COMPLETED"]
    # A configuration none of whose trials has completed is ranked by what they reported.
    with ledger_mod.locked(sweep) as ledger:
        for index in (3, 4, 5):
            ledger.trial(index).state = "RUNNING"
            (sweep / str(index) / "summary.json").unlink()
    assert main(["sweep", "summary", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "| 2    | optim.lr=0.01 | 0.7000" in out and "| 3 | 3-5    | RUNNING" in out
    assert "trials 3, 4, 5 have not completed (RUNNING)" in out
    # A trial Slurm still shows RUNNING whose newest attempt recorded its completed end (the
    # job is exiting; sacct lags): its value is final, and counted (the dev cluster's k-fold
    # summary right after the last summary.json had n=1 and std '-').
    from hpcdl.rundir import RunDir

    with ledger_mod.locked(sweep) as ledger:
        ledger.trial(2).state = "RUNNING"
    run = RunDir(sweep / "2")
    run.append_attempt({"event": "start", "job_id": "7_2", "world_size": 1})
    run.append_attempt({"event": "end", "job_id": "7_2", "reason": "completed"})
    assert main(["sweep", "summary", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "| optim.lr=0.1  | 0.8500            | 0.0707 | 2 | 0-2" in out, out
    # Its summary.json written, its end record not yet (a moment later): counted too.
    import time

    run.append_attempt({"event": "start", "job_id": "8_2", "start_time_s": time.time() - 5})
    run.write_summary({"outcome": "completed", "best_epoch": 1})
    assert main(["sweep", "summary", str(sweep)]) == 0
    assert "| optim.lr=0.1  | 0.8500            | 0.0707 | 2 | 0-2" in capsys.readouterr().out


def test_cancel_names_only_the_trials_still_queued_when_it_cancels(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    # `hpcdl cancel SWEEP` named as cancelled trials that completed during its (slow) pass
    # over the run dirs: the queue is asked again right before scancel.
    import subprocess

    from hpcdl.cli.main import main
    from hpcdl.sweep import launch, states
    from hpcdl.sweep import ledger as ledger_mod

    sweep = tmp_path / "sw"
    launch.create_sweep(plan_sweep(["optim.lr=0.1,0.01,0.001", f"hydra.sweep.dir={sweep}"]))
    with ledger_mod.locked(sweep) as ledger:
        ledger.launcher = "slurm"
        for t in ledger.trials:
            t.job_id = f"28_{t.index}"
    queues = ["28_0|RUNNING\n28_1|RUNNING\n28_2|PENDING\n", "28_0|RUNNING\n28_2|PENDING\n"]
    monkeypatch.setattr(
        states, "query", lambda cmd: queues.pop(0) if cmd[0] == "squeue" else "28_1|RUNNING\n"
    )
    scancel: list[list[str]] = []
    real_run = subprocess.run

    def run(cmd, **kwargs):
        if cmd[0] != "scancel":
            return real_run(cmd, **kwargs)
        scancel.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", run)
    assert main(["cancel", str(sweep)]) == 0
    assert scancel == [["scancel", "28_0", "28_2"]]
    assert f"cancelled 2 trials of {sweep}: 0, 2 (jobs 28_[0,2])" in capsys.readouterr().out
    assert queues == []


def test_the_ledger_names_the_metric_it_holds(tmp_path: Path, capsys) -> None:
    # `sweep summary --metric test_loss` rewrote each trial's `metric` in sweep.json with
    # no word of which metric it was; the next `sweep status` put val_accuracy back.
    from hpcdl.cli.main import main

    plan = plan_sweep(["optim.lr=0.1,0.01", f"hydra.sweep.dir={tmp_path / 'sw'}"])
    rows = [{"val_accuracy": 0.9, "val_loss": 0.3}, {"val_accuracy": 0.8, "val_loss": 0.5}]
    sweep = _completed_sweep(plan, rows)

    def stored() -> list[tuple]:
        trials = json.loads((sweep / "sweep.json").read_text())["trials"]
        return [(t["metric_name"], t["metric"]) for t in trials]

    assert main(["sweep", "summary", str(sweep), "--metric", "val_loss"]) == 0
    assert stored() == [("val_loss", 0.3), ("val_loss", 0.5)]
    assert main(["sweep", "status", str(sweep)]) == 0
    assert stored() == [("val_accuracy", 0.9), ("val_accuracy", 0.8)]


def test_the_summary_plot_labels_a_key_with_many_values_sparsely(
    tmp_path: Path, monkeypatch
) -> None:
    # A label per value: 2000 seeds took 9 s to draw, half of the summary, and overlapped.
    from hpcdl import plots
    from hpcdl.sweep.direction import direction
    from hpcdl.sweep.report import MAX_TICK_LABELS, plot_metric_per_key, refresh

    plan = plan_sweep(["trainer.seed=range(0,100)", f"hydra.sweep.dir={tmp_path / 'sw'}"])
    sweep = _completed_sweep(plan, [{"val_accuracy": i / 100} for i in range(100)])
    figures = []
    monkeypatch.setattr(plots, "save_png", lambda fig, path, dpi: figures.append(fig))
    ledger, metric = refresh(sweep)
    plot_metric_per_key(ledger, metric, direction(ledger, metric), tmp_path / "p.png")
    (ax,) = figures[0].axes
    labels = [label.get_text() for label in ax.get_xticklabels()]
    assert 10 <= len(labels) <= MAX_TICK_LABELS and labels[:2] == ["0", "4"]
    assert len(ax.collections[0].get_offsets()) == 100  # every trial still plotted


def test_a_swept_max_epochs_is_extended_by_resuming_the_trial_not_by_a_rerun(
    tmp_path: Path, monkeypatch
) -> None:
    """A sweep of trainer.max_epochs: the advice for a completed trial with nothing left to
    train was `sweep rerun --trials 0 trainer.max_epochs=N`, itself refused as a swept key
    whose message named trainer.max_epochs=50 as another setting (a dev-cluster trial)."""
    from types import SimpleNamespace

    import hpcdl.nothing_to_train
    from hpcdl.cli.sweep_cmd import refuse_nothing_to_train, rerun_settings
    from hpcdl.errors import ConfigError, HpcdlError

    monkeypatch.setattr(
        hpcdl.nothing_to_train, "nothing_to_train", lambda cfg, run_dir: "trained all 2 epochs"
    )
    trial = [(0, (None, SimpleNamespace(path=tmp_path / "sw" / "0")))]
    with pytest.raises(HpcdlError) as swept:
        refuse_nothing_to_train(trial, tmp_path / "sw", ["trainer.max_epochs", "optim.lr"])
    assert str(swept.value).startswith(
        f"trial 0: trained all 2 epochs: hpcdl resume {tmp_path / 'sw' / '0'} "
        "trainer.max_epochs=N (trainer.max_epochs is swept, so a sweep rerun may not set it); "
    ), swept.value
    with pytest.raises(HpcdlError, match=r"--trials 0 trainer\.max_epochs=N; or train it again"):
        refuse_nothing_to_train(trial, tmp_path / "sw", ["optim.lr"])
    ledger = SimpleNamespace(swept_keys=["trainer.max_epochs"])
    with pytest.raises(ConfigError) as err:
        rerun_settings(ledger, [], ["trainer.max_epochs=9"])
    assert "(cluster.timeout_min=240)" in str(err.value) and "=50" not in str(err.value)
    assert "`hpcdl resume SWEEP_DIR/N trainer.max_epochs=...`" in str(err.value)
