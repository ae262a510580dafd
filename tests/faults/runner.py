"""Runs fault cases: each in a fresh folder, the real `hpcdl` command, then the checks."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, TextIO

from tests.faults.cases import CASES, Case

REPO = Path(__file__).resolve().parents[2]
# CI's reduced set: every QUICK_EVERY-th case, and every R5 case.
QUICK_EVERY = 4
TIMEOUT_S = 300


@dataclass
class Result:
    case: Case
    returncode: int
    error_line: str
    problems: list[str]


def snapshot(root: Path) -> dict[str, str]:
    """Every path under root (but Python's caches) with its content's hash."""
    state = {}
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.parts:
            continue
        rel = str(path.relative_to(root))
        state[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return state


def prepare_run(work: Path) -> Path:
    """A finished tiny run (1 epoch on breast cancer), copied into each case that needs one."""
    run = work / "prepared-run"
    hpcdl(["train", f"run_dir={run}", "trainer.max_epochs=1"], work, check=True)
    return run


def hpcdl(argv: Sequence[str], cwd: Path, check: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(cwd)])}
    out = subprocess.run(
        [sys.executable, "-m", "hpcdl.cli.main", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
    )
    if check and out.returncode != 0:
        raise RuntimeError(f"hpcdl {' '.join(argv)} failed: {out.stderr}")
    return out


def run_case(case: Case, work: Path, prepared: Optional[Path]) -> Result:
    folder = work / case.id
    folder.mkdir()
    if case.needs_run:
        assert prepared is not None
        shutil.copytree(prepared, folder / "run")
    case.setup(folder)
    before = snapshot(folder)
    out = hpcdl(case.argv, folder)
    lines = [ln for ln in out.stderr.strip().splitlines() if ln.strip()]
    problems = []
    if case.marker and (folder / case.marker).exists():
        problems.append("the crafted input ran code")
    if out.returncode != case.exit_code:
        problems.append(f"exit status {out.returncode}, expected {case.exit_code}")
    error_line = ""
    if case.exit_code == 2:
        errors = [ln for ln in lines if ln.startswith("error:")]
        error_line = errors[-1] if errors else (lines[-1] if lines else "")
        if len(errors) != 1 or any("Traceback" in ln for ln in lines):
            problems.append(f"not one error line: {lines[-3:]}")
        if case.expect not in error_line:
            problems.append(f"the error does not name {case.expect!r}: {error_line!r}")
        after = snapshot(folder)
        if after != before:
            added = sorted(set(after) - set(before))
            changed = sorted(k for k in before if after.get(k) != before[k])
            problems.append(f"the folder changed: added {added[:4]}, changed {changed[:4]}")
    return Result(case, out.returncode, error_line, problems)


def selected(quick: bool, only: Sequence[str]) -> list[Case]:
    if only:
        unknown = set(only) - {c.id for c in CASES}
        if unknown:
            raise SystemExit(f"unknown case ids: {sorted(unknown)}")
        return [c for c in CASES if c.id in only]
    if quick:
        return [c for i, c in enumerate(CASES) if i % QUICK_EVERY == 0 or c.scenario == "R5"]
    return list(CASES)


def run_cases(
    quick: bool = False, only: Sequence[str] = (), progress: Optional[TextIO] = None
) -> list[Result]:
    cases = selected(quick, only)
    with tempfile.TemporaryDirectory(prefix="hpcdl-faults-") as tmp:
        work = Path(tmp)
        prepared = prepare_run(work) if any(c.needs_run for c in cases) else None
        results = []
        for case in cases:
            result = run_case(case, work, prepared)
            if progress is not None:
                mark = "ok  " if not result.problems else "FAIL"
                print(
                    f"{mark} {case.scenario} {case.id}: {result.error_line}",
                    file=progress,
                    flush=True,
                )
            results.append(result)
    return results


def tally_table(results: Sequence[Result]) -> str:
    tried, survived, lost = Counter(), Counter(), Counter()
    for r in results:
        tried[r.case.scenario] += 1
        survived[r.case.scenario] += not r.problems
        lost[r.case.scenario] += any(
            word in p
            for p in r.problems
            for word in (
                "changed",
                "ran code",
                "no loadable",
                "MIXED",
                "holds tensors",
                "differ",
                "repeats",
            )
        )
    rows = ["| scenario | tried | survived | data lost or code run |", "|---|---|---|---|"]
    for s in sorted(tried):
        rows.append(f"| {s} | {tried[s]} | {survived[s]} | {lost[s]} |")
    return "\n".join(rows)
