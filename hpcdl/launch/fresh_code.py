"""`--fresh-code` (`hpcdl resume`, `hpcdl sweep rerun --failed`): the code a Slurm run's
(or a whole sweep's) jobs run, frozen anew from the code as it is now, as a new submission
would freeze it, with the copy its jobs ran until now kept beside it (code.1, code.2, ...).

A module or script that cannot be frozen anew (gone, or not importable here) is refused
with the old copy put back. Which runs share the copy, and the refusal while one of them
runs: hpcdl.cli.fresh. Stdlib only (login node).
"""

from __future__ import annotations

import importlib
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpcdl.errors import HpcdlError
from hpcdl.launch.snapshot import (
    REVISION_FILE,
    SCRIPT_DIR,
    find_top_level,
    freeze_script_files,
    frozen_modules,
    script_source,
    snapshot_code,
)

if TYPE_CHECKING:
    from hpcdl.config.schema import Config
    from hpcdl.rundir import JobDir


@dataclass(frozen=True)
class FreshCode:
    """A code dir frozen anew; `aside`: the copy it replaced."""

    code: Path
    aside: Path

    def undo(self) -> None:
        """Back to the copy the jobs ran (a submission refused after the freeze)."""
        shutil.rmtree(self.code, ignore_errors=True)
        self.aside.rename(self.code)

    def put_back(self) -> None:
        """undo(), said: the submission after the freeze was refused."""
        self.undo()
        print(f"--fresh-code: {self.code} is the copy its jobs ran again", flush=True)

    def line(self, ran: str) -> str:
        return (
            f"--fresh-code: {self.code} frozen anew from your code as it is now ({ran} until "
            f"now is kept in {self.aside})"
        )


def unfrozen_commands(code: Path, configs: Sequence[Config]) -> list[list[str]]:
    """The `hpcdl run` commands of `configs` as they were typed: their script's path in
    the folder code/script was copied from, which must still hold it."""
    commands = [c.script.command for c in configs if c.script is not None and c.script.command]
    copy = code / SCRIPT_DIR
    if not commands or not copy.is_dir():
        return commands
    source = script_source(code)
    if source is None:
        raise HpcdlError(
            f"--fresh-code: {code} does not record the folder its script was copied from "
            "(frozen by an older hpcdl); give the command after --: hpcdl resume RUN_DIR "
            "--fresh-code -- python /path/to/train.py ..."
        )
    unfrozen = []
    for command in commands:
        words = []
        for word in command:
            if Path(word).is_relative_to(copy):
                original = source / Path(word).relative_to(copy)
                if not original.is_file():
                    raise HpcdlError(
                        f"--fresh-code: {original} (its script, copied from there at the first "
                        "submission) is gone; put it back, or resume without --fresh-code "
                        f"to run the copy in {copy}"
                    )
                word = str(original)
            words.append(word)
        unfrozen.append(words)
    return unfrozen


def refreeze(base: JobDir, configs: Sequence[Config]) -> FreshCode | None:
    """Freeze `base`'s code anew for `configs` (a run's, or every trial's of a sweep); the
    old copy moves to code.N. None: nothing was frozen yet (the submission freezes it), or
    the code frozen anew is the same as the copy (kept, no code.N, and said)."""
    from hpcdl.launch.slurm import custom_targets

    code = base.code_dir
    if not code.is_dir():
        return None
    commands = unfrozen_commands(code, configs)
    workdirs = [c.workdir for c in configs if c.script is not None and c.script.command]
    refuse_lost_modules(code)
    before = frozen_modules(code)
    aside = base.code_aside()
    code.rename(aside)
    fresh = FreshCode(code, aside)
    try:
        with found_where_frozen(before):  # no PYTHONPATH needed for them
            snapshot_code(code, custom_targets(*configs))
        for command, workdir in zip(commands, workdirs, strict=True):
            freeze_script_files(code, command, workdir)  # a relative path: the workdir's
        now = frozen_modules(code)
        lost = [name for name in before if name not in now]
        if lost:
            raise lost_module(lost[0], before[lost[0]], code)
    except BaseException:
        fresh.undo()
        raise
    if code_files(code) == code_files(aside):
        fresh.undo()
        print(
            f"--fresh-code: your code is the same as the copy in {code} (hpcdl and your "
            "modules); nothing frozen anew",
            flush=True,
        )
        return None
    return fresh


def hpcdl_changed(code: Path) -> bool:
    """Whether the hpcdl installed here differs from the copy frozen in `code`."""
    import hpcdl

    return code_files(Path(hpcdl.__file__).resolve().parent) != code_files(code / "hpcdl")


def code_files(code: Path) -> dict[str, bytes]:
    """A frozen copy's files by relative path, but its REVISION (a commit that changed no
    file is the same code)."""
    return {
        str(path.relative_to(code)): path.read_bytes()
        for path in sorted(code.rglob("*"))
        if path.is_file()
        and path.name != REVISION_FILE
        and "__pycache__" not in path.parts
        and path.suffix != ".pyc"
    }


def refuse_lost_modules(code: Path) -> None:
    """The user's modules frozen in `code` must be found again: where they were frozen
    from, or on PYTHONPATH (moved)."""
    for name, source in frozen_modules(code).items():
        if not Path(source).exists() and find_top_level(name) is None:
            raise lost_module(name, source, code)


def lost_module(name: str, source: str, code: Path) -> HpcdlError:
    return HpcdlError(
        f"--fresh-code: {name} is neither at {source}, where it was frozen from, nor "
        "importable here; put it back there (or its folder on PYTHONPATH), or go on without "
        f"--fresh-code to run the copy in {code}"
    )


@contextmanager
def found_where_frozen(modules: dict[str, str]) -> Iterator[None]:
    """sys.path with the folders the modules were frozen from first (those still there), so
    that they are frozen anew from the same place without PYTHONPATH being set again."""
    folders = list(
        dict.fromkeys(str(Path(src).parent) for src in modules.values() if Path(src).exists())
    )
    saved = list(sys.path)
    sys.path[:0] = folders
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path[:] = saved
        importlib.invalidate_caches()
