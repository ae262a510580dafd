"""The Python API (hpcdl.client) without a cluster: lazy import, a debug run, reattaching,
the command's errors, wait() against a scripted scheduler, a local sweep."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from hpcdl import Job, JobFailedError, Sweep, WaitTimeoutError, submit, submit_sweep
from hpcdl.cli.compose import compose_config
from hpcdl.errors import HpcdlError
from hpcdl.rundir import RunDir, create_run_dir
from tests.conftest import run_without_torch


def test_import_hpcdl_imports_nothing_and_the_api_imports_no_torch(tmp_path: Path) -> None:
    code = (
        "import hpcdl\n"
        "assert [m for m in sys.modules if m.startswith('hpcdl')] == ['hpcdl'], sys.modules\n"
        "from hpcdl import HpcdlError, Job, Sweep, submit, submit_sweep\n"
        "import hpcdl.errors\n"
        "assert HpcdlError is hpcdl.errors.HpcdlError and issubclass(hpcdl.JobFailedError, HpcdlError)\n"
        "try:\n"
        "    submit(['cluster=rivanna_a100', 'trainer.batch_size=-1'])\n"
        "except HpcdlError as err:\n"
        "    print('refused:', err)\n"
        "import hpcdl.sweep.report  # the sweep package: submit_sweep keeps its own name\n"
        "assert hpcdl.submit_sweep is submit_sweep and callable(hpcdl.submit_sweep)\n"
    )
    out = run_without_torch(code, cwd=tmp_path)
    assert "refused: trainer.batch_size=-1: must be > 0" in out.stdout
    with pytest.raises(AttributeError, match="no attribute 'sweep_now'"):
        import hpcdl

        hpcdl.sweep_now  # noqa: B018


def test_submit_trains_a_debug_run_and_from_run_dir_reattaches(
    tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    job = submit(["run_dir=run", "trainer.max_epochs=2"])
    assert job.run_dir == tmp_path / "run" and job.job_id is None
    summary = job.result()
    assert summary is not None and summary["epochs"] == 2
    assert 0.0 <= summary["test_accuracy"] <= 1.0 and "test_loss" in summary
    assert job.wait() == summary  # trained in the foreground: returns at once
    status = job.status()
    assert status["state"] == "COMPLETED" and status["last_epoch"] == 2
    assert status["test_accuracy"] == summary["test_accuracy"]
    assert (status["attempts"], status["last_end"]) == (1, "completed")  # its own record

    again = Job.from_run_dir("run")
    assert again == job and again.result() == summary
    assert again.status()["state"] == "COMPLETED"
    with pytest.raises(HpcdlError, match="prints to the console only"):
        again.logs()
    capsys.readouterr()
    again.cancel()  # not a Slurm job, and it has ended
    assert capsys.readouterr().out.endswith("has ended (COMPLETED); nothing to cancel\n")
    with pytest.raises(HpcdlError, match="not an hpcdl run dir"):
        Job.from_run_dir(tmp_path)


@pytest.mark.parametrize(
    "overrides",
    [
        ["model=nope"],
        ["trainer.max_epoch=5"],
        ["trainer.batch_size=-1"],
        ["cluster=devcluster", "cluster.nodes=0"],
        ["-m", "optim.lr=0.1,-1"],
    ],
)
def test_bad_input_raises_the_commands_line_and_creates_nothing(
    hpcdl, tmp_path, monkeypatch, overrides
) -> None:
    cli = hpcdl("train", *overrides)
    assert cli.returncode == 2, cli.stdout + cli.stderr
    line = cli.stderr.strip()
    assert line.startswith("error: ") and "\n" not in line
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HpcdlError) as refused:
        if overrides[0] == "-m":
            submit_sweep(overrides[1:])
        else:
            submit(overrides)
    assert f"error: {refused.value}" == line
    assert list(tmp_path.iterdir()) == []


def test_overrides_must_be_a_list_of_strings() -> None:
    with pytest.raises(HpcdlError, match=r"give a list of strings, e\.g\. \['model=cnn'"):
        submit("model=cnn data=digits")  # type: ignore[arg-type]


def test_command_options_and_swept_values_name_the_api_call(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for option in ("-m", "--no-preflight"):  # Hydra said `LexerNoViableAltException: -m`
        with pytest.raises(HpcdlError, match=f"^'{option}': an option of the command, not an"):
            submit([option, "optim.lr=0.1,0.01"])
    with pytest.raises(HpcdlError, match=r"several values are a sweep: call submit_sweep\(\)"):
        submit(["optim.lr=0.1,0.01"])  # the command's advice was `add -m`
    assert list(tmp_path.iterdir()) == []


def _submitted_run(tmp_path: Path, job_id: str) -> Job:
    _, run_dir = create_run_dir(compose_config([f"run_dir={tmp_path / 'run'}"]))
    run_dir.record_submission(job_id, "devcluster", run_dir.log_dir)
    run_dir.log_dir.mkdir()
    run_dir.rank_log(job_id, 0).write_text("epoch 1/30: ...\n")
    return Job.from_run_dir(run_dir.path)


def _scheduler(monkeypatch, *states: str) -> list[str]:
    """job_state() answers these states in turn (the last one for ever); the calls made."""
    calls: list[str] = []

    def job_state(job_id: str) -> dict[str, str]:
        calls.append(job_id)
        state = states[min(len(calls), len(states)) - 1]
        return {"job_id": job_id, "state": state, "source": "sacct"}

    monkeypatch.setattr("hpcdl.launch.monitor.job_state", job_state)
    return calls


def test_wait_polls_until_the_job_left_the_queue_and_names_state_and_log(
    tmp_path, monkeypatch
) -> None:
    job = _submitted_run(tmp_path, "4242")
    calls = _scheduler(monkeypatch, "PENDING", "RUNNING", "REQUEUED", "RUNNING", "TIMEOUT")
    with pytest.raises(JobFailedError) as failed:
        job.wait(poll_s=0)
    assert len(calls) == 5  # stopped asking once the job had left the queue
    assert failed.value.state == "TIMEOUT"
    assert failed.value.log == tmp_path / "run" / "logs" / "4242_0_log.out"
    message = str(failed.value)
    assert "job 4242 ended TIMEOUT" in message and "4242_0_log.out" in message
    assert f"hpcdl resume {tmp_path / 'run'}" in message
    assert job.logs() == "epoch 1/30: ...\n"
    assert job.status()["state"] == "TIMEOUT"


def test_wait_returns_the_summary_once_completed_and_times_out_while_running(
    tmp_path, monkeypatch
) -> None:
    job = _submitted_run(tmp_path, "77")
    _scheduler(monkeypatch, "RUNNING")
    with pytest.raises(WaitTimeoutError, match=r"job 77 .* still running after 0.05 s") as late:
        job.wait(timeout=0.05, poll_s=0.01)
    assert isinstance(late.value, TimeoutError)
    RunDir(job.run_dir).write_summary({"outcome": "completed", "test_accuracy": 0.9})
    _scheduler(monkeypatch, "RUNNING", "COMPLETED")
    assert job.wait(poll_s=0) == {"outcome": "completed", "test_accuracy": 0.9}


@pytest.mark.slow
def test_local_sweep_status_summary_and_rerun_failed(tmp_path, monkeypatch) -> None:
    from sklearn.datasets import load_breast_cancer

    monkeypatch.chdir(tmp_path)
    x, y = load_breast_cancer(return_X_y=True)
    np.savez("good.npz", x=x, y=y)
    np.savez("broken.npz", x=x, y=y[:100])  # wrong lengths: passes the checks before it runs
    sweep = submit_sweep(
        [
            "hydra.sweep.dir=sw",
            "data=files",
            "data.path=good.npz,broken.npz",
            "trainer.max_epochs=2",
        ]
    )
    assert sweep == Sweep.from_sweep_dir("sw")
    assert [t["state"] for t in sweep.wait()] == ["COMPLETED", "FAILED"]  # ran in the foreground
    assert "epoch 2/2" in sweep.trial(0).logs()
    assert [t["index"] for t in sweep.status(state="failed")] == [1]  # --state failed
    assert [t["index"] for t in sweep.status(state=["Failed", "completed"])] == [0, 1]
    with pytest.raises(HpcdlError, match=r"^state='broke': no trial state of that name"):
        sweep.status(state="broke")

    np.savez("broken.npz", x=x, y=y)
    assert sweep.rerun_failed() == [1]
    trials = sweep.status()
    assert [(t["state"], t["attempts"]) for t in trials] == [("COMPLETED", 1), ("COMPLETED", 2)]
    ranked = sweep.summary(metric="test_accuracy")
    assert [e["rank"] for e in ranked] == [1, 2] and ranked[0]["mean"] >= ranked[1]["mean"]
    assert {e["metric"] for e in ranked} == {"test_accuracy"}
    assert (tmp_path / "sw" / "summary.csv").is_file()
    # A typo is refused as the command refuses it, in the call's words (not `--metric`).
    with pytest.raises(HpcdlError) as refused:
        sweep.summary(metric="test_acuracy")
    message = str(refused.value)
    assert message.startswith(
        "metric='test_acuracy': no trial reports it; did you mean test_accuracy?"
    )
    assert "--metric" not in message and "\n" not in message
    with pytest.raises(HpcdlError, match=r"^metric='val_acuracy': no trial reports it"):
        sweep.status(metric="val_acuracy")
    with pytest.raises(HpcdlError, match=r"^mode='best': choose 'min'"):
        sweep.summary(mode="best")
    with pytest.raises(HpcdlError, match=r"no sweep\.json"):
        Sweep.from_sweep_dir(tmp_path)


def test_a_trial_the_sweep_does_not_have_is_refused_naming_its_trials(tmp_path: Path) -> None:
    # Before, trial(5) of a 2-trial sweep said "SWEEP_DIR/5: not an hpcdl run dir", and
    # trial(-1) looked for a run dir named -1.
    from hpcdl.cli.expand import plan_sweep
    from hpcdl.sweep import launch

    plan = plan_sweep(["optim.lr=0.1,0.01", f"hydra.sweep.dir={tmp_path / 'sw'}"])
    sweep = Sweep.from_sweep_dir(launch.create_sweep(plan).sweep_dir)
    assert sweep.trial(1).run_dir == tmp_path / "sw" / "1"
    for index in (2, -1):
        with pytest.raises(HpcdlError) as refused:
            sweep.trial(index)
        assert str(refused.value) == (
            f"trial {index}: {tmp_path / 'sw'} has no such trial; give one of its 2 trials, 0 to 1"
        )


def test_a_trial_index_that_is_no_int_is_refused_as_such(tmp_path: Path) -> None:
    # Before, trial("0") said "trial 0: ... has no such trial; give one of its 2 trials, 0
    # to 1", contradicting itself.
    from hpcdl.cli.expand import plan_sweep
    from hpcdl.sweep import launch

    plan = plan_sweep(["optim.lr=0.1,0.01", f"hydra.sweep.dir={tmp_path / 'sw'}"])
    sweep = Sweep.from_sweep_dir(launch.create_sweep(plan).sweep_dir)
    assert sweep.trial(np.int64(1)).run_dir == tmp_path / "sw" / "1"
    for index in ("0", 1.0, True):
        with pytest.raises(HpcdlError) as refused:
            sweep.trial(index)  # type: ignore[arg-type]
        assert (
            str(refused.value)
            == f"trial {index!r}: give the trial's index as an int, one of 0 to 1"
        )


def test_wait_raises_for_a_resumed_attempt_that_failed_not_the_earlier_summary(
    tmp_path, monkeypatch
) -> None:
    job = _submitted_run(tmp_path, "12")
    run_dir = RunDir(job.run_dir)
    run_dir.append_attempt({"event": "start", "job_id": "11"})
    run_dir.append_attempt({"event": "end", "job_id": "11", "reason": "completed"})
    run_dir.write_summary({"outcome": "completed", "epochs": 6})
    run_dir.append_attempt({"event": "start", "job_id": "12"})  # resumed for more epochs
    run_dir.append_attempt({"event": "end", "job_id": "12", "reason": "cancelled"})
    _scheduler(monkeypatch, "RUNNING", "CANCELLED")
    with pytest.raises(JobFailedError, match="job 12 ended CANCELLED") as failed:
        job.wait(poll_s=0)
    assert failed.value.state == "CANCELLED"


def test_job_and_sweep_made_from_a_relative_str_work_after_a_chdir(tmp_path, monkeypatch) -> None:
    job = _submitted_run(tmp_path, "5")
    monkeypatch.chdir(tmp_path)
    made = Job("run")
    monkeypatch.chdir("/")
    assert made == job and made.job_id == "5"
    assert made.logs() == "epoch 1/30: ...\n"
    monkeypatch.chdir(tmp_path)
    assert Sweep("sweeps").sweep_dir == tmp_path / "sweeps"


def test_resume_continues_for_more_epochs_and_branches_from_an_older_checkpoint(
    tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    job = submit(["run_dir=run", "trainer.max_epochs=1", "trainer.keep_last=5"])
    config = (tmp_path / "run" / "config.yaml").read_bytes()
    with pytest.raises(HpcdlError, match=r"trainer\.max_epoch: unknown key"):
        job.resume(["trainer.max_epoch=2"])
    assert (tmp_path / "run" / "config.yaml").read_bytes() == config
    first = job.result()
    assert job.resume(["trainer.max_epochs=2"]) == job
    assert job.wait()["epochs"] == 2
    log = (tmp_path / "run" / "commands.log").read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in log] == [  # was the test runner's argv
        "train: hpcdl train run_dir=run trainer.max_epochs=1 trainer.keep_last=5",
        f"resume: hpcdl resume {tmp_path / 'run'} trainer.max_epochs=2",
    ]
    older, newest = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*.pt"))
    branch = job.resume(["trainer.max_epochs=3"], from_checkpoint=older, new_run_dir="branch")
    assert branch.run_dir == tmp_path / "branch" and branch.wait()["epochs"] == 3
    assert job.result() is not None and job.result() != first  # the run went on in place
    with pytest.raises(HpcdlError, match="new_run_dir='again': not created"):
        job.resume(from_checkpoint=newest, new_run_dir="again")  # trained to max_epochs
    assert not (tmp_path / "again").exists()
    assert "nothing to train" in capsys.readouterr().out


def test_a_model_module_beside_the_notebook_is_found_from_a_run_made_elsewhere(
    tmp_path, monkeypatch, capsys
) -> None:
    import sys

    mine, other = tmp_path / "mine", tmp_path / "other"
    mine.mkdir()
    other.mkdir()
    (mine / "nbmodel.py").write_text(
        "from torch import nn\n\n\ndef build(input_shape, num_classes):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], num_classes))\n"
    )
    monkeypatch.chdir(other)  # the run is created from another folder: its workdir
    monkeypatch.syspath_prepend(str(mine))
    overrides = ["model=custom", "model.target=nbmodel:build", "trainer.max_epochs=1"]
    submit(["run_dir=../run", *overrides])
    sys.path.remove(str(mine))
    monkeypatch.delitem(sys.modules, "nbmodel")  # a new kernel, beside the module
    monkeypatch.chdir(mine)
    monkeypatch.syspath_prepend("")  # as a notebook's (and `python -c`'s) sys.path has
    job = Job("../run")
    assert len(job.predict()) == job.evaluate()["num_test_samples"] > 0
    assert job.resume(["trainer.max_epochs=2"]).wait()["epochs"] == 2  # trains in other/
    assert sys.path[0] == ""


def test_a_package_a_script_put_on_sys_path_reaches_its_local_ranks(tmp_path: Path) -> None:
    """`sys.path.insert(0, "src")` in a script, then submit(cluster=local, 2 ranks): the
    check here found the package, and the ranks (started apart, without the script's
    sys.path) could not import it: the run failed after its run dir was made."""
    import subprocess
    import sys

    (tmp_path / "src" / "apipkg").mkdir(parents=True)
    (tmp_path / "src" / "apipkg" / "__init__.py").write_text("")
    (tmp_path / "src" / "apipkg" / "nets.py").write_text(
        "from torch import nn\n\n\ndef build(input_shape, num_classes):\n"
        "    return nn.Linear(input_shape[0], num_classes)\n"
    )
    (tmp_path / "train_api.py").write_text(
        "import sys\n"
        "sys.path.insert(0, 'src')\n"
        "import hpcdl\n"
        "job = hpcdl.submit(['run_dir=run', 'cluster=local', 'cluster.tasks_per_node=2',\n"
        "                    'model=custom', 'model.target=apipkg.nets:build',\n"
        "                    'trainer.max_epochs=1'])\n"
        "print('epochs:', job.wait()['epochs'])\n"
        "hpcdl.submit_sweep(['hydra.sweep.dir=sw', 'model=custom', 'trainer.max_epochs=1',\n"
        "                    'model.target=apipkg.nets:build', 'optim.lr=0.1,0.2'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "train_api.py"], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "epochs: 1" in out.stdout
    # A sweep's trials too (each in a process of its own): they could not import it.
    for trial in ("0", "1"):
        assert (tmp_path / "sw" / trial / "summary.json").is_file(), out.stdout


def test_logs_of_a_rank_the_job_did_not_have_and_a_job_that_never_ran(
    tmp_path, monkeypatch
) -> None:
    job = _submitted_run(tmp_path, "31")
    _scheduler(monkeypatch, "COMPLETED")
    with pytest.raises(HpcdlError, match=r"job 31 \(COMPLETED\) had world size 1, ranks 0-0"):
        job.logs(rank=1)  # was: no log yet (job 31 may still be pending)
    with pytest.raises(HpcdlError, match=r"rank=-1: give a rank as an int"):
        job.logs(rank=-1)
    (job.run_dir / "logs" / "31_0_log.out").unlink()  # cancelled while pending
    _scheduler(monkeypatch, "CANCELLED")
    with pytest.raises(JobFailedError, match="no log: it ended before rank 0 wrote one") as failed:
        job.wait(poll_s=0)
    assert failed.value.log is None


def test_a_debug_run_leaves_the_notebooks_generators_and_torch_modes_as_they_were(
    tmp_path, monkeypatch
) -> None:
    import os
    import random

    import torch

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)

    def draws() -> tuple[float, float, float]:
        return random.random(), float(np.random.rand()), torch.rand(1).item()

    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    expected = draws()
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    job = submit(["run_dir=run", "trainer.max_epochs=1", "trainer.deterministic=true"])
    job.resume(["trainer.max_epochs=2"])  # restores the checkpoint's generator states
    assert draws() == expected  # they were trainer.seed's (0), and the checkpoint's
    assert not torch.are_deterministic_algorithms_enabled()  # was left on: ops then raised
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_wait_is_no_failure_where_slurm_does_not_answer(tmp_path, monkeypatch) -> None:
    from hpcdl.launch.monitor import SQUEUE_FAILED

    job = _submitted_run(tmp_path, "41")
    answers = iter(["UNKNOWN", "RUNNING", "UNKNOWN", "COMPLETED"])

    def job_state(job_id: str) -> dict[str, str]:
        state = next(answers)
        if state == "COMPLETED":
            RunDir(job.run_dir).write_summary({"outcome": "completed"})
        return {
            "job_id": job_id,
            "state": state,
            "source": SQUEUE_FAILED if state == "UNKNOWN" else "squeue",
        }

    monkeypatch.setattr("hpcdl.launch.monitor.job_state", job_state)
    with pytest.raises(HpcdlError, match=r"job 41 .*: Slurm does not answer here") as refused:
        job.wait(poll_s=0)  # was JobFailedError: job 41 ended UNKNOWN
    assert not isinstance(refused.value, JobFailedError)
    assert job.wait(poll_s=0) == {"outcome": "completed"}  # a busy controller's hiccup: waited out


def test_slurm_submissions_from_several_threads_compose_one_at_a_time(
    tmp_path, monkeypatch
) -> None:
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from hpcdl.cli import main as cli

    monkeypatch.setattr(
        cli, "start_run", lambda cfg, skip_preflight: (cfg, SimpleNamespace(path=tmp_path))
    )
    monkeypatch.setattr(cli, "launch_new", lambda cfg, run_dir: 0)  # no sbatch here

    def one(i: int) -> Job:
        return submit(["cluster=devcluster", f"trainer.seed={i}"], preflight=False)

    with ThreadPoolExecutor(8) as pool:  # was: GlobalHydra is already initialized
        assert len(list(pool.map(one, range(16)))) == 16
