"""Every file under conf/ composes into the typed config; bad keys fail naming the key."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

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
        for path in sorted(group_dir.glob("*.yaml")):
            out.append((group_dir.name, path.stem))
    return out


@pytest.mark.parametrize(("group", "option"), all_options())
def test_every_conf_file_composes(group: str, option: str, tmp_path: Path) -> None:
    if group == "experiment":
        check_experiment(option, tmp_path)
        return
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


def check_experiment(option: str, tmp_path: Path) -> None:
    """An experiment (`# @package _global_`) composes, picks the options its defaults
    override, and every value it sets reaches the typed config."""
    text = yaml.safe_load((CONF / "experiment" / f"{option}.yaml").read_text())
    choices = {}
    for entry in text.pop("defaults", []):
        ((key, value),) = entry.items()
        assert key.startswith("override /"), f"experiment/{option}.yaml: {entry}"
        choices[key.removeprefix("override /")] = value
    overrides = [f"experiment={option}"]
    if choices.get("data") in NEEDS_PATH:
        overrides.append(f"data.path={tmp_path}")
    plain = to_plain(compose_config(overrides))
    for group, name in choices.items():
        assert plain[group]["name"] == name, f"experiment={option}: {group}"
    assert set(text) <= set(plain), f"experiment={option} sets unknown top-level keys"
    assert_subset(text, plain, f"experiment={option}")


def assert_subset(expected: dict, actual: dict, where: str) -> None:
    for key, value in expected.items():
        if isinstance(value, dict):
            assert_subset(value, actual[key], f"{where} {key}.")
        else:
            assert actual[key] == value, f"{where} {key}: {actual[key]!r} != {value!r}"


def test_every_yaml_starts_with_a_command_comment() -> None:
    for path in CONF.rglob("*.yaml"):
        lines = path.read_text().splitlines()
        # Hydra reads a `# @package` directive only from the first lines (experiments).
        first = lines[1] if lines[0].startswith("# @package ") else lines[0]
        assert first.startswith("# hpcdl "), f"{path} must start with the command that uses it"


def test_experiment_is_a_group_choice_with_overrides_on_top() -> None:
    cfg = compose_config(["experiment=cancer_mlp", "optim.lr=0.02"])
    assert cfg.optim.lr == 0.02 and cfg.optim.nesterov and cfg.data.split_seed == 7
    assert compose_config(["experiment=cancer_mlp", "data.split_seed=3"]).data.split_seed == 3
    # The command line's group choice wins over the experiment's; what it set for its own
    # choice is named in one line, with the way to drop it.
    with pytest.raises(ConfigError) as info:
        compose_config(["experiment=cancer_mlp", "optim=adam"])
    assert str(info.value) == (
        "optim.momentum, optim.nesterov: not keys of optim=adam; experiment=cancer_mlp sets "
        "them for its own optim choice: drop them with '~optim.momentum' '~optim.nesterov'"
    )
    cfg = compose_config(
        ["experiment=cancer_mlp", "optim=adam", "~optim.momentum", "~optim.nesterov"]
    )
    assert isinstance(cfg.optim, schema.AdamConfig) and cfg.optim.lr == 0.01
    # A typo of the user's own stays the usual message.
    with pytest.raises(ConfigError, match=r"^trainer\.max_epoch: unknown key; did you mean"):
        compose_config(["experiment=cancer_mlp", "trainer.max_epoch=3"])


def test_experiment_in_sweeps_and_resume(tmp_path: Path) -> None:
    from hpcdl.cli.expand import plan_sweep

    plan = plan_sweep(["experiment=cancer_mlp", "optim.lr=0.01,0.02"])
    assert [t.config for t in plan.trials] == [
        compose_config(["experiment=cancer_mlp", f"optim.lr={lr}"]) for lr in (0.01, 0.02)
    ]
    plan = plan_sweep(["experiment=glob(cancer*)", "trainer.seed=1,2"])
    assert [t.overrides for t in plan.trials][-1] == ["experiment=cancer_mlp", "trainer.seed=2"]
    assert plan.trials[-1].config == compose_config(["experiment=cancer_mlp", "trainer.seed=2"])
    base = compose_config(["experiment=cancer_mlp"])
    with pytest.raises(ConfigError, match=r"^experiment=mnist_cnn: the run's config.yaml already"):
        apply_overrides(base, ["experiment=mnist_cnn"])


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


def test_ranks_may_outnumber_gpus_only_on_the_cpu() -> None:
    """Two ranks on one GPU: NCCL refuses them (refused above); on the CPU, and for a
    script's own launch, the GPUs are not hpcdl's to hand out."""
    cfg = compose_config(["cluster=local", "cluster.gpus_per_node=1", "trainer.device=cpu"])
    assert cfg.world_size == 2
    cfg = compose_config(["cluster=rivanna_a100", "cluster.gpus_per_node=4"])
    assert cfg.world_size == 4


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["trainer.max_epoch=3"],
            "trainer.max_epoch: unknown key; did you mean trainer.max_epochs?",
        ),
        (["model=foo"], "model=foo: unknown option; choose one of cnn, custom, mlp, resnet18"),
        # A key of another group, or by another library's name: the key it is (it said
        # "did you mean trainer.seed?" for trainer.lr), and an option in other letter case.
        (["trainer.lr=0.1"], "trainer.lr: unknown key; did you mean optim.lr?"),
        (["optim.learning_rate=0.1"], "optim.learning_rate: unknown key; did you mean optim.lr?"),
        (["max_epochs=5"], "max_epochs: unknown key; did you mean trainer.max_epochs?"),
        (["trainer.epochs=5"], "trainer.epochs: unknown key; did you mean trainer.max_epochs?"),
        (["model=CNN"], "model=CNN: unknown option; did you mean model=cnn? (or choose one of"),
        (
            ["data=imagefolder", "data.path=x", "data.flip=true"],
            "data.flip: unknown key; did you mean data.random_flip?",  # was data.fold
        ),
        (
            ["data=custom", "data.target=m:b", "data.collate=m:c"],
            "data.collate: unknown key; did you mean data.collate_fn?",  # was data.kwargs.collate
        ),
        (
            ["trainer.max_epochs", "5"],
            "trainer.max_epochs: no value; write trainer.max_epochs=VALUE",
        ),
        (["dry-run"], "dry-run: not an override (key=value); for the option, write --dry-run"),
        (["optim.lr=0.1", "0.03"], "0.03: not an override (key=value); a list of values is one word"),
        (
            # data=files forgotten: the key is another option's, not a typo of data.name
            ["task=regression", "data.path=d.csv", "data.label_column=price"],
            "data.path: not a key of data=breast_cancer; it is one of data=mnist, cifar10, "
            "files, imagefolder: choose one first (e.g. data=mnist data.path=...)",
        ),
        (["trainer.max_epochs=abc"], "trainer.max_epochs=abc: must be a whole number"),
        (["cluster.mem_gb=0.5"], "cluster.mem_gb=0.5: must be a whole number"),
        (["trainer.accumulate_grad_batches=4"],  # Lightning's name for it
         "trainer.accumulate_grad_batches: unknown key; did you mean trainer.micro_batches?"),
        (["cluster.env.WANDB_SILENT=true"],  # was exported as True
         "cluster.env.WANDB_SILENT: YAML read a boolean (true), which the job would export "
         "as 'True'; quote the text you mean: \"cluster.env.WANDB_SILENT='true'\" on the "
         'command line, WANDB_SILENT: "true" in a YAML file'),
        (["cluster.env.RATIO=1e3"], "cluster.env.RATIO: YAML read a number (1000.0)"),
        (["cluster.setup=[module load cuda, false]"],
         "cluster.setup: YAML read a line as a boolean (false), which the job script would "
         "run as 'False'; quote it"),
        (["cluster.timeout_min=1:30:00"],  # sbatch's form: named in minutes
         "cluster.timeout_min=1:30:00: must be a whole number of minutes, e.g. 90 for 1:30:00"),
        (["cluster.timeout_min=1-12"],
         "cluster.timeout_min=1-12: must be a whole number of minutes, e.g. 2160 for 1-12"),
        (["cluster.timeout_min=2h"],
         "cluster.timeout_min=2h: must be a whole number of minutes, e.g. 90 for 1:30:00"),
        (["optim.lr=x"], "optim.lr=x: must be a number"),
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
        (
            ["cluster=rivanna_a100", "cluster.gpus_per_node=2", "cluster.tasks_per_node=4"],
            "cluster.tasks_per_node=4: more ranks than cluster.gpus_per_node=2",
        ),
        (
            ["cluster=local", "cluster.gpus_per_node=1"],
            "each rank needs a GPU of its own; set cluster.tasks_per_node=1",
        ),
        (
            ["cluster=local", "cluster.tasks_per_node=2", "trainer.batch_size=1"],
            "trainer.batch_size=1: smaller than the 2 ranks",
        ),
        (["data.fold=3", "data.num_folds=3"], "data.fold=3: must be in [0, data.num_folds=3)"),
        (["data.fold=1"], "data.fold=1: a k-fold split needs data.num_folds; set it too"),
        # sbatch's names, as an HPC user types them first: the key that sets them
        (
            ["cluster.time=30"],
            "cluster.time: unknown key; sbatch's --time is set by cluster.timeout_min",
        ),
        (["cluster.mem=16"], "cluster.mem: unknown key; sbatch's --mem is set by cluster.mem_gb"),
        (["trainer.early_stopping.monitor=acc"], "trainer.early_stopping.monitor='acc'"),
        (
            ["trainer.early_stopping.monitor=val_Acuracy"],
            "trainer.early_stopping.monitor='val_Acuracy': did you mean val_accuracy? "
            "task=classification reports val_loss, val_accuracy",
        ),
        (
            ["data=digits", "model.hidden_sizes=abc"],
            "model.hidden_sizes='abc' is not a list; give one in brackets, "
            "e.g. model.hidden_sizes=[30,60]",
        ),
        # Were "Error merging override cluster.env=[a,b]" and "cluster.env: Cannot assign
        # int to Dict[str, str]", neither saying what to write.
        (
            ["cluster=devcluster", "cluster.env=[a,b]"],
            "cluster.env=[a,b]: must be a mapping; give one in braces, "
            "e.g. cluster.env={NAME:value}",
        ),
        (
            ["cluster=devcluster", "cluster.env=5"],
            "cluster.env=5: must be a mapping; give one in braces, e.g. cluster.env={NAME:value}",
        ),
        (
            ["cluster=devcluster", "cluster.setup={a:1}"],
            "cluster.setup={a:1}: must be a list; give one in brackets, e.g. cluster.setup=[...]",
        ),
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


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        # Was "cluster: Cannot merge DictConfig with ListConfig": no key, no fix.
        ("cluster.env=[a,b]", "cluster.env=[a,b]: must be a mapping; give one in braces"),
        ("cluster.setup={a:1}", "cluster.setup={a:1}: must be a list; give one in brackets"),
    ],
)
def test_resume_override_of_the_wrong_shape_names_key_and_shape(
    override: str, expected: str
) -> None:
    base = compose_config(["cluster=devcluster"])
    with pytest.raises(ConfigError) as info:
        apply_overrides(base, [override])
    assert str(info.value).startswith(expected)


# ------------------------------------------------- fast paths equal OmegaConf's own way
def _custom_raw(kwargs: dict) -> dict:
    raw = to_plain(compose_config([]))
    raw["model"] = {"name": "custom", "target": "mypkg.mod:fn", "kwargs": kwargs}
    return raw


def test_typed_groups_are_cached_but_never_shared() -> None:
    raw = to_plain(compose_config(["cluster=rivanna_a100", "model=cnn", "data=digits"]))
    first = from_dict(raw)
    first.model.channels.append(128)
    first.trainer.step_hooks.append("mypkg.hooks:log")
    first.trainer.early_stopping.patience = 99
    first.cluster.env["MY_FLAG"] = "1"
    first.optim.lr = 5.0
    second = from_dict(raw)
    assert to_plain(second) == raw
    assert second.model.channels == [32, 64] and "MY_FLAG" not in second.cluster.env


def test_typed_cache_tells_apart_what_omegaconf_does() -> None:
    # 1, 1.0, True and "1" compare (and hash) alike in Python; key order is kept in YAML.
    values = [1, 1.0, True, "1", 0.0, -0.0, None, "null", [1], {"b": 1, "a": 2}, {"a": 2, "b": 1}]
    for value in values:
        kwargs = from_dict(_custom_raw({"x": value})).model.kwargs
        assert repr(kwargs) == repr({"x": value})
    assert list(from_dict(_custom_raw({"b": 1, "a": 2})).model.kwargs) == ["b", "a"]
    assert list(from_dict(_custom_raw({"a": 2, "b": 1})).model.kwargs) == ["a", "b"]


def test_sweep_trials_do_not_share_config_objects() -> None:
    from hpcdl.cli.expand import plan_sweep

    plan = plan_sweep(["optim.lr=0.1,0.01", "cluster.env.A=1"])
    plan.trials[0].config.cluster.env["B"] = "2"
    plan.trials[0].config.model.hidden_sizes[0] = 7
    assert plan.trials[1].config.cluster.env == {"A": "1"}
    assert plan.trials[1].config.model.hidden_sizes == [30, 60]
    again = plan_sweep(["optim.lr=0.1,0.01", "cluster.env.A=1"])
    assert again.trials[0].config.cluster.env == {"A": "1"}


# Strings YAML (or OmegaConf) would read as something else, or must quote or escape.
# fmt: off
TRICKY_STRINGS = [
    "1", "1.0", "1e-4", "-1", "+1", "0x10", "0o17", "1_000", "1:30", ".inf", "-.inf", ".nan",
    "true", "False", "yes", "no", "on", "OFF", "y", "n", "null", "Null", "~", "", " ",
    " lead", "trail ", "a: b", "a #b", "#c", "- x", "-", "---", "...", "[1, 2]", "{a: 1}",
    "'q'", '"dq"', "it's", "&anchor", "*alias", "!tag", "%d", "@x", "`x`", "|", ">",
    "?", "2024-01-01", "2024-01-01 10:00:00", "a\nb", "a\n", "tab\there", "bell\x07",
    "é ü 中 😀", "\u2028", "\ufeff", "\xa0", "gpu:a100:4", "module load cuda/12.1",
    "x" * 100, "word " * 30, "/a/very/long/" + "path/" * 30, "$HOME",
]
TRICKY_VALUES = [
    None, True, False, 0, -3, 10**20, 1e-4, 0.1, 1.0, -0.0, 1.5e300, float("inf"),
    float("nan"), [], {}, [1, [2, [3]]], {"a": {"b": [1, {"c": None}]}, "d": []},
]
# fmt: on


def _tricky_configs() -> list[schema.Config]:
    cfgs = [
        compose_config([]),
        compose_config(["cluster=rivanna_a100", "model=cnn", "data=digits", "optim=adamw"]),
        compose_config(["cluster=local", "optim=rmsprop", "trainer.precision=bf16"]),
    ]
    env = {f"K{i}": s for i, s in enumerate(TRICKY_STRINGS)}
    values = [*TRICKY_VALUES, *TRICKY_STRINGS]
    kwargs = {s: values[i % len(values)] for i, s in enumerate(TRICKY_STRINGS)}
    base = cfgs[1]
    cfgs.append(
        from_dict(
            {
                **to_plain(base),
                "model": {"name": "custom", "target": "mypkg.mod:fn", "kwargs": kwargs},
                "cluster": {**to_plain(base)["cluster"], "env": env, "setup": TRICKY_STRINGS},
                "run_dir": "/tmp/sweeps/2026-11-23/13-00-00/17",
                "init_from": "1e-4",
            }
        )
    )
    return cfgs


def test_to_yaml_is_byte_for_byte_omegaconfs() -> None:
    from omegaconf import OmegaConf

    from hpcdl.config import convert

    for cfg in _tricky_configs():
        plain = to_plain(cfg)
        assert convert._is_yaml_data(plain)  # the fast path is what is compared
        expected = OmegaConf.to_yaml(OmegaConf.create(plain))
        assert convert.to_yaml(cfg) == convert.to_yaml(cfg) == expected  # made, then kept
    # A missing value (???) as OmegaConf writes it; an interpolation goes OmegaConf's way.
    unset = replace(compose_config([]), model=schema.CustomModelConfig())
    assert convert.to_yaml(unset) == OmegaConf.to_yaml(OmegaConf.create(to_plain(unset)))
    for text in ("${oc.env:HOME}", "\\${x}"):
        cfg = replace(compose_config([]), init_from=text)
        assert not convert._is_yaml_data(to_plain(cfg))
        assert convert.to_yaml(cfg) == OmegaConf.to_yaml(OmegaConf.create(to_plain(cfg)))


def _omegaconf_raw(path: Path) -> object:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


def test_load_config_reads_what_omegaconf_reads(tmp_path: Path) -> None:
    from hpcdl.config import convert

    for i, cfg in enumerate(_tricky_configs()):
        path = tmp_path / f"config{i}.yaml"
        save_config(cfg, path)
        fast = convert.read_plain_yaml(path)
        assert fast is not None  # the fast path is what is compared
        assert repr(fast) == repr(_omegaconf_raw(path))  # repr: 1, 1.0 and True differ
        assert to_plain(load_config(path)) == to_plain(from_dict(_omegaconf_raw(path)))
        assert repr(to_plain(load_config(path))) == repr(to_plain(cfg))


# Hand-edited YAML: OmegaConf's scalar rules (its float pattern, no timestamps), anchors.
PLAIN_DOCS = [
    "a: 1e-4\nb: 1.5e3\nc: 1_000\nd: 0x10\ne: 0o17\nf: 1:30\ng: .inf\nh: .nan\ni: +1\nj: 1.\n",
    "a: yes\nb: no\nc: on\nd: off\ne: True\nf: ~\ng: null\nh: ''\ni: '1'\nj: \"true\"\n",
    "when: 2024-01-01\nstamp: 2024-01-01 10:00:00\noctal: 0777\nnot_octal: 09\n",
    "base: &b {x: 1, y: [1, 2]}\nother: *b\nmerged:\n  <<: *b\n  y: 3\n",
    'text: |\n  line one\n  line two\nfolded: >-\n  a\n\n  b\nuni: "\\u00e9 \\U0001F600"\n',
    "'1': a\n'true': b\n\"a b\": {c: [], d: {}}\n",
]
# What the fast path leaves to OmegaConf (which then reads it or says what is wrong).
FALLBACK_DOCS = [
    "a: 1\na: 2\n",  # a key twice: OmegaConf refuses it
    "a: ${b}\nb: 1\n",  # an interpolation: OmegaConf resolves it
    "model:\n  1: a\n",  # a key that is not a string
    "- a\n- b\n",  # not a mapping
    "",
    "just text\n",
    "a: [1\n",  # invalid
    "a:\t1\n",  # a tab: libyaml takes it, PyYAML does not
    "a: !!binary aGk=\n",
    "a: !!set {x}\n",
]


@pytest.mark.parametrize("text", PLAIN_DOCS)
def test_yaml_read_without_omegaconf_equals_omegaconf(text: str, tmp_path: Path) -> None:
    from hpcdl.config import convert

    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    fast = convert.read_plain_yaml(path)
    assert fast is not None
    assert repr(fast) == repr(_omegaconf_raw(path))


@pytest.mark.parametrize("text", FALLBACK_DOCS)
def test_yaml_the_fast_path_cannot_take_is_left_to_omegaconf(text: str, tmp_path: Path) -> None:
    from hpcdl.config import convert

    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    assert convert.read_plain_yaml(path) is None
    with pytest.raises(ConfigError):  # none of them is a config
        load_config(path)


def test_load_config_errors_are_omegaconfs(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {name: mlp\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml, line 2, column 1: invalid YAML"):
        load_config(bad)
    twice = tmp_path / "twice.yaml"
    twice.write_text("model: {name: mlp}\nmodel: {name: cnn}\n")
    with pytest.raises(ConfigError, match="duplicate key model"):
        load_config(twice)
    with pytest.raises(ConfigError, match="cannot read the run's config"):
        load_config(tmp_path / "missing.yaml")


def write_conf(root: Path, path: str, text: str) -> None:
    """A YAML file of a user's own under root (a --config-dir), with its command comment."""
    file = root / path
    file.parent.mkdir(parents=True, exist_ok=True)
    lines = text.splitlines(keepends=True)
    header = lines[:1] if text.startswith("# @package") else []  # Hydra reads it first only
    command = f"# hpcdl train --config-dir {root.name} ...\n"
    file.write_text("".join([*header, command, *lines[len(header) :]]))


@pytest.mark.parametrize(
    ("path", "text", "overrides", "expected"),
    [
        (
            "cluster/mycluster.yaml",
            "name: mycluster\nlauncher: local\ngpus_per_nod: 4\n",
            ["cluster=mycluster"],
            "myconf/cluster/mycluster.yaml: cluster.gpus_per_nod: unknown key; "
            "did you mean cluster.gpus_per_node?",
        ),
        (
            "cluster/mycluster.yaml",
            "name: mycluster\nlauncher: local\nmem_gb: lots\n",
            ["cluster=mycluster"],
            "myconf/cluster/mycluster.yaml: cluster.mem_gb=lots: must be a whole number",
        ),
        (  # an experiment without its header: its keys landed under `experiment`
            "experiment/nohdr.yaml",
            "trainer:\n  max_epochs: 3\n",
            ["experiment=nohdr"],
            "myconf/experiment/nohdr.yaml: experiment: unknown key; experiment is a group "
            "(experiment=NAME), whose files set keys of the whole config: make `# @package "
            "_global_` an experiment file's first line",
        ),
        (  # YAML 1.1's yes: a boolean, exported as True before
            "cluster/mycluster.yaml",
            "name: mycluster\nlauncher: slurm\nenv:\n  FOO: yes\n",
            ["cluster=mycluster"],
            "myconf/cluster/mycluster.yaml: cluster.env.FOO: YAML read a boolean (true)",
        ),
        (  # YAML 1.1's octal: exported as UMASK=18 before
            "cluster/mycluster.yaml",
            "name: mycluster\nlauncher: slurm\nenv:\n  THREADS: 8\n  UMASK: 0022\n",
            ["cluster=mycluster"],
            "myconf/cluster/mycluster.yaml: cluster.env.UMASK: YAML read 0022 as the number 18, "
            'which the job would export as UMASK=18; quote the text you mean: UMASK: "0022"',
        ),
        (  # and its sexagesimal numbers
            "cluster/mycluster.yaml",
            "name: mycluster\nlauncher: slurm\nenv:\n  WALL: 1:30\n",
            ["cluster=mycluster"],
            "myconf/cluster/mycluster.yaml: cluster.env.WALL: YAML read 1:30 as the number 90",
        ),
        (
            "optim/fast.yaml",
            "name: sgd\nlr: 0.1\nmomentun: 0.9\n",
            ["optim=fast"],
            "myconf/optim/fast.yaml: optim.momentun: unknown key; did you mean optim.momentum?",
        ),
        (
            "optim/fast.yaml",
            "name: sgd_fast\nlr: 0.1\n",
            ["optim=fast"],
            "myconf/optim/fast.yaml: optim.name='sgd_fast': unknown option; choose one of",
        ),
        (
            "model/wide.yaml",
            "name: mlp\nhidden_sizes: [a, 8]\n",
            ["model=wide"],
            "myconf/model/wide.yaml: model.hidden_sizes[0]=a: must be a whole number",
        ),
        (  # a value validate() refuses
            "trainer/quick.yaml",
            "max_epochs: -1\n",
            ["trainer=quick"],
            "myconf/trainer/quick.yaml: trainer.max_epochs=-1: must be > 0",
        ),
        (
            "task/reg.yaml",
            "name: regression\nlos: l1\n",
            ["task=reg"],
            "myconf/task/reg.yaml: task.los: unknown key; did you mean task.loss?",
        ),
        (
            "data/mine.yaml",
            "name: synthetic\nnum_classes: many\n",
            ["data=mine"],
            "myconf/data/mine.yaml: data.num_classes=many: must be a whole number",
        ),
        (
            "schedule/mine.yaml",
            "name: cosine\nmin_lr_ration: 0.1\n",
            ["schedule=mine"],
            "myconf/schedule/mine.yaml: schedule.min_lr_ration: unknown key",
        ),
        (
            "logger/mine.yaml",
            "wandb:\n  enabled: maybe\n",
            ["logger=mine"],
            "myconf/logger/mine.yaml: logger.wandb.enabled: Value 'maybe' is not a valid bool",
        ),
        (  # an experiment file sets keys of other groups: it is named, not trainer's file
            "experiment/mine.yaml",
            "# @package _global_\ntrainer:\n  max_epoch: 3\n",
            ["experiment=mine"],
            "myconf/experiment/mine.yaml: trainer.max_epoch: unknown key; did you mean",
        ),
        (  # a profile that extends a bundled one through its own defaults list
            "cluster/mine.yaml",
            "defaults:\n  - slurm\n  - _self_\nname: mine\nqos: [a]\n",
            ["cluster=mine"],
            "myconf/cluster/mine.yaml: cluster.qos",
        ),
    ],
)
def test_a_bad_key_in_a_yaml_file_names_the_file(
    path: str,
    text: str,
    overrides: list[str],
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hpcdl.cli.expand import plan_sweep

    write_conf(tmp_path / "myconf", path, text)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        compose_config(overrides, ["myconf"])
    assert str(info.value).startswith(expected), str(info.value)
    # A sweep names the file too; no trial: every trial shares it.
    with pytest.raises(ConfigError) as info:
        plan_sweep([*overrides, "trainer.seed=1,2"], ["myconf"])
    assert str(info.value).startswith(expected), str(info.value)


def test_a_key_set_on_the_command_line_is_named_as_the_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_conf(tmp_path / "myconf", "cluster/mine.yaml", "name: mine\nlauncher: local\nmem_gb: 4\n")
    monkeypatch.chdir(tmp_path)
    for overrides, expected in [
        (["cluster.mem_gb=lots"], "cluster.mem_gb=lots: must be a whole number"),
        (["cluster.timeout_min=0"], "cluster.timeout_min=0: must be > 0"),
        # sbatch takes --array=0-3%-1 and ignores the limit: every trial at once
        (["cluster.array_parallelism=-1"], "cluster.array_parallelism=-1: must be >= 0"),
        (["++cluster.mem_gb=lots"], "cluster.mem_gb=lots: must be a whole number"),
    ]:
        with pytest.raises(ConfigError) as info:
            compose_config(["cluster=mine", *overrides], ["myconf"])
        assert str(info.value).startswith(expected), str(info.value)
    # A key the bundled YAML leaves required is the command line's to set, not the file's.
    with pytest.raises(ConfigError, match=r"^data\.path: required value is missing"):
        compose_config(["data=mnist"], ["myconf"])
    # The file's bad value, overridden, is no error.
    write_conf(tmp_path / "myconf", "cluster/bad.yaml", "name: bad\nlauncher: local\nmem_gb: x\n")
    assert compose_config(["cluster=bad", "cluster.mem_gb=8"], ["myconf"]).cluster.mem_gb == 8


@pytest.mark.parametrize(
    ("path", "text", "expected"),
    [
        # Empty, a cluster profile would run in-process (launcher: debug) instead of on Slurm.
        ("cluster/mine.yaml", "", "myconf/cluster/mine.yaml: cluster: sets no keys; write at"),
        ("model/mine.yaml", "", "myconf/model/mine.yaml: model: sets no keys; write at least"),
        ("cluster/mine.yaml", "- a\n- b\n", "myconf/cluster/mine.yaml: cluster: holds a list"),
        ("optim/mine.yaml", "- sgd\n", "myconf/optim/mine.yaml: optim: holds a list, not a"),
    ],
)
def test_a_yaml_file_that_is_no_mapping_of_keys_is_refused_by_name(
    path: str, text: str, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_conf(tmp_path / "myconf", path, text)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        compose_config([f"{Path(path).parent}=mine"], ["myconf"])
    assert str(info.value).startswith(expected), str(info.value)


def test_an_empty_trainer_file_takes_the_defaults(tmp_path: Path) -> None:
    write_conf(tmp_path / "myconf", "trainer/mine.yaml", "")
    assert compose_config(["trainer=mine"], [str(tmp_path / "myconf")]).trainer.max_epochs == 30


def test_resume_with_a_group_option_names_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_conf(tmp_path / "myconf", "cluster/bad.yaml", "name: bad\nlauncher: local\nmem_gb: x\n")
    monkeypatch.chdir(tmp_path)
    base = compose_config([])
    file_first = r"^myconf/cluster/bad\.yaml: cluster\.mem_gb=x: must be a whole number"
    with pytest.raises(ConfigError, match=file_first):
        apply_overrides(base, ["cluster=bad"], ["myconf"])
    # The option's YAML replaces the whole group, a key set before it too.
    with pytest.raises(ConfigError, match=file_first):
        apply_overrides(base, ["cluster.mem_gb=4", "cluster=bad"], ["myconf"])
    # A key set after the option is the override's.
    assert (
        apply_overrides(base, ["cluster=bad", "cluster.mem_gb=4"], ["myconf"]).cluster.mem_gb == 4
    )
    with pytest.raises(ConfigError, match=r"^cluster\.mem_gb=y: must be a whole number"):
        apply_overrides(base, ["cluster=bad", "cluster.mem_gb=y"], ["myconf"])


def test_a_bad_defaults_list_entry_names_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcdl.cli.expand import plan_sweep

    write_conf(tmp_path / "myconf", "cluster/mine.yaml", "defaults:\n  - slurmm\n  - _self_\n")
    monkeypatch.chdir(tmp_path)
    expected = (
        "myconf/cluster/mine.yaml: its defaults list: cluster=slurmm: unknown option; "
        "choose one of cpu_partition, debug, devcluster, local, mine, rivanna_a100, slurm; "
        "fix the entry there"
    )
    with pytest.raises(ConfigError) as info:
        compose_config(["cluster=mine"], ["myconf"])
    assert str(info.value) == expected
    with pytest.raises(ConfigError) as info:
        plan_sweep(["cluster=debug,mine"], ["myconf"])
    assert str(info.value) == f"trial 1 (cluster=mine): {expected}"


def test_a_monitor_without_a_split_is_shown_an_example_of_the_tasks_own_metrics() -> None:
    """task=regression was offered val_accuracy, which it does not have."""
    from types import SimpleNamespace

    from hpcdl.config.validate import _check_monitor

    for task, example in [("regression", "val_mae"), ("classification", "val_accuracy")]:
        with pytest.raises(ConfigError, match=f"e.g. val_loss, {example} or train_loss$"):
            _check_monitor("r2", SimpleNamespace(name=task))


def test_a_kwargs_entry_given_twice_takes_the_last_value_as_other_keys_do() -> None:
    # Before: Hydra's "Could not append to config. An item is already at 'data.kwargs.root'".
    from hpcdl.cli.compose import compose_config

    common = ["data=custom", "data.target=mylab.data:build", "data.kwargs.root=/a"]
    cfg = compose_config([*common, "data.kwargs.seed=1", "data.kwargs.root=/b"])
    assert cfg.data.kwargs == {"root": "/b", "seed": 1}  # type: ignore[union-attr]
    cfg = compose_config(["optim.lr=0.1", "optim.lr=0.2"])
    assert cfg.optim.lr == 0.2


@pytest.mark.parametrize(
    ("override", "says"),
    [
        # Before: "did you mean model.width?", which model=custom then refused too.
        ("model.kwarg.width=8", "model.kwarg.width: not a key of model=custom; arguments for "
         "your code go in model.kwargs: model.kwargs.width=..."),
        ("model.widht=8", "model.widht: not a key of model=custom; arguments for your code go "
         "in model.kwargs: model.kwargs.widht=..."),
    ],
)  # fmt: skip
def test_an_unknown_key_of_a_custom_option_points_at_its_kwargs(override: str, says: str) -> None:
    from hpcdl.cli.compose import compose_config

    with pytest.raises(ConfigError) as info:
        compose_config(["model=custom", "model.target=mylab.models:Net", override])
    assert str(info.value) == says


def test_a_sites_profiles_are_found_through_hpcdl_config_path(tmp_path, monkeypatch) -> None:
    """A module file's `setenv HPCDL_CONFIG_PATH /apps/hpcdl/conf`: every user gets the
    site's cluster profiles. HPCDL_CONF_DIR replaced the bundled conf/ whole and failed with
    Hydra's `Cannot find primary config 'config'`."""
    site = tmp_path / "apps" / "hpcdl"
    (site / "cluster").mkdir(parents=True)
    (site / "cluster" / "uni.yaml").write_text(
        "# hpcdl train cluster=uni\ndefaults:\n  - slurm\n  - _self_\nname: uni\npartition: gpu\n"
    )
    monkeypatch.setenv("HPCDL_CONFIG_PATH", f"{tmp_path / 'empty'}:{site}")
    (tmp_path / "empty").mkdir()
    assert compose_config(["cluster=uni"]).cluster.partition == "gpu"
    monkeypatch.setenv("HPCDL_CONFIG_PATH", str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match=r"^HPCDL_CONFIG_PATH=.*/nope is no folder; it lists"):
        compose_config(["cluster=uni"])
    monkeypatch.delenv("HPCDL_CONFIG_PATH")
    monkeypatch.setenv("HPCDL_CONF_DIR", str(site))
    with pytest.raises(ConfigError, match=r"no config.yaml there; it replaces hpcdl's conf/ whole"):
        compose_config(["cluster=uni"])
