"""The Python API as a notebook uses it: many calls in one interpreter, each leaving the
interpreter (its environment, its signal handlers) as it found it, and calls made from
a thread refused in one line before anything is created."""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hpcdl import Sweep, submit, submit_sweep
from hpcdl.errors import HpcdlError


@pytest.mark.slow
def test_a_local_run_leaves_the_notebooks_environment_as_it_was(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = dict(os.environ)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    job = submit(
        [
            "run_dir=run",
            "cluster=local",
            "cluster.tasks_per_node=1",
            "trainer.max_epochs=1",
            "+cluster.env.OMP_NUM_THREADS=1",
        ]
    )
    summary = job.result()
    assert summary is not None and summary["cpu_threads"] == 1  # the rank had cluster.env
    # Not kept for the notebook's next runs (its own cluster=debug runs read
    # OMP_NUM_THREADS too): no cluster.env, MASTER_ADDR/PORT, HPCDL_FOREGROUND left.
    assert dict(os.environ) == before
    assert {s: signal.getsignal(s) for s in handlers} == handlers


def _in_a_thread(call, *args):
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call, *args).result()


@pytest.mark.parametrize(
    ("call", "overrides", "what"),
    [
        (submit, ["run_dir=run"], "cluster=debug"),
        (submit, ["run_dir=run", "cluster=local"], "cluster=local"),
        (submit_sweep, ["hydra.sweep.dir=sw", "optim.lr=0.1,0.01"], "a sweep on cluster=debug"),
    ],
)
def test_a_foreground_run_from_a_thread_is_refused_in_one_line_creating_nothing(
    tmp_path: Path, monkeypatch, call, overrides, what
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HpcdlError) as refused:
        _in_a_thread(call, overrides)
    message = str(refused.value)
    assert "\n" not in message and what in message and "main thread" in message
    assert list(tmp_path.iterdir()) == []  # was: a FAILED run dir and a ValueError


def test_a_slurm_submission_from_a_thread_is_not_refused_for_it(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HpcdlError) as refused:  # refused by validation, as in the main thread
        _in_a_thread(submit, ["cluster=rivanna_a100", "trainer.batch_size=-1"])
    assert "main thread" not in str(refused.value)


def test_rerunning_a_local_sweeps_trials_from_a_thread_is_refused(tmp_path, monkeypatch) -> None:
    from hpcdl.cli.expand import plan_sweep
    from hpcdl.sweep.launch import create_sweep

    monkeypatch.chdir(tmp_path)
    ledger = create_sweep(plan_sweep(["hydra.sweep.dir=sw", "optim.lr=0.1,0.01"]))
    sweep = Sweep.from_sweep_dir(ledger.sweep_dir)
    with pytest.raises(HpcdlError, match=r"^Sweep\.rerun_failed\(\) from a thread"):
        _in_a_thread(sweep.rerun_failed)


def test_a_notebook_that_initialized_hydra_itself_can_submit_and_keeps_its_own(
    tmp_path: Path, monkeypatch
) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.version import VersionBase

    from hpcdl.cli.compose import compose_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("a: 1\n")
    with initialize_config_dir(str(tmp_path), version_base="1.2"):
        before = VersionBase.instance().getbase()
        assert compose_config(["trainer.max_epochs=3"]).trainer.max_epochs == 3
        with pytest.raises(HpcdlError, match=r"^trainer\.max_epoch: unknown key; did you mean"):
            submit(["trainer.max_epoch=5"])  # was: "GlobalHydra is already initialized"
        assert compose("mine") == {"a": 1}  # the notebook's own Hydra, as it was
        assert VersionBase.instance().getbase() == before
    assert list(tmp_path.iterdir()) == [tmp_path / "mine.yaml"]


@pytest.mark.parametrize("odd", [None, {"trainer.max_epochs": 1}, 5, b"model=cnn"])
def test_overrides_that_are_no_list_of_strings_are_one_line(odd, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    # was: TypeError "'NoneType' object is not iterable"; a dict's keys taken as overrides
    with pytest.raises(HpcdlError, match=r"^overrides=.*: give a list of strings"):
        submit(odd)
    with pytest.raises(HpcdlError, match=r"^overrides=.*: give a list of strings"):
        submit_sweep(odd)
    assert list(tmp_path.iterdir()) == []


def test_overrides_may_come_as_a_tuple_or_a_generator() -> None:
    from hpcdl.client import _overrides

    assert _overrides(("model=cnn", "data=digits")) == ["model=cnn", "data=digits"]
    assert _overrides(o for o in ["model=cnn"]) == ["model=cnn"]


@pytest.mark.parametrize("odd", [5, [Path("conf"), 5]])
def test_a_config_dir_that_is_no_folder_name_is_one_line(odd, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HpcdlError, match=r"^config_dir=.*: give a folder \(a str or Path\)"):
        submit(["trainer.max_epochs=1"], config_dir=odd)
    assert list(tmp_path.iterdir()) == []
