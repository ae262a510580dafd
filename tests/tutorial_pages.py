"""The tutorial pages (docs/tutorials/*.md) as steps a test runs, so the pages cannot rot.

A page's fenced blocks, top to bottom:

- ```bash: commands, run in order with `bash -e` in one working folder per page (fresh
  for each page; blocks share it, not their shell variables). Every bash block runs here,
  unless the HTML comment right above it (blank lines between are fine) says otherwise:
  `<!-- not-run: REASON -->` (needs a GPU or a real site: shown, never run; the page then
  shows the --dry-run form, or the dev cluster's) or `<!-- devcluster -->` (runs in the
  `slurm` tier, tests/slurm/test_tutorials_slurm.py, against slurm/devcluster: such a
  block must not need an earlier block's files).
- ```text: expected output of the nearest bash block above it (checked where that block
  runs). Each line must match a whole line of that block's output (stdout and stderr
  together), in order, runs of spaces counted as one; `...` inside a line matches
  anything there (numbers that vary); a line that is only `...` stands for lines left out.
- Any other language (yaml, python): shown, not run. `<!-- file: PATH -->` right above
  such a block makes it a copy of that file of the repository (or a part of it, verbatim),
  checked here.

A marker that is not followed by a fenced block, a bash-like block in another language
(sh, shell, console) or a fence without a language is an error, so nothing is skipped
without saying so.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
TUTORIALS = REPO / "docs" / "tutorials"
IMAGES = TUTORIALS / "img"

CPU, DEVCLUSTER, NOT_RUN = "cpu", "devcluster", "not-run"
MARKER = re.compile(r"^<!--\s*(not-run|devcluster|file)\s*(?::\s*(.*?))?\s*-->\s*$")
FENCE = re.compile(r"^```(\S*)\s*$")
SHELL_LIKE = {"sh", "shell", "console", "shell-session", "zsh"}
# Per block: its commands may train for a while (a 5-fold sweep, a dev-cluster job).
BLOCK_TIMEOUT_S = 600


@dataclass
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: Optional[str] = None  # not-run | devcluster | file
    argument: str = ""  # the reason, or the file's path


@dataclass
class Step:
    block: Block
    expected: list[Block] = field(default_factory=list)

    @property
    def mode(self) -> str:
        return self.block.marker if self.block.marker in (NOT_RUN, DEVCLUSTER) else CPU


@dataclass
class Page:
    path: Path
    steps: list[Step]
    files: list[Block]  # blocks that copy a repository file
    images: list[str]  # paths of the pictures it embeds, relative to the page


class PageError(ValueError):
    pass


def pages() -> list[Path]:
    return sorted(TUTORIALS.glob("*.md"))


def parse(path: Path) -> Page:
    lines = path.read_text().splitlines()
    where = shown(path)
    blocks: list[Block] = []
    pending: Optional[tuple[int, str, str]] = None  # a marker waiting for its block
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = MARKER.match(line.strip())
        fence = FENCE.match(line)
        if marker:
            if pending:
                raise PageError(f"{where}:{pending[0]}: marker without a fenced block below")
            name, argument = marker.group(1), (marker.group(2) or "").strip()
            if name != DEVCLUSTER and not argument:
                raise PageError(f"{where}:{i + 1}: `{name}:` needs a reason or path")
            pending = (i + 1, name, argument)
        elif line.lstrip().startswith("```") and not fence:
            raise PageError(f"{where}:{i + 1}: a fence must start its line with ``` and a language")
        elif fence:
            lang = fence.group(1)
            if not lang:
                raise PageError(f"{where}:{i + 1}: give the fence a language (bash, text, yaml)")
            if lang in SHELL_LIKE:
                raise PageError(f"{where}:{i + 1}: ```{lang}: write commands as ```bash")
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
            if end is None:
                raise PageError(f"{where}:{i + 1}: fence never closed")
            block = Block(i + 1, lang, "\n".join(lines[i + 1 : end]) + "\n")
            if pending:
                block.marker, block.argument = pending[1], pending[2]
                pending = None
            blocks.append(block)
            i = end
        elif pending and line.strip():
            raise PageError(f"{where}:{pending[0]}: marker without a fenced block right below")
        i += 1
    if pending:
        raise PageError(f"{where}:{pending[0]}: marker without a fenced block below")
    return Page(path, *steps_of(blocks, where), images_of("\n".join(lines)))


def shown(path: Path) -> Path:
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def steps_of(blocks: list[Block], where: Path) -> tuple[list[Step], list[Block]]:
    steps: list[Step] = []
    files: list[Block] = []
    for block in blocks:
        if block.lang == "bash":
            if block.marker == "file":
                raise PageError(f"{where}:{block.line}: `file:` is for shown files, not commands")
            steps.append(Step(block))
        elif block.lang == "text":
            if block.marker is not None:
                raise PageError(f"{where}:{block.line}: markers go above the bash block")
            if not steps:
                raise PageError(f"{where}:{block.line}: expected output without a command above")
            steps[-1].expected.append(block)
        elif block.marker == "file":
            files.append(block)
        elif block.marker is not None:
            raise PageError(f"{where}:{block.line}: `{block.marker}` marks bash blocks only")
    return steps, files


def images_of(text: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)


# --------------------------------------------------------------------------- running
def environment(work: Path, extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The environment a reader's shell has after installing hpcdl: `hpcdl` and `python`
    on PATH (this checkout's, whatever PYTHONPATH a command sets), no terminal."""
    bin_dir = work.parent / f"{work.name}-bin"
    bin_dir.mkdir(exist_ok=True)
    prefix = f'export PYTHONPATH="{REPO}${{PYTHONPATH:+:$PYTHONPATH}}"'
    for name, run in (("hpcdl", "-m hpcdl.cli.main"), ("python", ""), ("python3", "")):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\n{prefix}\nexec "{sys.executable}" {run} "$@"\n')
        script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLUMNS", "LINES"))}
    # One torch thread a process: CI machines are small and shared, and several of a
    # page's processes (DDP ranks, sweep trials) run at once.
    env["OMP_NUM_THREADS"] = "1"
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return {**env, **(extra or {})}


@dataclass
class Ran:
    step: Step
    output: str
    returncode: int
    seconds: float


def run_steps(page: Page, mode: str, work: Path, env: dict[str, str]) -> list[Ran]:
    """The page's blocks of one mode, in order, in `work`; stops at the first failure."""
    done = []
    for step in page.steps:
        if step.mode != mode:
            continue
        started = time.monotonic()
        proc = subprocess.run(
            ["bash", "-e", "-c", step.block.text],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
        )
        done.append(Ran(step, proc.stdout, proc.returncode, time.monotonic() - started))
        if proc.returncode != 0:
            break
    return done


def problems(page: Page, ran: list[Ran]) -> list[str]:
    """What differs between the page and what its commands did: one entry per block."""
    where = shown(page.path)
    out = []
    for r in ran:
        first = r.step.block.text.strip().splitlines()[0]
        if r.returncode != 0:
            out.append(
                f"{where}:{r.step.block.line}: `{first}` ... exited {r.returncode}:\n{r.output}"
            )
            continue
        for expected in r.step.expected:
            missing = missing_lines(expected.text, r.output)
            if missing:
                out.append(
                    f"{where}:{expected.line}: not in the output of the block at line "
                    f"{r.step.block.line} (in this order): {missing}\n--- output:\n{r.output}"
                )
    return out


def normalized(line: str) -> str:
    return " ".join(line.split())


def line_pattern(expected: str) -> re.Pattern[str]:
    return re.compile(".*?".join(re.escape(part) for part in normalized(expected).split("...")))


def missing_lines(expected: str, output: str) -> list[str]:
    """The expected lines that no output line matches, each after the previous match."""
    lines = [normalized(x) for x in output.splitlines()]
    position, missing = 0, []
    for raw in expected.splitlines():
        if normalized(raw) in ("", "..."):
            continue
        pattern = line_pattern(raw)
        found = next((i for i in range(position, len(lines)) if pattern.fullmatch(lines[i])), None)
        if found is None:
            missing.append(raw)
        else:
            position = found + 1
    return missing
