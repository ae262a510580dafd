"""Run directories: decided once, at submit time, and stored in the resolved config.

Stdlib + config only (no torch): used on the login node.
"""

from __future__ import annotations

import datetime as dt
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from hpcdl.config.convert import load_config, save_config
from hpcdl.config.schema import Config, Launcher
from hpcdl.errors import RunDirError

CONFIG_FILE = "config.yaml"


def default_run_dir(now: dt.datetime | None = None) -> Path:
    now = now or dt.datetime.now()
    return Path("outputs") / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S")


def create_run_dir(cfg: Config, *, snapshot: bool = True) -> tuple[Config, Path]:
    """Make a fresh run dir and write the resolved config; refuse to reuse an existing one.
    Slurm runs also get a frozen copy of the code (snapshot=False: the caller shares one)."""
    if cfg.run_dir is None:
        path = default_run_dir().resolve()
        suffix = 1
        base = path
        while path.exists():  # two runs started in the same second
            path = base.with_name(f"{base.name}-{suffix}")
            suffix += 1
    else:
        path = Path(cfg.run_dir).expanduser().resolve()
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise RunDirError(
                f"run_dir={cfg.run_dir!r} already exists; continue it with `hpcdl resume {cfg.run_dir}` "
                "or choose a new run_dir"
            )
    path.mkdir(parents=True, exist_ok=True)
    cfg = replace(cfg, run_dir=str(path))
    save_config(cfg, path / CONFIG_FILE)
    record_command(path, "train")
    if snapshot and cfg.cluster.launcher == Launcher.slurm:
        from hpcdl.launch.slurm import custom_targets, snapshot_code

        snapshot_code(path, custom_targets(cfg))
    return cfg, path


def open_run_dir(run_dir: str) -> tuple[Config, Path]:
    path = Path(run_dir).expanduser().resolve()
    if not (path / CONFIG_FILE).is_file():
        raise RunDirError(
            f"{run_dir}: not an hpcdl run dir (no {CONFIG_FILE}); pass the run_dir of a run"
        )
    return load_config(path / CONFIG_FILE), path


def rewrite_config(cfg: Config, path: Path) -> Config:
    cfg = replace(cfg, run_dir=str(path))
    save_config(cfg, path / CONFIG_FILE)
    return cfg


def record_command(path: Path, verb: str) -> None:
    stamp = dt.datetime.now().isoformat(timespec="seconds")
    with open(path / "commands.log", "a") as f:
        f.write(f"{stamp} {verb}: {shlex.join(sys.argv)}\n")
