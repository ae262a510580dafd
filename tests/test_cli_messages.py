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
            "task=regresion: unknown option; choose one of classification, custom, regression",
        ),
        (["trainer.max_epochs=2", "optim=adamm"], f"optim=adamm: unknown option; {OPTIMS}"),
    ],
)
def test_a_bad_group_choice_on_the_command_line_names_the_override(
    overrides: list[str], expected: str
) -> None:
    """Not conf/config.yaml, whose defaults list Hydra names as the place of the choice."""
    with pytest.raises(ConfigError) as info:
        compose_config(overrides)
    assert str(info.value) == expected


def test_a_bad_group_choice_in_a_sweep_or_resume_names_the_override() -> None:
    with pytest.raises(ConfigError) as info:
        plan_sweep(["optim=sgd,sgdd"])
    assert str(info.value) == f"trial 1 (optim=sgdd): optim=sgdd: unknown option; {OPTIMS}"
    with pytest.raises(ConfigError) as info:
        apply_overrides(compose_config([]), ["optim=adamm"])
    assert str(info.value) == f"optim=adamm: unknown option; {OPTIMS}"


def test_a_bad_group_choice_as_the_user_meets_it(hpcdl, tmp_path: Path) -> None:
    out = hpcdl("train", "model=transformer")
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == f"error: model=transformer: unknown option; {MODELS}"
    assert list(tmp_path.iterdir()) == []
