"""summary.json's wall time: `wall_s` the last attempt's, `wall_s_total` every attempt's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_hpcdl


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def test_wall_s_total_adds_the_earlier_attempts_up_to_their_last_checkpoint(
    tmp_path: Path,
) -> None:
    out = run_hpcdl("train", "run_dir=run", "trainer.max_epochs=1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    run = tmp_path / "run"
    first = read(run / "summary.json")
    assert first["wall_s_total"] == first["wall_s"]  # one attempt
    # What the first attempt's last checkpoint records: its wall time up to that save.
    saved = read(run / "checkpoint.json")["progress"]["wall_s"]
    assert 0 < saved <= first["wall_s"]
    out = run_hpcdl("resume", "run", "trainer.max_epochs=2", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    second = read(run / "summary.json")
    assert second["epochs"] == 2
    assert second["wall_s_total"] == pytest.approx(saved + second["wall_s"], abs=1e-9)
    assert second["wall_s_total"] > second["wall_s"]
