"""The package's flow is one-way: no module imports from a layer above its own.

    cli -> sweep -> launch -> job -> build/finalize/inference -> trainer -> evaluation
        -> checkpoint, data, models, optim, dist, plots, hooks, ... -> rundir, env, ...
        -> config -> errors, exit codes, the atomic writer

Checked on the source (every import statement, at module level or inside a function), so
an upward import fails here even when it is only reached at run time.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hpcdl"

# Lowest first. A module may import from its own layer or any layer below it.
LAYERS: list[list[str]] = [
    [
        "hpcdl",
        "hpcdl.errors",
        "hpcdl.exit_codes",
        "hpcdl.atomic",
        "hpcdl.process_end",
        "hpcdl.number_ranges",
    ],
    ["hpcdl.config"],
    [
        "hpcdl.rundir",
        "hpcdl.checkpoint_file",
        "hpcdl.workdir",
        "hpcdl.runlock",
        "hpcdl.requeue",
        "hpcdl.watchdog",
        "hpcdl.script_stall",
        "hpcdl.targets",
        "hpcdl.env",
        "hpcdl.threads",
        "hpcdl.signals",
        "hpcdl.state",
        "hpcdl.early_stop",
        "hpcdl.nothing_to_train",
        "hpcdl.resume_from",
        "hpcdl.samples",
    ],
    [
        "hpcdl.checkpoint",
        "hpcdl.provenance",
        "hpcdl.plots",
        "hpcdl.hooks",
        "hpcdl.step_sums",
        "hpcdl.deferred_stats",
        "hpcdl.progress",
        "hpcdl.telemetry",
        "hpcdl.dist",
        "hpcdl.script_port",
        "hpcdl.script_group",
        "hpcdl.models",
        "hpcdl.data",
        "hpcdl.optim",
        "hpcdl.tasks",
        "hpcdl.trackers",
    ],
    ["hpcdl.evaluation", "hpcdl.step_sync", "hpcdl.micro_batches"],
    ["hpcdl.trainer"],
    [
        "hpcdl.build",
        "hpcdl.finalize",
        "hpcdl.inference",
        "hpcdl.probe",
        "hpcdl.api",
        "hpcdl.entry",
        "hpcdl.devices",
    ],
    ["hpcdl.job", "hpcdl.script_job"],
    ["hpcdl.launch"],
    ["hpcdl.sweep"],
    ["hpcdl.cli", "hpcdl.client"],
]

# The package's __init__ is the public facade: its module __getattr__ hands out the Python
# API on first use, so `import hpcdl` itself imports nothing (tests/test_python_api.py).
LAZY_EXPORTS = {"hpcdl": {"hpcdl.client"}}


def layer_of(module: str) -> int:
    best, best_len = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            # The package itself ("hpcdl": its __file__) matches only exactly.
            inside = prefix != "hpcdl" and module.startswith(prefix + ".")
            if (module == prefix or inside) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    assert best is not None, f"{module}: not in LAYERS; give it a layer in tests/test_layers.py"
    return best


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name == "hpcdl" or name.startswith("hpcdl.")}


def test_every_module_has_a_layer() -> None:
    for path in PACKAGE.rglob("*.py"):
        layer_of(module_name(path))


def test_no_module_imports_from_a_layer_above_it() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = module_name(path)
        for imported in sorted(imports_of(path) - LAZY_EXPORTS.get(importer, set())):
            if layer_of(imported) > layer_of(importer):
                upward.append(f"{importer} imports {imported}")
    assert upward == []


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from hpcdl.cli.main import main\n")
    assert imports_of(bad) == {"hpcdl.cli.main"}
    assert layer_of("hpcdl.cli.main") > layer_of("hpcdl.trainer")


def test_a_new_module_needs_a_layer() -> None:
    import pytest

    with pytest.raises(AssertionError, match="not in LAYERS"):
        layer_of("hpcdl.brand_new_module")
