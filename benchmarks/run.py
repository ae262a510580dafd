"""python -m benchmarks.run [--all [--cluster] | NAME ...] [--smoke] [--repeats N] [--threads N] [--out DIR]

Runs the named benchmarks (--list shows them) and writes their rows, with the machine and
versions, to DIR/<date>-<host>-<device>[-smoke].{json,md} (DIR: benchmarks/results),
rewritten after each benchmark ("finished": false until the last is done). hpcdl's console
output goes to a log in a scratch folder, shown if a benchmark fails; the others still run,
and the exit status is then 1 ("failed" lists them).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from benchmarks.base import Row, Settings
from benchmarks.registry import ALL_BENCHMARKS, BENCHMARKS, CLUSTER_BENCHMARKS
from benchmarks.report import (
    RESULTS_DIR,
    free_stem,
    git_state,
    machine,
    result_stem,
    versions,
    write_results,
)

DEFAULT_REPEATS = 5
LOG_TAIL_LINES = 40


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description="hpcdl's benchmarks: ratios against a baseline measured in the same run.",
    )
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"one of {', '.join(ALL_BENCHMARKS)}"
    )
    parser.add_argument("--all", action="store_true", help="every benchmark on this machine")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help=f"with --all, the dev-cluster ones too ({', '.join(CLUSTER_BENCHMARKS)})",
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes, one round: checks that they run (CI)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=f"measured rounds after the warm-up round (default {DEFAULT_REPEATS}; 1 with --smoke)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads in this process (default 1: on a shared machine other "
        "jobs then slow hpcdl and its baseline alike, instead of stalling OpenMP barriers)",
    )
    parser.add_argument(
        "--out", type=Path, default=RESULTS_DIR, help="folder for the results (default %(default)s)"
    )
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in ALL_BENCHMARKS]
    if unknown:
        choices = ", ".join(ALL_BENCHMARKS)
        parser.error(f"unknown benchmark {', '.join(unknown)}; choose from {choices}")
    if not args.list and not args.all and not args.names:
        parser.error("name the benchmarks to run, or pass --all (--list shows them)")
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: must be >= 1")
    if args.threads < 1:
        parser.error(f"--threads {args.threads}: must be >= 1")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.list:
        list_benchmarks()
        return 0
    import torch

    torch.set_num_threads(args.threads)
    everything = ALL_BENCHMARKS if args.cluster else BENCHMARKS
    names = list(everything) if args.all else list(dict.fromkeys(args.names))
    repeats = args.repeats or (1 if args.smoke else DEFAULT_REPEATS)
    # A smoke run only checks that the code runs: no warm-up round to throw away.
    warmup_rounds = 0 if args.smoke else 1
    now = dt.datetime.now(dt.timezone.utc).astimezone()
    started, load_at_start = time.monotonic(), load_average()
    info = machine()
    record: dict[str, Any] = {
        "date": now.isoformat(timespec="seconds"),
        "machine": info,
        "versions": versions(),
        "git": git_state(),
        "command": shlex.join(["python", "-m", "benchmarks.run", *argv]),
        "smoke": args.smoke,
        "benchmarks": names,
        "repeats": repeats,
        "warmup_rounds": warmup_rounds,
    }
    stem = free_stem(args.out, result_stem(now, info["host"], info["device"], args.smoke))

    def write(rows: list[Row], failed: list[str], done: bool) -> Path:
        """The results so far, rewritten after each benchmark: a run killed at a time limit
        (a GPU session's call) still leaves every benchmark that had finished."""
        written = {
            **record,
            "finished": done,
            "failed": failed,
            "load_average": {"start": load_at_start, "end": load_average()},
            "wall_s": round(time.monotonic() - started, 1),
        }
        return write_results(args.out, stem, written, rows)

    rows, failed = run_benchmarks(names, args.smoke, repeats, warmup_rounds, write)
    path = write(rows, failed, done=True)
    print(f"wrote {path} and {path.with_suffix('.md').name}")
    if failed:
        print(f"failed: {' '.join(failed)} (the other benchmarks' rows are written)", file=sys.stderr)
        return 1
    return 0


def list_benchmarks() -> None:
    for name, fn in ALL_BENCHMARKS.items():
        doc = (sys.modules[fn.__module__].__doc__ or "").strip().splitlines()
        print(f"{name:14s} {doc[0] if doc else ''}")


def run_benchmarks(
    names: list[str],
    smoke: bool,
    repeats: int,
    warmup_rounds: int,
    write: Callable[[list[Row], list[str], bool], Path],
) -> tuple[list[Row], list[str]]:
    """Each benchmark in turn, in a scratch folder deleted afterwards; the results are
    written after each. A failing benchmark is reported (its traceback, hpcdl's log tail)
    and the next one runs. Returns the rows and the names of the benchmarks that failed."""
    rows: list[Row] = []
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="hpcdl-bench-") as scratch:
        log_path = Path(scratch) / "hpcdl.log"
        with open(log_path, "w") as log:
            for name in names:
                settings = Settings(smoke, repeats, warmup_rounds, Path(scratch) / name, log)
                print(f"{name}: {repeats} rounds after {warmup_rounds} warm-up", flush=True)
                began = time.monotonic()
                try:
                    found = ALL_BENCHMARKS[name](settings)
                except Exception:
                    log.flush()
                    traceback.print_exc()
                    tail = log_path.read_text().splitlines()[-LOG_TAIL_LINES:]
                    print(f"{name} failed; hpcdl's log ends:", *tail, sep="\n", file=sys.stderr)
                    failed.append(name)
                    write(rows, failed, False)
                    continue
                for row in found:
                    goal = "" if row.goal is None else f" (goal <= {row.goal:.2f})"
                    print(f"  {row.id}: {row.ratio:.3f}{goal}", flush=True)
                print(f"  {time.monotonic() - began:.0f} s", flush=True)
                rows.extend(found)
                write(rows, failed, False)
    return rows, failed


def load_average() -> Optional[list[float]]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


if __name__ == "__main__":
    sys.exit(main())
