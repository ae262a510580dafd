"""Every file under conf/ composes into the typed config; bad keys fail naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.cli.compose import apply_overrides, compose_config, conf_dir
from hpcdl.config import schema
from hpcdl.config.convert import from_dict, load_config, save_config, to_plain
from hpcdl.errors import ConfigError

CONF = conf_dir()
# Options that need a path to data that tests make elsewhere; composing them needs the key.
NEEDS_PATH = {"mnist", "cifar10", "files", "imagefolder"}


def all_options() -> list[tuple[str, str]]:
    out = []
    for group_dir in sorted(p for p in CONF.iterdir() if p.is_dir()):
        for yaml in sorted(group_dir.glob("*.yaml")):
            out.append((group_dir.name, yaml.stem))
    return out


@pytest.mark.parametrize(("group", "option"), all_options())
def test_every_conf_file_composes(group: str, option: str, tmp_path: Path) -> None:
    overrides = [f"{group}={option}"]
    if option in NEEDS_PATH:
        overrides.append(f"data.path={tmp_path}")
    if option == "custom":
        overrides.append(f"{group}.target=mypkg.mod:fn")
    if group == "model" and option in ("cnn", "resnet18"):
        overrides.append("data=digits")
    if group == "task" and option == "regression":
        overrides += ["data=files", f"data.path={tmp_path}"]
    cfg = compose_config(overrides)
    section = getattr(cfg, group)
    if hasattr(section, "name") and group != "cluster":
        assert section.name == option


def test_every_yaml_starts_with_a_command_comment() -> None:
    for yaml in CONF.rglob("*.yaml"):
        first = yaml.read_text().splitlines()[0]
        assert first.startswith("# hpcdl "), f"{yaml} must start with the command that uses it"


def test_default_is_the_workshop_mlp_on_breast_cancer_in_process() -> None:
    cfg = compose_config([])
    assert isinstance(cfg.model, schema.MlpConfig)
    assert cfg.model.hidden_sizes == [30, 60] and cfg.model.dropout == 0.5
    assert isinstance(cfg.data, schema.BreastCancerConfig)
    assert cfg.cluster.launcher == schema.Launcher.debug
    assert cfg.world_size == 1


def test_local_cluster_ranks() -> None:
    cfg = compose_config(["cluster=local", "cluster.tasks_per_node=3"])
    assert cfg.world_size == 3


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["trainer.max_epoch=3"],
            "trainer.max_epoch: unknown key; did you mean trainer.max_epochs?",
        ),
        (["model=foo"], "model=foo: unknown option; choose one of cnn, custom, mlp, resnet18"),
        (["trainer.max_epochs=abc"], "trainer.max_epochs"),
        (["trainer.batch_size=-3"], "trainer.batch_size=-3: must be > 0"),
        (["data=mnist"], "data.path: required value is missing"),
        (
            ["data=files", "data.path=/no/such/file.npz"],
            "data.path='/no/such/file.npz': no such file",
        ),
        (["model.dropout=1.5"], "model.dropout=1.5: must be in [0, 1)"),
        (["optim.lr=0"], "optim.lr=0.0: must be > 0"),
        (
            ["optim.nesterov=true", "optim.momentum=0"],
            "optim.nesterov=true needs optim.momentum > 0",
        ),
        (["trainer.precision=fp8"], "trainer.precision"),
        (["cluster.tasks_per_node=2"], "cluster=debug runs one rank in-process"),
        (["data.fold=3", "data.num_folds=3"], "data.fold=3: must be in [0, data.num_folds=3)"),
        (["trainer.early_stopping.monitor=acc"], "trainer.early_stopping.monitor='acc'"),
    ],
)
def test_bad_config_is_one_line_naming_the_key(overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        compose_config(overrides)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


def test_schema_keys_missing_from_a_yaml_can_still_be_set() -> None:
    cfg = compose_config(["cluster.partition=gpu", "cluster.mem_gb=4"])  # not in debug.yaml
    assert cfg.cluster.partition == "gpu" and cfg.cluster.mem_gb == 4


def test_config_round_trips_through_yaml(tmp_path: Path) -> None:
    cfg = compose_config(["model=cnn", "data=digits", "optim=adamw", "trainer.precision=bf16"])
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg


def test_unknown_top_level_key_in_stored_config() -> None:
    raw = to_plain(compose_config([]))
    raw["trainer"]["max_epocs"] = 3
    with pytest.raises(
        ConfigError, match=r"trainer\.max_epocs: unknown key; did you mean trainer\.max_epochs"
    ):
        from_dict(raw)


def test_resume_overrides_change_values_and_groups() -> None:
    base = compose_config([])
    cfg = apply_overrides(base, ["trainer.max_epochs=50", "cluster=local", "optim.lr=0.5"])
    assert cfg.trainer.max_epochs == 50
    assert cfg.cluster.launcher == schema.Launcher.local
    assert cfg.optim.lr == 0.5
    assert cfg.model == base.model
    with pytest.raises(ConfigError, match=r"trainer\.max_epoc"):
        apply_overrides(base, ["trainer.max_epoc=5"])
