"""`hpcdl bench devices [overrides]`: step time on the CPU and each GPU of this node."""

from __future__ import annotations

import argparse

from hpcdl.exit_codes import EXIT_OK


def add_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="measure this node: step time on the CPU and each GPU")
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


def cmd_bench(args: argparse.Namespace) -> int:
    from hpcdl.cli.compose import compose_config
    from hpcdl.devices import measure_devices, table
    from hpcdl.errors import ConfigError

    try:
        sizes = tuple(int(b) for b in args.batch_sizes.split(","))
    except ValueError:
        raise ConfigError(f"--batch-sizes {args.batch_sizes!r}: expected e.g. 32,1024") from None
    if not sizes or min(sizes) < 1 or args.steps < 1:
        raise ConfigError("--batch-sizes and --steps must be positive")
    cfg = compose_config(["cluster=debug", *args.overrides], args.config_dir)
    rows = measure_devices(cfg, sizes, steps=args.steps)
    print(table(rows, cfg.model.name, cfg.data.name, cfg.trainer.precision.value))
    return EXIT_OK
