"""A process whose DataLoader iteration ended in an error exits: its workers, which ignore
SIGTERM, are stopped at exit instead of being waited for forever."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import torch
    from hpcdl.data.loader import LoaderSettings, dataset_batches, dataset_eval_batches
    from hpcdl.data.sharding import EpochSharder


    class Broken(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            if i == 40:
                raise ValueError("sample 40 is broken")
            return torch.zeros(2), 0


    settings = LoaderSettings(num_workers=2, prefetch_factor=2, collate_fn=None, seed=0)
    kept = []  # the errors' tracebacks keep the loaders' iterators, and their workers, alive
    sharder = EpochSharder(64, 8, 0, 1, 0)
    for batches in (
        lambda: dataset_batches(Broken(), sharder, 1, 0, torch.device("cpu"), settings),
        lambda: dataset_eval_batches(Broken(), 0, 1, 8, torch.device("cpu"), settings),
    ):
        try:
            for _ in batches():
                pass
        except ValueError as exc:
            kept.append(exc)
    print("errors:", len(kept), flush=True)
    """
)


def test_a_process_exits_after_a_loader_error(tmp_path: Path) -> None:
    script = tmp_path / "broken_loader.py"
    script.write_text(SCRIPT)
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,  # before the fix: it hung at exit, in multiprocessing's join
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "errors: 2"
    assert "Exception ignored" not in done.stderr and "killed by signal" not in done.stderr
