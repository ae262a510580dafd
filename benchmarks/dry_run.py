"""P3 dry run: `hpcdl train cluster=rivanna_a100 --dry-run` in a fresh interpreter, against
`python -c "import torch"` in a fresh interpreter.

The login-node path (compose, validate, print the sbatch script) must never import torch,
so on a busy login node it should feel instant: the goal is half of what merely importing
torch takes on the same machine, in the same run. Both are timed from process start to
exit, round by round (interleaved), with the same interpreter and environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

from benchmarks.base import Row, Settings
from benchmarks.timing import compared, interleaved

PROFILE = "rivanna_a100"
HPCDL = (sys.executable, "-m", "hpcdl.cli.main")
IMPORT_TORCH = (sys.executable, "-c", "import torch")


def run(settings: Settings) -> list[Row]:
    work = settings.work_dir
    work.mkdir(parents=True)
    dry_run = [*HPCDL, "train", f"cluster={PROFILE}", "--dry-run"]
    rounds = interleaved(
        {
            "hpcdl": lambda: timed_command(dry_run, work, settings),
            "torch": lambda: timed_command(IMPORT_TORCH, work, settings),
        },
        settings.repeats,
        settings.warmup_rounds,
    )
    figures = compared(rounds["hpcdl"], rounds["torch"])
    return [
        Row(
            id="dry_run.vs_import_torch",
            what=f"`hpcdl train cluster={PROFILE} --dry-run` in a fresh interpreter, start to "
            "exit: compose, validate and print the sbatch script",
            baseline='`python -c "import torch"` in a fresh interpreter, start to exit',
            ratio=figures.pop("ratio"),
            goal=0.5,
            details={**figures, "imports_torch": imports_torch(dry_run, work)},
        )
    ]


def timed_command(
    argv: Sequence[str],
    cwd: Path,
    settings: Settings,
    env: Optional[Mapping[str, str]] = None,
) -> float:
    """Wall seconds of one fresh process, from start to exit; its output goes to the log
    (a failure raises with the end of it)."""
    settings.log.flush()
    started = time.perf_counter()
    done = subprocess.run(
        list(argv),
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=settings.log,
        stderr=subprocess.PIPE,
        text=True,
    )
    seconds = time.perf_counter() - started
    settings.log.write(done.stderr)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.splitlines()[-10:])
        raise RuntimeError(f"{' '.join(argv)}: exit status {done.returncode}\n{tail}")
    return seconds


def imports_torch(argv: Sequence[str], cwd: Path) -> bool:
    """Whether the command imports torch (python -X importtime lists every import); run
    once, outside the timed rounds."""
    done = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]], cwd=cwd, capture_output=True, text=True
    )
    return any(line.rsplit("|", 1)[-1].strip() == "torch" for line in done.stderr.splitlines())


