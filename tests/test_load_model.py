"""Job.load_model: a trained run's model from Python, as `hpcdl evaluate` rebuilds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_hpcdl, run_without_torch


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("load_model")
    out = run_hpcdl("train", "run_dir=run", "trainer.max_epochs=2", cwd=root)
    assert out.returncode == 0, out.stderr
    return root / "run"


def same_weights(model, path: Path) -> bool:
    import torch

    saved = torch.load(path, weights_only=True)["model"]
    state = model.state_dict()
    return state.keys() == saved.keys() and all(torch.equal(state[k], saved[k]) for k in saved)


def test_load_model_gives_the_checkpoints_weights_in_eval_mode_on_the_cpu(run: Path) -> None:
    import torch

    from hpcdl import Job

    job = Job.from_run_dir(run)
    model = job.load_model()
    assert isinstance(model, torch.nn.Module) and not model.training
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert same_weights(model, run / "checkpoints" / "best.pt")
    newest = sorted((run / "checkpoints").glob("step_*.pt"))[-1]
    assert same_weights(job.load_model("newest"), newest)
    assert same_weights(job.load_model(newest.name), newest)  # a name in checkpoints/
    assert same_weights(job.load_model(str(newest), device="cpu"), newest)  # a path
    assert model(torch.zeros(3, 30)).shape == (3, 2)  # breast_cancer: 30 features, 2 classes


def test_load_model_names_a_checkpoint_that_is_not_there(run: Path) -> None:
    from hpcdl import Job
    from hpcdl.errors import CheckpointError

    with pytest.raises(CheckpointError, match=r"step_000000999\.pt: no such checkpoint file"):
        Job.from_run_dir(run).load_model("step_000000999.pt")


def test_a_checkpoint_may_be_its_global_step_and_other_types_are_one_line(run: Path) -> None:
    import numpy as np

    from hpcdl import Job
    from hpcdl.errors import ConfigError

    job = Job.from_run_dir(run)
    newest = sorted((run / "checkpoints").glob("step_*.pt"))[-1]
    step = int(newest.stem.removeprefix("step_"))
    assert same_weights(job.load_model(step), newest)
    assert same_weights(job.load_model(np.int64(step)), newest)
    assert job.predict(checkpoint=step) == job.predict(checkpoint=newest.name)
    with pytest.raises(ConfigError, match=r"checkpoint=1\.5: give 'best', 'newest'"):
        job.load_model(1.5)  # type: ignore[arg-type]


def test_a_run_that_saved_no_checkpoint_says_so_in_one_line(tmp_path: Path) -> None:
    from hpcdl import Job
    from hpcdl.cli.compose import compose_config
    from hpcdl.errors import CheckpointError
    from hpcdl.rundir import create_run_dir

    _, made = create_run_dir(compose_config([f"run_dir={tmp_path / 'failed'}"]))
    job = Job.from_run_dir(made.path)  # it failed before its first save: no checkpoints/
    for call in (job.load_model, job.evaluate, job.predict):
        with pytest.raises(
            CheckpointError, match=r"failed: no checkpoint in .*the run has saved none"
        ):
            call()  # was: no best.pt in RUN_DIR


def test_the_client_still_imports_without_torch(run: Path) -> None:
    run_without_torch(f"from hpcdl import Job\nJob.from_run_dir({str(run)!r}).result()", run)


def test_a_device_this_process_cannot_use_is_one_line_naming_it(run: Path) -> None:
    import torch

    from hpcdl import Job
    from hpcdl.errors import ConfigError

    job = Job.from_run_dir(run)
    beyond = f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}"
    # was: AssertionError "Torch not compiled with CUDA enabled" (or an index error)
    with pytest.raises(ConfigError, match=rf"^device='{beyond}': this process sees \d+ CUDA"):
        job.load_model(device=beyond)
    with pytest.raises(ConfigError, match=r"^device='gpu0': not a torch device; give 'cpu'"):
        job.load_model(device="gpu0")
