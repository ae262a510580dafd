"""The documentation site: the configuration reference matches the typed schema key for key,
in both directions; every page is in the nav; `mkdocs build --strict` passes."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any, Optional, Union

import pytest
import yaml

from hpcdl.config import schema

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
REFERENCE = DOCS / "configuration.md"
# Python code that the tests and how-tos import (docs/examples/mylab), not pages.
NOT_PAGES = ("examples",)

Key = tuple[str, Optional[str], str]  # (group, option or None for all options, dotted key)


# ----------------------------------------------------------------------------- the schema
def _dataclasses_in(hint: Any) -> list[type]:
    """The dataclasses a field's type admits: Union[A, B] -> [A, B], Optional[A] -> [A]."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        return [a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)]
    return [hint] if dataclasses.is_dataclass(hint) else []


def _leaf_keys(cls: type, prefix: str = "") -> set[str]:
    """Dotted keys of a dataclass; a nested dataclass field (trainer.early_stopping) adds
    its own keys, anything else (a list, a dict such as model.kwargs) is one key."""
    keys: set[str] = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        nested = _dataclasses_in(hints[f.name])
        if len(nested) == 1:
            keys |= _leaf_keys(nested[0], f"{prefix}{f.name}.")
        else:
            keys.add(f"{prefix}{f.name}")
    return keys


def _option_name(cls: type) -> str:
    return next(f.default for f in dataclasses.fields(cls) if f.name == "name")


def schema_groups() -> dict[str, dict[Optional[str], set[str]]]:
    """{group: {option: keys}} for every field of schema.Config: a Union of dataclasses is a
    group whose options are named by their `name` default (model=mlp), a single dataclass a
    group with one unnamed option (trainer), anything else a top-level key (group "")."""
    groups: dict[str, dict[Optional[str], set[str]]] = {"": {None: set()}}
    hints = typing.get_type_hints(schema.Config)
    for f in dataclasses.fields(schema.Config):
        classes = _dataclasses_in(hints[f.name])
        if len(classes) > 1:
            groups[f.name] = {_option_name(c): _leaf_keys(c) for c in classes}
        elif classes:
            groups[f.name] = {None: _leaf_keys(classes[0])}
        else:
            groups[""][None].add(f.name)
    return groups


def schema_keys() -> set[Key]:
    return {
        (group, option, key)
        for group, options in schema_groups().items()
        for option, keys in options.items()
        for key in keys
    }


# ----------------------------------------------------------------------------- the page
SECTION_GROUPS = {"Top-level keys": ""}  # `## trainer` is the group trainer, and so on
CODE = re.compile(r"`([^`]+)`")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def documented_keys(text: str) -> set[Key]:
    """Keys in the reference's tables. The rules the page keeps:

    - A `## GROUP` section documents that group (`## Top-level keys`: run_dir, ...).
    - In it, a table with a `key` column lists keys, several per cell as `a`, `b`.
    - The option a row belongs to is in its `option` or `source` column (an empty cell
      repeats the row above; a cell without a `code` name, such as "every", means every
      option), else in the `### GROUP=OPTION` heading above the table; without either,
      the key belongs to every option of the group.
    """
    found: set[Key] = set()
    group: Optional[str] = None
    heading_option: Optional[str] = None
    header: Optional[list[str]] = None
    row_option: list[Optional[str]] = []
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        if line.startswith("## "):
            title = line[3:].strip()
            group = SECTION_GROUPS.get(title, title if re.fullmatch(r"[a-z_]+", title) else None)
            heading_option, header = None, None
            continue
        if line.startswith("### "):
            m = re.fullmatch(r"### ([a-z_]+)=([a-z0-9_]+)", line.strip())
            heading_option = m.group(2) if m and m.group(1) == group else None
            header = None
            continue
        if group is None or not line.startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header, row_option = cells, []
            continue
        if set(line.replace("|", "").strip()) <= set("-: "):
            continue  # the |---| line
        if "key" not in header:
            continue
        row = dict(zip(header, cells, strict=False))
        option_cell = row.get("option", row.get("source"))
        options: list[Optional[str]]
        if option_cell is None:
            options = [heading_option]
        elif option_cell:  # `sgd`, or words such as "every" for every option
            options = row_option = list(CODE.findall(option_cell)) or [None]
        else:  # empty: the option of the row above
            options = row_option
        for key in CODE.findall(row["key"]):
            for option in options:
                found.add((group, option, key))
    return found


def _is_documented(key: Key, documented: set[Key]) -> bool:
    group, _, name = key
    return key in documented or (group, None, name) in documented


def _exists(key: Key, groups: dict[str, dict[Optional[str], set[str]]]) -> bool:
    group, option, name = key
    options = groups.get(group)
    if options is None:
        return False
    if option is None:  # documented for every option of the group
        return all(name in keys for keys in options.values())
    return name in options.get(option, set())


def test_reference_parser_reads_each_table_form() -> None:
    page = """
## model

### model=mlp

| key | type | default | meaning |
|---|---|---|---|
| `dropout` | float | `0.5` | see `model.kwargs` |

## optim

| option | key | type |
|---|---|---|
| every | `name` | str |
| `sgd` | `lr` | float |
| | `momentum` | float |
| `adamw` | `lr`, `eps` | |

## data

| key | type |
|---|---|
| `split_seed` | int |

```
| `not_a_key` | in a code block |
```

## Your own YAML files

| key | type |
|---|---|
| `ignored` | outside a group's section |
"""
    assert documented_keys(page) == {
        ("model", "mlp", "dropout"),
        ("optim", None, "name"),
        ("optim", "sgd", "lr"),
        ("optim", "sgd", "momentum"),
        ("optim", "adamw", "lr"),
        ("optim", "adamw", "eps"),
        ("data", None, "split_seed"),
    }


def test_schema_walk_reaches_nested_and_optional_groups() -> None:
    groups = schema_groups()
    assert "early_stopping.patience" in groups["trainer"][None]
    assert "container.image" in groups["cluster"][None]
    assert "wandb.mode" in groups["logger"][None]
    assert "collate_fn" in groups["data"]["custom"]
    assert "entry_kwargs" in groups["script"][None]  # Optional[ScriptConfig]
    assert {"run_dir", "init_from"} <= groups[""][None]
    assert set(groups["optim"]) == {"sgd", "adam", "adamw", "rmsprop"}


def test_every_schema_key_is_in_the_reference() -> None:
    documented = documented_keys(REFERENCE.read_text())
    missing = sorted(
        f"{g}={o}: {g}.{k}" if o else f"{g}.{k}" if g else k
        for g, o, k in schema_keys()
        if not _is_documented((g, o, k), documented)
    )
    assert not missing, (
        f"keys in hpcdl/config/schema.py but not in docs/configuration.md: {missing}"
    )


def test_every_key_in_the_reference_is_in_the_schema() -> None:
    groups = schema_groups()
    unknown = sorted(
        f"{g}={o}: {k}" if o else f"{g or 'top level'}: {k}"
        for g, o, k in documented_keys(REFERENCE.read_text())
        if not _exists((g, o, k), groups)
    )
    assert not unknown, f"docs/configuration.md documents keys the schema lacks: {unknown}"


def test_reference_lists_every_conf_file() -> None:
    """The `conf/<group>/  option option` block at the top of the reference."""
    listed: dict[str, set[str]] = {}
    for m in re.finditer(
        r"^conf/([a-z_]+)/ +([a-z0-9_ ]+?)(?: {2,}\(.*)?$", REFERENCE.read_text(), re.M
    ):
        listed[m.group(1)] = set(m.group(2).split())
    on_disk = {
        d.name: {p.stem for p in d.glob("*.yaml")}
        for d in (ROOT / "conf").iterdir()
        if d.is_dir() and any(d.glob("*.yaml"))
    }
    assert listed == on_disk


# ----------------------------------------------------------------------------- the site
class _MkdocsLoader(yaml.SafeLoader):
    """mkdocs.yml with its `!!python/...` tags read as None (only the nav matters here)."""


_MkdocsLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)


def _nav_pages(entry: Any) -> list[str]:
    if isinstance(entry, str):
        return [entry]
    if isinstance(entry, list):
        return [page for item in entry for page in _nav_pages(item)]
    if isinstance(entry, dict):
        return [page for value in entry.values() for page in _nav_pages(value)]
    return []


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_MkdocsLoader)
    nav = _nav_pages(config["nav"])
    pages = {
        p.relative_to(DOCS).as_posix()
        for p in DOCS.rglob("*.md")
        if p.relative_to(DOCS).parts[0] not in NOT_PAGES
    }
    assert sorted(pages - set(nav)) == [], "pages missing from mkdocs.yml's nav"
    assert sorted(set(nav) - pages) == [], "nav entries without a page in docs/"
    assert len(nav) == len(set(nav)), "a page is in the nav twice"


def test_site_builds_strict(tmp_path: Path) -> None:
    """Broken links, anchors no heading makes, pages outside the nav: each fails the build."""
    pytest.importorskip("material", reason="pip install -e '.[docs]' (the dev extra has it)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "faq" / "index.html").is_file()
    assert (tmp_path / "site" / "search" / "search_index.json").is_file()
