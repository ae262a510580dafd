"""Results on disk: the machine and versions, the rows, as JSON and as a markdown table."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import platform
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.base import Row

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks" / "results"


def machine() -> dict[str, Any]:
    import torch

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "host": socket.gethostname().split(".")[0],
        "cpu_model": cpu_model(),
        "num_cpus": os.cpu_count(),
        "num_cpus_usable": usable,
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
    }


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    match = re.search(r"^model name\s*:\s*(.+)$", text, flags=re.M)
    return match.group(1).strip() if match else platform.machine()


def versions() -> dict[str, str]:
    import numpy
    import torch

    try:
        hpcdl_version = importlib.metadata.version("hpcdl")
    except importlib.metadata.PackageNotFoundError:
        hpcdl_version = "unknown"
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "hpcdl": hpcdl_version,
    }


def git_state() -> dict[str, Any]:
    """The revision, and the files that differ from it (results of a dirty tree say so)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        return done.stdout if done.returncode == 0 else ""

    revision = git("rev-parse", "HEAD").strip() or None
    # Porcelain lines are "XY PATH": two status letters (either may be a space), a space.
    changed = [line[3:] for line in git("status", "--porcelain").splitlines() if line]
    return {"revision": revision, "dirty": bool(changed), "changed": changed}


def result_stem(now: dt.datetime, host: str, device: str, smoke: bool) -> str:
    safe_host = re.sub(r"[^A-Za-z0-9_-]+", "-", host) or "host"
    return f"{now:%Y-%m-%d}-{safe_host}-{device}" + ("-smoke" if smoke else "")


def free_stem(out_dir: Path, stem: str) -> str:
    """`stem`, or stem-2, stem-3, ... when results of that name are already there."""
    candidate, number = stem, 1
    while (out_dir / f"{candidate}.json").exists() or (out_dir / f"{candidate}.md").exists():
        number += 1
        candidate = f"{stem}-{number}"
    return candidate


def row_dict(row: Row) -> dict[str, Any]:
    return {
        "id": row.id,
        "what": row.what,
        "baseline": row.baseline,
        "ratio": round(row.ratio, 4),
        "goal": row.goal,
        "meets_goal": row.meets_goal,
        "details": row.details,
    }


def write_results(out_dir: Path, stem: str, record: dict[str, Any], rows: list[Row]) -> Path:
    """<stem>.json and <stem>.md in out_dir; returns the JSON path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {**record, "rows": [row_dict(r) for r in rows]}
    json_path = out_dir / f"{stem}.json"
    json_path.write_text(json.dumps(record, indent=2) + "\n")
    (out_dir / f"{stem}.md").write_text(markdown(record))
    return json_path


def _incomplete(record: dict[str, Any]) -> list[str]:
    """The line saying which benchmarks failed or had not run yet (records written before
    2026-11-25 have neither key: complete)."""
    failed = record.get("failed") or []
    missing = [
        n for n in record["benchmarks"] if n not in failed and not any(
            row["id"].split(".")[0] == n for row in record["rows"]
        )
    ]
    notes = []
    if failed:
        notes.append(f"failed: {', '.join(failed)}")
    if not record.get("finished", True) and missing:
        notes.append(f"not run yet when this was written: {', '.join(missing)}")
    return [f"- **incomplete**: {'; '.join(notes)}"] if notes else []


def markdown(record: dict[str, Any]) -> str:
    m, v, g = record["machine"], record["versions"], record["git"]
    revision = (g["revision"] or "unknown")[:12] + (" (dirty tree)" if g["dirty"] else "")
    lines = [
        f"# Benchmarks {record['date']}{' (smoke: tiny sizes, not a measurement)' if record['smoke'] else ''}",
        "",
        f"- machine: {m['host']}, {m['cpu_model']}, {m['num_cpus_usable']} usable CPUs, "
        f"torch threads {m['torch_threads']}, device {m['device']}"
        + (f" ({m['gpu']})" if m["gpu"] else ""),
        f"- versions: python {v['python']}, torch {v['torch']}, numpy {v['numpy']}, "
        f"hpcdl {v['hpcdl']}, git {revision}",
        f"- command: `{record['command']}`; {record['repeats']} measured rounds after "
        f"{record['warmup_rounds']} warm-up round(s), interleaved; "
        f"load average {record['load_average']['start']} at the start, "
        f"{record['load_average']['end']} at the end",
        *_incomplete(record),
        "",
        "Ratio: the median over rounds of hpcdl / baseline, both measured in the same round "
        "(lower is better; 1.0 = as fast). Round ratios: the lowest and highest round. "
        "The seconds are medians over rounds.",
        "",
        "| id | ratio | goal | hpcdl (median) | baseline (median) | round ratios |",
        "|---|---|---|---|---|---|",
    ]
    for row in record["rows"]:
        d = row["details"]
        goal = (
            "-"
            if row["goal"] is None
            else f"<= {row['goal']:.2f}" + (" ok" if row["meets_goal"] else " missed")
        )
        spread = d.get("round_ratios") or []
        spread_text = f"{min(spread):.2f}-{max(spread):.2f}" if spread else "-"
        lines.append(
            f"| {row['id']} | {row['ratio']:.3f} | {goal} | {seconds(d.get('measured_s'))} "
            f"| {seconds(d.get('baseline_s'))} | {spread_text} |"
        )
    lines += ["", "What each row times (hpcdl / baseline):", ""]
    lines += [f"- {row['id']}: {row['what']} / {row['baseline']}" for row in record["rows"]]
    lines.append("")
    return "\n".join(lines)


def seconds(summary: Any) -> str:
    if not isinstance(summary, dict) or "median" not in summary:
        return "-"
    value = summary["median"]
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"
