"""Hydra composition: the only module that calls Hydra.

conf/ (YAML) --compose--> DictConfig --convert--> typed Config. Hydra's errors are turned
into one-line ConfigErrors naming the key or option.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hpcdl.config import schema
from hpcdl.config.convert import (
    GROUPS,
    NAMED_GROUPS,
    PRESET_GROUPS,
    TOP_LEVEL_KEYS,
    from_dict,
    known_keys,
    shape_message,
    to_config,
    to_plain,
    unknown_key_message,
    yaml_message,
)
from hpcdl.config.paths import with_absolute_paths
from hpcdl.config.validate import validate
from hpcdl.errors import ConfigError

if TYPE_CHECKING:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Override


# The conf folder's primary config (conf/config.yaml: the defaults list), Hydra's config_name.
PRIMARY_CONFIG = "config"


def conf_dir() -> Path:
    """The bundled conf/ (next to the package in a source checkout), or $HPCDL_CONF_DIR,
    which replaces it whole (its config.yaml and every group)."""
    env = os.environ.get("HPCDL_CONF_DIR")
    if env:
        path = Path(env).resolve()
        if not (path / f"{PRIMARY_CONFIG}.yaml").is_file():
            raise ConfigError(
                f"HPCDL_CONF_DIR={env}: no {PRIMARY_CONFIG}.yaml there; it replaces hpcdl's "
                "conf/ whole. "
                f"To add profiles to it, list their folder in {SITE_PATH_VAR} (a site's) or "
                "give --config-dir DIR (yours)"
            )
        return path
    return Path(__file__).resolve().parents[2] / "conf"


# Folders a site adds to every user's search path (a module file's `setenv`), after the
# user's own: `HPCDL_CONFIG_PATH=/etc/hpcdl:/apps/hpcdl/conf`.
SITE_PATH_VAR = "HPCDL_CONFIG_PATH"


def user_conf_dirs(extra: Optional[list[str]] = None) -> list[Path]:
    """Extra search dirs: --config-dir flags, then ~/.config/hpcdl (a user's cluster YAML),
    then $HPCDL_CONFIG_PATH's folders (a site's)."""
    dirs = [Path(d).expanduser().resolve() for d in (extra or [])]
    for d in dirs:
        if not d.is_dir():
            raise ConfigError(
                f"--config-dir {d}: no such folder; give the folder that holds your "
                "<group>/<name>.yaml files (e.g. myconf for myconf/cluster/mine.yaml)"
            )
    home = Path(os.environ.get("XDG_CONFIG_HOME", "~/.config")).expanduser() / "hpcdl"
    if home.is_dir():
        dirs.append(home.resolve())
    for entry in os.environ.get(SITE_PATH_VAR, "").split(os.pathsep):
        if not entry:
            continue
        site = Path(entry).expanduser().resolve()
        if not site.is_dir():
            raise ConfigError(
                f"{SITE_PATH_VAR}={os.environ[SITE_PATH_VAR]}: {site} is no folder; it lists "
                "folders of <group>/<name>.yaml files (e.g. /etc/hpcdl for /etc/hpcdl/cluster/"
                "uni.yaml), separated by ':'"
            )
        if site not in dirs:
            dirs.append(site)
    return dirs


def compose(overrides: list[str], config_dirs: Optional[list[str]] = None) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra.errors import HydraException

    extra = _searchpath(config_dirs)

    def attempt(overrides: list[str]) -> DictConfig:
        with _hydra_on_conf_dir():
            try:
                return hydra_compose(PRIMARY_CONFIG, overrides=[*extra, *overrides])
            except HydraException as err:
                located = _in_file(err, overrides, config_dirs)
                if located is not None:
                    raise located from None
                raise  # its cause (OmegaConf's error) says what a failed merge was

    return _with_additions(overrides, attempt)


@contextlib.contextmanager
def _hydra_on_conf_dir() -> Iterator[None]:
    """Hydra initialized on conf/ for one composition, then its global state (an
    initialization, the version base) as the caller had it: a notebook that initialized
    Hydra for its own configs (hydra.initialize) can call hpcdl.submit, and keeps its own.
    Hydra refuses a second initialization, so the caller's is set aside meanwhile."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.singleton import Singleton
    from hydra.version import VersionBase

    theirs = Singleton._instances.pop(GlobalHydra, None)
    version_base = VersionBase.instance().getbase()
    try:
        with initialize_config_dir(str(conf_dir()), version_base=None, job_name="hpcdl"):
            yield
    finally:
        VersionBase.instance().version_base = version_base
        if theirs is not None:
            Singleton._instances[GlobalHydra] = theirs


def _in_file(
    err: Exception, overrides: list[str], config_dirs: Optional[list[str]]
) -> Optional[ConfigError]:
    """Hydra's error about a file's own content (`In 'cluster/mine': Could not load
    'cluster/nonexist'`, from its defaults list) as one line naming the file; None for others,
    and for a group choice the command line made (`model=transformer`: Hydra says `In
    'config'` for it too, but the override is what to fix)."""
    where = re.match(r"In '([^']+)': ", str(err))
    path = _config_file(where.group(1), config_dirs) if where else None
    if where is None or path is None or _yaml_cause(err) is not None:
        return None
    missing = re.search(r"Could not (?:find|load) '(.+)/([^/']+)'", str(err))
    if missing and _chosen_on_command_line(missing.group(1), missing.group(2), overrides):
        return None
    message = hydra_message(err).removeprefix(where.group(0))
    loaded = re.match(r"Could not load '([^/']+)/([^']+)'", message)
    if loaded:
        group, option = loaded.groups()
        dirs = [conf_dir(), *user_conf_dirs(config_dirs)]
        options = sorted({f.stem for d in dirs for f in (d / group).glob("*.yaml")})
        message = f"{group}={option}: unknown option; choose one of {', '.join(options)}"
    if loaded or "unknown option" in message:
        message = f"its defaults list: {message}; fix the entry there"
    return ConfigError(f"{shown_path(path)}: {message}")


def _chosen_on_command_line(group: str, option: str, overrides: list[str]) -> bool:
    """Whether an override picks `option` for `group` (model=transformer, +cluster=x)."""
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+~") == group and value == option:
            return True
    return False


def _searchpath(config_dirs: Optional[list[str]]) -> list[str]:
    """The override that adds the --config-dir folders (and ~/.config/hpcdl) to Hydra's."""
    searchpath = [f"file://{d}" for d in user_conf_dirs(config_dirs)]
    return [f"hydra.searchpath=[{','.join(searchpath)}]"] if searchpath else []


def _with_additions(overrides: list[str], attempt: Callable[[list[str]], DictConfig]) -> DictConfig:
    """`attempt(overrides)`, with Hydra's errors as one-line ConfigErrors. A schema key the
    chosen YAML leaves out (cluster.partition on cluster=debug) is still a valid key: it is
    added (+key=value) instead of overridden, and the attempt made again."""
    from hydra.errors import HydraException

    overrides = list(overrides)
    for _ in range(len(overrides) + 1):
        try:
            return attempt(overrides)
        except yaml.YAMLError as err:  # a YAML file with a syntax error
            raise ConfigError(yaml_message(err)) from None
        except (HydraException, OmegaConfBaseException, ValueError) as err:
            cause = _yaml_cause(err)
            if cause is not None:
                raise ConfigError(yaml_message(cause)) from None
            swept = _SWEEP_VALUE.search(str(err))
            if swept is not None:
                raise SweepValueError(swept.group(1) or swept.group(2)) from None
            retry = _as_addition(str(err), overrides)
            if retry is None:
                raise ConfigError(naming(hydra_message(err, overrides), overrides)) from None
            overrides = retry
    raise ConfigError("could not compose the config")  # unreachable: each retry fixes one key


# Hydra's refusal of a sweep value (a comma list, range(), glob()) outside --multirun.
_SWEEP_VALUE = re.compile(
    r"Ambiguous value for argument '([^']*)'|Sweep parameters '([^']*)' requires --multirun"
)
_GROUP_NAMES = (*GROUPS, *PRESET_GROUPS)


class SweepValueError(ConfigError):
    """An override with several values (optim.lr=0.1,0.01) where one run was asked for."""

    def __init__(self, override: str) -> None:
        self.override = override
        key, _, value = override.partition("=")
        advice = "add -m for one run per value"
        # A comma list of a plain key may have meant one string, or a list.
        if "," in value and "(" not in value and key.lstrip("+~") not in _GROUP_NAMES:
            advice += (
                f"; for one value, quote it: \"{key}='{value}'\" or write a list: {key}=[{value}]"
            )
        super().__init__(f"{override}: several values are a sweep: {advice}")

    def for_run(self) -> ConfigError:
        """`hpcdl run`: its -m sweeps the lists in the program's command, not hpcdl's keys."""
        key, _, value = self.override.partition("=")
        return ConfigError(
            f"{self.override}: hpcdl run takes one value per key (its -m sweeps only the "
            f"lists in the command after --, e.g. '--lr={{0.1,0.03}}'); quote it if one value "
            f"was meant: \"{key}='{value}'\""
        )


def naming(message: str, overrides: list[str]) -> str:
    """A syntax error from Hydra names no override: name the first one it cannot parse."""
    if not message.startswith("bad override syntax"):
        return message
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_override(override)
        except HydraException:
            if override.endswith(","):  # `optim.lr=0.1, 0.01`: the shell split it at the space
                return (
                    f"{override}: ends in a comma; a list of values is one word, commas "
                    f"without spaces ({override}0.01), or quote the whole override"
                )
            return f"{override}: {message}"
    return message


def _yaml_cause(err: BaseException) -> Optional[yaml.YAMLError]:
    """The YAML syntax error behind an error that Hydra wrapped, if any."""
    seen: set[int] = set()
    cause: Optional[BaseException] = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, yaml.YAMLError):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def _as_addition(message: str, overrides: list[str]) -> Optional[list[str]]:
    match = re.search(r"Could not override '([^']+)'", message)
    if not match:
        return None
    key = match.group(1)
    group = key.split(".", 1)[0]
    if group not in GROUPS:
        return None
    known = known_keys(group)
    # A known key, or an entry of a known mapping key (model.kwargs.depth, cluster.env.X).
    if key not in known and key.rsplit(".", 1)[0] not in known:
        return None
    # Given twice (a shell variable of defaults, then one more): the last wins, as for
    # any other key; two additions would be Hydra's "Could not append to config".
    same = [i for i, o in enumerate(overrides) if o.split("=", 1)[0] == key]
    return [
        f"+{o}" if i == same[-1] else o for i, o in enumerate(overrides) if i not in same[:-1]
    ]


def hydra_message(err: Exception, overrides: Sequence[str] = ()) -> str:
    """One line out of Hydra's multi-line errors (overrides: the command line's, for the
    options it chose)."""
    text = str(err)
    match = re.search(r"Could not override '([^']+)'", text)
    if match:
        key = match.group(1)
        group = key.split(".", 1)[0]
        chosen = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == group]
        return unknown_key_message(key, chosen[-1] if chosen else None)
    match = re.search(r"In '[^']*': Could not find '([^/']+)/([^']+)'", text) or re.search(
        r"Could not find '([^/']+)/([^']+)'", text
    )
    if match:
        group, option = match.groups()
        options = re.findall(r"^\s+(\S+)\s*$", text, flags=re.M)
        valid = f"; choose one of {', '.join(options)}" if options else ""
        same = [o for o in options if o.lower() == option.lower()]  # model=CNN
        close = same or difflib.get_close_matches(option, options, n=1, cutoff=0.6)
        if close:
            valid = f"; did you mean {group}={close[0]}?{valid.replace('; c', ' (or c', 1)})"
        elif group == "cluster":  # most often a site's own profile, in a folder not searched
            valid += (
                f"; a profile of your own: --config-dir DIR with DIR/cluster/{option}.yaml, or "
                f"~/.config/hpcdl/cluster/{option}.yaml"
            )
        return f"{group}={option}: unknown option{valid}"
    merging = re.match(r"Error merging override (([^=]+)=.*)", text)
    kind = re.search(r"object_type=(dict|list)", str(err.__cause__ or ""))
    if merging and kind:  # a list given for a mapping (cluster.env), or the other way round
        line, key = merging.groups()
        return shape_message(line, key, mapping=kind.group(1) == "dict")
    match = re.search(r"LexerNoViableAltException: (\S+?)=(\S+)", text) or re.match(
        r"Error parsing override '([^=']+)=(.*)'$", text.splitlines()[0] if text else ""
    )
    if match:  # a value with characters the override grammar keeps for itself (# : , ( ...)
        key, value = match.groups()
        # The whole value as typed: the lexer's stops at a space ("prix (€)" read as "prix").
        typed = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == key]
        value = typed[-1] if typed else value
        empty = re.fullmatch(r"(choice|range|glob)\(\s*\)", value)
        if empty:  # quoting it would make the value the text "choice()"
            sample = {"choice": "choice(0.1,0.01)", "range": "range(0,5)", "glob": "glob(*)"}
            return (
                f"{key}={value}: {empty.group(1)}() needs values to try, e.g. "
                f"{key}={sample[empty.group(1)]}"
            )
        return (
            f"{key}={value}: Hydra cannot read this value unquoted; quote it: "
            f"\"{key}='{value}'\" (the double quotes are for the shell)"
        )
    lone = re.match(r"LexerNoViableAltException: ([^=\s]+)$", text.splitlines()[0] if text else "")
    if lone:  # `optim.lr=0.1,0.01 0.03`: a value split off by a space
        word = lone.group(1)
        given = list(overrides)
        before = [o for o in given[: given.index(word)] if "=" in o] if word in given else []
        example = f"{before[-1]},{word}" if before else "optim.lr=0.1,0.01"
        return (
            f"{word}: not an override (key=value); a list of values is one word, commas "
            f"without spaces ({example}), or quote the whole override"
        )
    bare = re.match(r"Error parsing override '([\w.]+)'$", text.splitlines()[0] if text else "")
    if bare:  # `trainer.max_epochs 5`: a key without a value
        key = bare.group(1)
        return f"{key}: no value; write {key}=VALUE, one word (e.g. trainer.max_epochs=5)"
    dashed = re.match(r"Error parsing override '([a-z]+(?:-[a-z]+)+)'$", text.splitlines()[0])
    if dashed:  # `dry-run`, `fresh-code`: an option without its dashes
        word = dashed.group(1)
        return f"{word}: not an override (key=value); for the option, write --{word}"
    match = re.search(r"mismatched input|no viable alternative|extraneous input", text)
    if match:
        return (
            f"bad override syntax: {text.splitlines()[0]}; write key=value, e.g. "
            "trainer.max_epochs=5 (quote values with special characters)"
        )
    return text.splitlines()[0] if text else type(err).__name__


def compose_config(
    overrides: list[str],
    config_dirs: Optional[list[str]] = None,
    script: Optional[schema.ScriptConfig] = None,
    multirun: bool = False,
) -> schema.Config:
    """The typed, validated config; ``script``: `hpcdl run`'s program, validated with it;
    ``multirun``: the overrides are a sweep's (-m), which may set hydra.sweep.dir."""
    refuse_hydra_settings(overrides, multirun)
    try:
        composed = compose(overrides, config_dirs)
    except SweepValueError as err:
        raise (err if script is None else err.for_run()) from None
    with _naming_the_file(overrides, config_dirs):
        config = _typed_config(composed, overrides)
        refuse_yaml_numbers_in_env(config.cluster, overrides, config_dirs)
        if script is not None:
            config = replace(config, script=script)
        validate(config)  # errors name the paths as given
    # data.path=small.npz read from any folder later (resume, evaluate, a Slurm job).
    return with_absolute_paths(config, Path.cwd())


def refuse_hydra_settings(overrides: list[str], multirun: bool) -> None:
    """Hydra's own settings (hydra.run.dir, hydra.job.chdir, ...) would be composed and read
    by nothing: hpcdl makes the run dir itself. hydra.sweep.dir names a sweep's folder."""
    for text in overrides:
        key = text.partition("=")[0].lstrip("+~")
        if key.split(".", 1)[0] != "hydra" or (key == "hydra.sweep.dir" and multirun):
            continue
        if key == "hydra.sweep.dir":
            raise ConfigError(
                "hydra.sweep.dir: the folder of a sweep's trials, and this is one run; add -m "
                "to sweep, or set run_dir=... for this run's folder"
            )
        raise ConfigError(
            f"{key}: a setting of Hydra's own, which hpcdl does not read; set the run's folder "
            "with run_dir=... (a sweep's with -m hydra.sweep.dir=...)"
        )


@contextlib.contextmanager
def _naming_the_file(overrides: list[str], config_dirs: Optional[list[str]]) -> Iterator[None]:
    """A ConfigError whose key a YAML file set (not an override) starts with that file:
    `myconf/cluster/a100.yaml: cluster.gpus_per_nod: unknown key; ...`."""
    try:
        yield
    except ConfigError as err:
        key = error_key(str(err))
        path = None if key is None else file_setting(key, overrides, config_dirs)
        if path is None:
            raise
        raise ConfigError(f"{shown_path(path)}: {err}") from None


# The key an error message starts with: `cluster.mem_gb=lots: ...`, `model.hidden_sizes[0]=a:`,
# `cluster: holds a list ...`, `foo: unknown key ...`.
_LEADING_KEY = re.compile(r"([A-Za-z_]\w*(?:\.\w+|\[\d+\])*)([=:])")


def error_key(message: str) -> Optional[str]:
    """The config key a ConfigError names first, without list indices; None where it names
    none, or names a group's choice (`model=cnn needs image samples ...`)."""
    match = _LEADING_KEY.match(message)
    if match is None:
        return None
    key, sep = match.groups()
    if sep == "=" and key in (*GROUPS, *PRESET_GROUPS):
        return None
    return re.sub(r"\[\d+\]", "", key)


def file_setting(
    key: str, overrides: list[str], config_dirs: Optional[list[str]] = None
) -> Optional[Path]:
    """The YAML file that gave `key` its value in compose(overrides, config_dirs): the last
    one in Hydra's defaults list (group files, conf/config.yaml, experiment files, a file's
    own defaults) that sets the key or a mapping above it. None where an override on the
    command line sets it (overrides come after every file), where no file sets it (a
    schema default), or where the file leaves it required (`???`)."""
    if _set_by_override(key, overrides):
        return None
    source = _file_of(key, config_dirs, _defaults_list(overrides, config_dirs))
    return None if source is None else source[0]


def _set_by_override(key: str, overrides: list[str]) -> bool:
    """Whether an override sets the key (or a mapping above or below it); True as well for
    overrides Hydra cannot parse (no file can be said to set anything then)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        return True
    for override in parsed:
        name = override.key_or_group
        if override.is_delete() or name.startswith("hydra"):
            continue
        if name in (*GROUPS, *PRESET_GROUPS) and not isinstance(override.value(), dict):
            continue  # a group choice picks a file: the files below decide
        if key == name or key.startswith(name + ".") or name.startswith(key + "."):
            return True
    return False


def _file_of(
    key: str, config_dirs: Optional[list[str]], defaults: list[tuple[str, str]]
) -> Optional[tuple[Path, str]]:
    """(file, package) of the last of the defaults list's files that sets `key`."""
    for config_path, package in reversed(defaults):
        path = _config_file(config_path, config_dirs)
        if path is None:
            continue
        found = _lookup(path, package, key)
        if found is not None:
            return (path, package) if found else None
    return None


def refuse_yaml_numbers_in_env(
    cluster: schema.ClusterConfig, overrides: list[str], config_dirs: Optional[list[str]]
) -> None:
    """A cluster.env value a YAML file wrote as a number YAML 1.1 reads otherwise: `0022`
    (octal: 18), `0x1F`, `1_000`, `1:30` (sexagesimal: 90). The job would export the number
    the file did not say (UMASK=18): refused, naming how to quote it. Found by the value's
    text in the file that set it, only for values that are whole numbers."""
    numbers = {k: v for k, v in cluster.env.items() if v.lstrip("-").isdigit()}
    if not numbers or not _any_yaml_number_text(config_dirs):
        return  # (the whole check reads Hydra's defaults list: a tenth of a second a key)
    defaults = _defaults_list(overrides, config_dirs)
    for key, value in numbers.items():
        if _set_by_override(f"cluster.env.{key}", overrides):
            continue  # the command line's text, kept as given
        source = _file_of(f"cluster.env.{key}", config_dirs, defaults)
        text = None if source is None else _yaml_text(*source, f"cluster.env.{key}")
        if text is not None and text != value:
            raise ConfigError(
                f"cluster.env.{key}: YAML read {text} as the number {value}, which the job "
                f'would export as {key}={value}; quote the text you mean: {key}: "{text}"'
            )


# A YAML 1.1 integer not written in decimal digits: 0022, 0x1F, 0b11, 1_000, 1:30.
_OTHER_INT = re.compile(
    r":\s+[-+]?(0[0-7]+|0x[0-9a-fA-F_]+|0b[01_]+|[0-9][0-9_]*_[0-9_]*|[1-9][0-9_]*(:[0-5]?[0-9])+)"
    r"\s*(#.*)?$",
    re.M,
)


def _any_yaml_number_text(config_dirs: Optional[list[str]]) -> bool:
    """Whether any config file may hold such a number (one pass over their text): the
    primary configs and the group files, one level down (not a walk of a config dir that
    is a whole project folder)."""
    dirs = [Path(d) for d in (conf_dir(), *user_conf_dirs(config_dirs))]
    for path in (p for d in dirs for pattern in ("*.yaml", "*/*.yaml") for p in d.glob(pattern)):
        try:
            if _OTHER_INT.search(path.read_text()):
                return True
        except OSError:
            continue
    return False


def _yaml_text(path: Path, package: str, key: str) -> Optional[str]:
    """The key's scalar as written in the file (YAML's base loader: every scalar as text)."""
    try:
        node: Any = yaml.load(path.read_text(), Loader=yaml.BaseLoader)
    except (OSError, yaml.YAMLError):
        return None
    parts = key.split(".")[len(package.split(".")) if package else 0 :]
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, str) else None


def _defaults_list(overrides: list[str], config_dirs: Optional[list[str]]) -> list[tuple[str, str]]:
    """(config path, package) of each file Hydra merges for these overrides, in merge order."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from hydra.types import RunMode

    try:
        with _hydra_on_conf_dir():
            loader = GlobalHydra.instance().config_loader()
            defaults = loader.compute_defaults_list(
                PRIMARY_CONFIG, [*_searchpath(config_dirs), *overrides], RunMode.RUN
            ).defaults
    except (HydraException, OmegaConfBaseException, ValueError):
        return []
    return [
        (d.config_path, d.package or "")
        for d in defaults
        if d.config_path is not None and not (d.package or "").startswith("hydra")
    ]


def _config_file(config_path: str, config_dirs: Optional[list[str]]) -> Optional[Path]:
    """The file Hydra reads for `cluster/mycluster`: the first in the search path (conf/, the
    --config-dir folders, ~/.config/hpcdl; docs/configuration.md, "Your own YAML files")."""
    for folder in [conf_dir(), *user_conf_dirs(config_dirs)]:
        path = folder / f"{config_path}.yaml"
        if path.is_file():
            return path
    return None


def _lookup(path: Path, package: str, key: str) -> Optional[bool]:
    """Whether the file (merged at `package`) sets `key`: True, False where it leaves it
    required (`???`), None where it does not set it. A file of the key's group that is no
    mapping (a list, a scalar) gave the group whatever it holds: True."""
    try:
        loaded = OmegaConf.load(path)
    except (OSError, yaml.YAMLError, OmegaConfBaseException):
        return None
    parts = key.split(".")
    prefix = package.split(".") if package else []
    if parts[: len(prefix)] != prefix:
        return None
    if not isinstance(loaded, DictConfig):
        return True if parts[: len(prefix)] == prefix and prefix else None
    node: Any = loaded
    for part in parts[len(prefix) :]:
        if not isinstance(node, DictConfig) or part not in node:
            return None
        if OmegaConf.is_missing(node, part):
            return False
        node = node._get_node(part)
    return True


def shown_path(path: Path) -> str:
    """A config file as the user would type it: relative to the current folder when inside it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _typed_config(composed: DictConfig, overrides: list[str]) -> schema.Config:
    """to_config; keys that an experiment set for its own option of a group the command
    line switched (experiment=cancer_mlp optim=adam: its optim.momentum) are named at once."""
    try:
        config = to_config(composed)
    except ConfigError as err:
        presets = [o for o in overrides if o.split("=", 1)[0] in PRESET_GROUPS]
        group = str(err).split(".", 1)[0]
        node = composed.get(group) if presets and group in NAMED_GROUPS else None
        options = NAMED_GROUPS.get(group, {})
        if not isinstance(node, DictConfig) or node.get("name") not in options:
            raise
        valid = {f.name for f in fields(options[node.name])}
        given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
        keys = [f"{group}.{k!s}" for k in node if str(k) not in valid]
        extra = [k for k in keys if k not in given]
        if not extra:
            raise
        what, them = ("not keys", "them") if len(extra) > 1 else ("not a key", "it")
        drops = " ".join(f"'~{k}'" for k in extra)
        raise ConfigError(
            f"{', '.join(extra)}: {what} of {group}={node.name}; {' '.join(presets)} sets "
            f"{them} for its own {group} choice: drop {them} with {drops}"
        ) from None
    refuse_keys_lazy_data_ignores(composed.get("data"))
    refuse_typed_script_text(composed.get("cluster"))
    return config


def refuse_typed_script_text(cluster: Any) -> None:
    """cluster.env values and cluster.setup lines are text for the job script, but YAML
    (and Hydra's overrides) read `true`, `yes`, `0.10`, `1e3` as other types, which reached
    the script as `True`, `0.1`, `1000.0`: refused, naming how to quote them. Whole numbers
    keep their digits and pass."""
    if not isinstance(cluster, DictConfig):
        return
    env, setup = cluster.get("env"), cluster.get("setup")
    typed = [(str(k), v) for k, v in env.items()] if isinstance(env, DictConfig) else []
    lines = list(setup) if isinstance(setup, ListConfig) else []
    named: list[tuple[Optional[str], Any]] = [*typed, *((None, line) for line in lines)]
    for key, value in named:
        if not isinstance(value, (bool, float)):  # (null is refused by the schema)
            continue
        kind = "a boolean" if isinstance(value, bool) else "a number"
        text = str(value).lower()
        if key is not None:
            raise ConfigError(
                f"cluster.env.{key}: YAML read {kind} ({text}), which the job would export "
                f"as {str(value)!r}; quote the text you mean: \"cluster.env.{key}='{text}'\" "
                f'on the command line, {key}: "{text}" in a YAML file'
            )
        raise ConfigError(
            f"cluster.setup: YAML read a line as {kind} ({text}), which the job script would "
            f"run as {str(value)!r}; quote it: \"cluster.setup=['{text}']\" on the command "
            f'line, - "{text}" in a YAML file'
        )


# Keys of every data source that a lazily read one (data=custom, imagefolder) has no use
# for: given on the command line or in a file (a source's own YAML leaves them out), they
# would be ignored without a word. What to do instead, by key.
LAZY_DATA_IGNORES = {
    "standardize": {
        "imagefolder": "normalize per channel with data.mean=[...] data.std=[...] instead",
        "custom": "your Dataset's samples are used as it returns them: normalize in it",
    },
    "in_memory": {
        "imagefolder": "its images are read by DataLoader workers (data.num_workers)",
        "custom": "your Dataset is read by DataLoader workers (data.num_workers)",
    },
}


def refuse_keys_lazy_data_ignores(data: Any) -> None:
    """data.standardize or data.in_memory set for data=custom/imagefolder; for imagefolder
    with split folders (train/, val/, test/), data.val_fraction or test_fraction, which
    split only a folder of class folders."""
    if not isinstance(data, DictConfig) or data.get("name") not in schema.DATASET_SOURCES:
        return
    for key, fixes in LAZY_DATA_IGNORES.items():
        if key in data:
            raise ConfigError(
                f"data.{key}: data={data.name} reads samples lazily and does not use it; "
                f"{fixes[data.name]} (remove data.{key})"
            )
    path = data.get("path") if data.name == "imagefolder" else None
    if not isinstance(path, str) or not (Path(path).expanduser() / "train").is_dir():
        return
    for key in ("val_fraction", "test_fraction"):
        if key in data:
            split = key.split("_")[0]
            raise ConfigError(
                f"data.{key}: data.path={path!r} holds train/ (and its own {split}/ if any) "
                "split folders, which are the splits; the fractions split only a folder of "
                f"class folders (remove data.{key}, or move {split} images into {split}/)"
            )


class SweepComposer:
    """compose_config for many override lists (a sweep's trials), with Hydra's composition
    run once per distinct set of config-group choices (model=cnn vs model=mlp) instead of
    once per list (0.09-0.24 s a composition on a 2-core VM: 9-13 s for 100 trials).

    Hydra composes in two stages: the group choices pick and merge the YAML files, then
    the other overrides (optim.lr=0.1, +cluster.partition=gpu, ~model.x) are applied to
    the merged config one by one, in their order. The second stage is done here with
    Hydra's own function, on a copy of the first stage's result, so a trial's config is
    the one compose_config gives for its overrides (tests/test_sweeps.py compares them);
    each trial is still converted to the typed Config and validated on its own. A list
    holding anything else (hydra.* keys, group@package, a dict for a whole group) is
    composed from scratch.
    """

    def __init__(self, config_dirs: Optional[list[str]] = None) -> None:
        self._config_dirs = config_dirs
        self._merged: dict[tuple[str, ...], DictConfig] = {}  # group choices -> stage 1
        self._parsed: dict[str, Override] = {}
        self._parser: Optional[OverridesParser] = None
        self._env_checked: set[tuple[tuple[str, ...], tuple[str, ...]]] = set()

    def config(self, overrides: list[str]) -> schema.Config:
        split = self._split(overrides)
        if split is None:
            return compose_config(overrides, self._config_dirs)
        choices, values = split
        merged = self._merged.get(choices)
        if merged is None:
            merged = self._merged[choices] = compose(list(choices), self._config_dirs)
        composed = _with_additions(values, lambda vs: self._applied(merged, vs))
        with _naming_the_file(overrides, self._config_dirs):
            config = _typed_config(composed, overrides)
            validate(config)
            # Once per group choices and cluster overrides: it reads the defaults list.
            env_key = (choices, tuple(v for v in values if v.lstrip("+~").startswith("cluster")))
            if env_key not in self._env_checked:
                refuse_yaml_numbers_in_env(config.cluster, overrides, self._config_dirs)
                self._env_checked.add(env_key)
        return config

    def _split(self, overrides: list[str]) -> Optional[tuple[tuple[str, ...], list[str]]]:
        """(group choices, value overrides), each in the given order; None for a list
        that needs Hydra's whole composition (or fails to parse: compose_config then
        reports it as it always has)."""
        from hydra.errors import HydraException

        choices: list[str] = []
        values: list[str] = []
        for text in overrides:
            try:
                override = self._parse(text)
            except HydraException:
                return None
            key = override.key_or_group
            if override.package is not None or override.is_sweep_override():
                return None
            if key in GROUPS or key in PRESET_GROUPS:  # a group, unless the value is a dict
                if isinstance(override.value(), dict) or override.is_force_add():
                    return None
                choices.append(text)
            elif key in TOP_LEVEL_KEYS or key.split(".", 1)[0] in GROUPS:
                values.append(text)
            else:
                return None
        return tuple(choices), values

    def _parse(self, text: str) -> Override:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        if text not in self._parsed:
            self._parser = self._parser or OverridesParser.create()
            self._parsed[text] = self._parser.parse_override(text)
        return self._parsed[text]

    def _applied(self, merged: DictConfig, values: list[str]) -> DictConfig:
        # Hydra's second stage (hydra 1.3's ConfigLoaderImpl; pinned in pyproject.toml).
        from hydra._internal.config_loader_impl import ConfigLoaderImpl

        tree = copy.deepcopy(merged)  # keeps the struct flag: unknown keys still fail
        ConfigLoaderImpl._apply_overrides_to_config([self._parse(v) for v in values], tree)
        return tree


def apply_overrides(
    base: schema.Config, overrides: list[str], config_dirs: Optional[list[str]] = None
) -> schema.Config:
    """`hpcdl resume RUN_DIR k=v group=option`: the stored config with overrides on top.

    A group choice (cluster=devcluster) replaces that group with its YAML; a dotted key
    sets one value (parsed by Hydra's override grammar, so lists and numbers work).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    plain: dict[str, Any] = to_plain(base)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as err:
        raise ConfigError(hydra_message(err)) from None
    tree = OmegaConf.create(plain)
    for ov in parsed:
        key = ov.key_or_group
        if ov.is_sweep_override():
            raise ConfigError(f"{ov.input_line}: sweeps are not allowed when resuming one run")
        if key in PRESET_GROUPS:
            raise ConfigError(
                f"{ov.input_line}: the run's config.yaml already holds every value its "
                f"{key} set; resume with single keys (trainer.max_epochs=50), or start a "
                f"new run: hpcdl train {ov.input_line}"
            )
        if key in GROUPS and "." not in key:
            group_cfg = compose([f"{key}={ov.value()}"], config_dirs)
            tree[key] = group_cfg[key]
            continue
        try:
            OmegaConf.update(tree, key, ov.value(), merge=False, force_add=False)
        except OmegaConfBaseException as err:
            raise ConfigError(f"{key}: {str(err).splitlines()[0]}") from None
    raw = OmegaConf.to_container(tree, resolve=True)
    assert isinstance(raw, dict)
    try:
        config = from_dict(raw)
        validate(config)
    except ConfigError as err:
        named = error_key(str(err))
        path = None if named is None else _resumed_file_setting(named, parsed, config_dirs)
        if path is None:
            raise
        raise ConfigError(f"{shown_path(path)}: {err}") from None
    return config


def _resumed_file_setting(
    key: str, parsed: list[Override], config_dirs: Optional[list[str]]
) -> Optional[Path]:
    """The file behind `key` after apply_overrides: the option's YAML where the last override
    that reaches the key picks its group (cluster=mycluster); None where it sets the key
    itself, or where none reaches it (the run's config.yaml gave it)."""
    for ov in reversed(parsed):
        name = ov.key_or_group
        if name in GROUPS and "." not in name and key.split(".", 1)[0] == name:
            return file_setting(key, [f"{name}={ov.value()}"], config_dirs)
        if key == name or key.startswith(name + ".") or name.startswith(key + "."):
            return None
    return None
