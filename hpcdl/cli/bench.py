"""`hpcdl bench devices|overhead [overrides]`: measure this node.

devices: step time on the CPU and each GPU of this node.
overhead: hpcdl's training loop against loops doing the same work without it (a
hand-written one, a DataLoader(TensorDataset) one and, when installed, Lightning's). It
runs the benchmark suite's code (benchmarks/overhead.py), which comes with hpcdl's source
tree, not with an installed wheel.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
from pathlib import Path
from typing import Any

from hpcdl.errors import ConfigError, HpcdlError, plural
from hpcdl.exit_codes import EXIT_OK

# hpcdl/cli/bench.py -> the source tree that holds benchmarks/ next to hpcdl/
SOURCE_TREE = Path(__file__).resolve().parents[2]
LOG_TAIL_LINES = 30


def add_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser(
        "bench", help="measure this node: step time per device, or hpcdl's loop overhead"
    )
    kinds = bench.add_subparsers(dest="bench_command", required=True)
    devices = kinds.add_parser(
        "devices", help="the course's table: step time, samples/s and speedup over the CPU"
    )
    devices.add_argument("overrides", nargs="*", help="e.g. model=cnn data=digits")
    devices.add_argument("--config-dir", "-cd", action="append", default=[])
    devices.add_argument(
        "--batch-sizes", default="32,1024", help="comma-separated (default: 32,1024)"
    )
    devices.add_argument("--steps", type=int, default=20, help="steps per timed block")

    overhead = kinds.add_parser(
        "overhead",
        help="hpcdl's loop vs a hand-written loop, a DataLoader loop and Lightning: same work",
    )
    overhead.add_argument(
        "overrides", nargs="*", help="e.g. model=cnn data=digits trainer.precision=bf16"
    )
    overhead.add_argument(
        "--epochs", type=int, default=4, help="epochs a run, the first not counted (default 4)"
    )
    overhead.add_argument(
        "--repeats", type=int, default=3, help="measured rounds, each loop once (default 3)"
    )
    overhead.add_argument(
        "--warmup-rounds", type=int, default=1, help="rounds run first and dropped (default 1)"
    )
    overhead.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1, as the benchmark suite: on a shared node "
        "other jobs then slow every loop alike, instead of stalling OpenMP barriers)",
    )


def cmd_bench(args: argparse.Namespace) -> int:
    if args.bench_command == "overhead":
        return cmd_overhead(args)
    return cmd_devices(args)


def cmd_devices(args: argparse.Namespace) -> int:
    from hpcdl.cli.compose import compose_config
    from hpcdl.devices import measure_devices, no_gpu_note, table

    try:
        sizes = tuple(int(b) for b in args.batch_sizes.split(","))
    except ValueError:
        raise ConfigError(f"--batch-sizes {args.batch_sizes!r}: expected e.g. 32,1024") from None
    if not sizes or min(sizes) < 1 or args.steps < 1:
        raise ConfigError("--batch-sizes and --steps must be positive")
    cfg = compose_config(["cluster=debug", *args.overrides], args.config_dir)
    rows = measure_devices(cfg, sizes, steps=args.steps)
    print(table(rows, cfg.model.name, cfg.data.name, cfg.trainer.precision.value))
    note = no_gpu_note()
    if note is not None:
        print(note, file=sys.stderr)
    return EXIT_OK


def cmd_overhead(args: argparse.Namespace) -> int:
    if args.epochs < 3:
        raise ConfigError(f"--epochs {args.epochs}: at least 3 (1 warm-up, 2 measured)")
    if args.repeats < 1 or args.warmup_rounds < 0:
        raise ConfigError("--repeats must be >= 1 and --warmup-rounds >= 0")
    if args.threads < 1:
        raise ConfigError(f"--threads {args.threads}: must be >= 1")
    from hpcdl.cli.compose import compose_config

    cfg = compose_config(["cluster=debug", *args.overrides])  # a bad override fails here
    suite_module("loops").check_comparable(cfg)  # before torch's import: fails fast
    overhead = suite_module("overhead")
    lightning_loop = suite_module("lightning_loop")
    base = suite_module("base")
    import torch

    torch.set_num_threads(args.threads)
    case = overhead.Case("cli", tuple(args.overrides), args.epochs)
    with_lightning = lightning_loop.version() is not None
    with tempfile.TemporaryDirectory(prefix="hpcdl-bench-") as scratch:
        log_path = Path(scratch) / "hpcdl.log"
        with open(log_path, "w") as log:
            settings = base.Settings(
                False, args.repeats, args.warmup_rounds, Path(scratch) / "overhead", log
            )
            settings.work_dir.mkdir()
            try:
                measured = overhead.measure(case, settings, with_lightning)
            except Exception as exc:
                if not isinstance(exc, HpcdlError):  # a bug, not a bad override: show the log
                    log.flush()
                    tail = log_path.read_text().splitlines()[-LOG_TAIL_LINES:]
                    print("hpcdl's log ends:", *tail, sep="\n", file=sys.stderr)
                raise
    print(title(cfg, measured, args))
    print(overhead.table(measured))
    if not with_lightning:
        print(lightning_loop.NOT_INSTALLED)
    return EXIT_OK


def title(cfg: Any, measured: Any, args: argparse.Namespace) -> str:
    import torch

    device = measured.device
    if device == "cpu":
        threads = torch.get_num_threads()
        device += f" ({plural(threads, 'thread')})"
    return (
        f"model={cfg.model.name} data={cfg.data.name} precision={cfg.trainer.precision.value} "
        f"batch {cfg.trainer.batch_size} "
        f"({plural(measured.num_steps_per_epoch, 'step')} an epoch), "
        f"{device}; {plural(args.repeats, 'round')} after {args.warmup_rounds} warm-up, "
        f"{args.epochs} epochs a run, the first not counted\n"
        "epoch: first to last step of an epoch, without its end (validation, checkpoint); "
        "time / hpcdl's: the median over rounds of this loop's epoch / hpcdl's"
    )


def suite_module(name: str) -> Any:
    """benchmarks.<name> from hpcdl's source tree (the suite is not part of the package)."""
    if not (SOURCE_TREE / "benchmarks" / "overhead.py").is_file():
        raise ConfigError(
            "hpcdl bench overhead runs benchmarks/overhead.py from hpcdl's source tree, which "
            "this installation lacks: clone hpcdl and `pip install -e '.[bench]'` there"
        )
    if str(SOURCE_TREE) not in sys.path:
        sys.path.insert(0, str(SOURCE_TREE))
    return importlib.import_module(f"benchmarks.{name}")
