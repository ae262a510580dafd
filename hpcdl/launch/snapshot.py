"""The code a Slurm job runs: hpcdl itself and the user's own model module, frozen into
the run's (or sweep's) code dir at submission so edits made afterwards never reach a queued or requeued job.
Stdlib only (login node): the user's module is located, never imported.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterable
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Optional

from hpcdl.atomic import write_atomic

REVISION_FILE = "REVISION"
FROZEN_FILE = "FROZEN"  # one line per frozen user module: "name path"
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".git")


def snapshot_code(code: Path, custom_targets: Iterable[str] = ()) -> str:
    """Freeze hpcdl (and the modules of the config's targets) into the folder `code`;
    returns the git revision (or 'unknown'). A resumed run keeps the code it was submitted
    with."""
    import hpcdl

    package = Path(hpcdl.__file__).resolve().parent
    target = code / "hpcdl"
    if target.exists():
        return code_revision(target)
    shutil.copytree(package, target, ignore=IGNORED)
    revision = git_revision(package.parent)
    write_atomic(code / REVISION_FILE, revision + "\n")
    frozen = []
    for name in sorted({t.partition(":")[0].split(".")[0] for t in custom_targets if t}):
        spec = find_top_level(name)
        if spec is None:
            print(
                f"warning: a config target's module {name!r} is not importable here, so it is not "
                "frozen with the run's code; the job imports whatever it finds (put its folder "
                "on PYTHONPATH before submitting to freeze it)",
                file=sys.stderr,
            )
            continue
        source = user_module_source(spec)
        if source is not None:
            copy_module(source, code)
            frozen.append(f"{name} {source}")
    if frozen:
        write_atomic(code / FROZEN_FILE, "\n".join(frozen) + "\n")
    return revision


SCRIPT_DIR = "script"  # the frozen copy of an `hpcdl run` script's folder
SCRIPT_SOURCE_FILE = "SCRIPT"  # the folder code/script was copied from


def freeze_script_files(code: Path, command: list[str], workdir: Optional[str] = None) -> list[str]:
    """`hpcdl run -- python train.py ...`: copy the script's folder (its .py files and the
    packages beside it) into code/script once, and return the command with the script's
    path pointing at the frozen copy. Commands without a local .py file are unchanged.
    A relative path is the run's workdir's (where the job starts the program)."""
    frozen, source = frozen_script(code, command, workdir)
    if source is not None and not (code / SCRIPT_DIR).exists():
        copy_python_tree(source, code / SCRIPT_DIR)
        write_atomic(code / SCRIPT_SOURCE_FILE, f"{source}\n")
    return frozen


def script_source(code: Path) -> Optional[Path]:
    """The folder code/script was copied from (None: no script frozen, or frozen by an
    hpcdl that did not record it)."""
    try:
        text = (code / SCRIPT_SOURCE_FILE).read_text().strip()
    except OSError:
        return None
    return Path(text) if text else None


def frozen_script(
    code: Path, command: list[str], workdir: Optional[str] = None
) -> tuple[list[str], Optional[Path]]:
    """The command as the job will run it (its script in the frozen copy), and the folder
    to copy there (None: nothing to copy). Writes nothing: `--dry-run` shows it too. A
    relative path is `workdir`'s (the current folder's without one)."""
    for index, token in enumerate(command):
        path = Path(token).expanduser()
        if workdir is not None and not path.is_absolute():
            path = Path(workdir) / path
        if not token.endswith(".py") or not path.is_file():
            continue
        path = path.resolve()
        if path.is_relative_to(code.resolve()):
            return command, None  # already frozen (a resumed run)
        return [*command[:index], str(code / SCRIPT_DIR / path.name), *command[index + 1 :]], (
            path.parent
        )
    return command, None


def copy_python_tree(source: Path, target: Path) -> None:
    """The .py files of `source`, its sub-folders that are packages (with __init__.py), and
    those that Python imports as namespace packages (a folder named like a module, holding
    .py files but no __init__.py: `import chemutils.feats`), their .py files only."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in sorted(source.iterdir()):
        if entry.name.startswith(".") or entry.name == "__pycache__":
            continue
        if entry.is_file() and entry.suffix == ".py":
            shutil.copy2(entry, target / entry.name)
        elif entry.is_dir() and (entry / "__init__.py").is_file():
            shutil.copytree(entry, target / entry.name, ignore=IGNORED)
        elif entry.is_dir() and entry.name.isidentifier() and any(entry.glob("*.py")):
            copy_python_tree(entry, target / entry.name)


def find_top_level(name: str) -> Optional[ModuleSpec]:
    """Locate a top-level module without running it (None: not importable here)."""
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def missing_submodule(target: str) -> Optional[str]:
    """Why the module of 'package.module:name' is missing from the user's package it would
    be frozen from (found here without running any of it); None when it is there, or the
    package is not the user's (installed, or not importable here: the job decides)."""
    top, *rest = target.partition(":")[0].split(".")
    spec = find_top_level(top) if rest else None
    source = user_module_source(spec) if spec is not None else None
    if source is None or not source.is_dir():
        return None
    folder = source
    for depth, part in enumerate(rest, start=1):
        if (folder / part).is_dir():
            folder = folder / part
        elif depth == len(rest) and any(folder.glob(f"{part}.*")):  # .py, or compiled
            return None
        else:
            name = ".".join([top, *rest[:depth]])
            return f"there is no module {name!r} in {folder}"
    return None


def user_module_source(spec: ModuleSpec) -> Optional[Path]:
    """The file or package folder of a top-level module when it is the user's own code
    (outside the installed and standard libraries); None otherwise."""
    if spec.name in sys.stdlib_module_names or spec.name == "hpcdl":
        return None
    if not spec.origin or spec.origin in ("built-in", "frozen"):
        return None
    origin = Path(spec.origin).resolve()
    if installed(origin):
        return None
    if spec.submodule_search_locations:  # a package: freeze its folder
        return origin.parent
    return origin if origin.suffix == ".py" else None


def import_roots(custom_targets: Iterable[str]) -> list[Path]:
    """The folders the user's modules named by `custom_targets` are imported from here (a
    sys.path entry a script added, which PYTHONPATH may not hold): ranks started apart get
    them on their PYTHONPATH."""
    roots = []
    for name in sorted({t.partition(":")[0].split(".")[0] for t in custom_targets if t}):
        spec = find_top_level(name)
        source = None if spec is None else user_module_source(spec)
        if source is not None:
            roots.append(source.parent)
    return list(dict.fromkeys(roots))


def installed(path: Path) -> bool:
    roots = {sysconfig.get_path(key) for key in ("purelib", "platlib", "stdlib", "platstdlib")}
    resolved = [Path(r).resolve() for r in roots]
    return any(path.is_relative_to(root) for root in resolved) or any(
        part in ("site-packages", "dist-packages") for part in path.parts
    )


def changed_since_frozen(code: Path) -> list[str]:
    """The user's modules frozen in `code` (code/FROZEN) whose .py files differ now from
    their frozen copy, by name, and an `hpcdl run` script's folder (its path, ending in
    '/') whose .py files do: a resume or rerun runs the copy, not the edit."""
    changed = []
    folder = script_source(code)
    if folder is not None and folder.is_dir():
        what = _file_changes(_script_files(folder), _script_files(code / SCRIPT_DIR))
        if what:
            changed.append(f"{folder}/ ({what})")
    try:
        lines = (code / FROZEN_FILE).read_text().splitlines()
    except OSError:
        return changed
    for line in lines:
        name, _, source = line.partition(" ")
        if not source or not Path(source).exists():  # moved or gone: no edit to tell of
            continue
        if _python_files(Path(source)) != _python_files(code / Path(source).name):
            changed.append(name)
    return changed


def _file_changes(now: dict[str, bytes], frozen: dict[str, bytes]) -> str:
    """'train.py edited, util/io.py added' (at most 3 named), or '' when the same."""
    changes = [
        *(
            f"{name} edited"
            for name in sorted(now.keys() & frozen.keys())
            if now[name] != frozen[name]
        ),
        *(f"{name} added" for name in sorted(now.keys() - frozen.keys())),
        *(f"{name} removed" for name in sorted(frozen.keys() - now.keys())),
    ]
    more = f", {len(changes) - 3} more" if len(changes) > 3 else ""
    return ", ".join(changes[:3]) + more


def frozen_modules(code: Path) -> dict[str, str]:
    """code/FROZEN: each frozen user module's name and the path it was copied from."""
    try:
        lines = (code / FROZEN_FILE).read_text().splitlines()
    except OSError:
        return {}
    return dict(line.partition(" ")[::2] for line in lines if line.strip())


def _script_files(folder: Path) -> dict[str, bytes]:
    """What copy_python_tree copies of `folder`: its .py files, its packages' and its
    namespace packages' (.py)."""
    files: dict[str, bytes] = {}
    try:
        for entry in folder.iterdir():
            if entry.name.startswith(".") or entry.name == "__pycache__":
                continue
            if entry.is_file() and entry.suffix == ".py":
                files[entry.name] = entry.read_bytes()
            elif entry.is_dir() and (entry / "__init__.py").is_file():
                files.update({f"{entry.name}/{k}": v for k, v in _python_files(entry).items()})
            elif entry.is_dir() and entry.name.isidentifier() and any(entry.glob("*.py")):
                files.update({f"{entry.name}/{k}": v for k, v in _script_files(entry).items()})
    except OSError:
        return {}
    return files


def _python_files(root: Path) -> dict[str, bytes]:
    """A module file, or a package folder's .py files, by relative path ({} if gone)."""
    try:
        if root.is_file():
            return {root.name: root.read_bytes()}
        files = (p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
        return {str(p.relative_to(root)): p.read_bytes() for p in files}
    except OSError:
        return {}


def copy_module(source: Path, code: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, code / source.name, ignore=IGNORED)
    else:
        shutil.copy2(source, code / source.name)


def code_revision(package_dir: Path) -> str:
    """The revision a package copy was frozen at, or the checkout's own."""
    frozen = package_dir.parent / REVISION_FILE
    if frozen.exists():
        return frozen.read_text().strip()
    return git_revision(package_dir.parent)


def git_revision(path: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if out.returncode != 0:
        return "unknown"
    dirty = subprocess.run(
        ["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        timeout=10,
    ).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")
