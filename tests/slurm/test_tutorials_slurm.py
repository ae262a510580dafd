"""The tutorial pages' dev-cluster blocks (`<!-- devcluster -->`), run for real on
slurm/devcluster and checked against the output the pages show (tests/tutorial_pages.py).
The pages' other blocks run in tests/test_tutorials.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tutorial_pages import DEVCLUSTER, environment, pages, parse, problems, run_steps

pytestmark = pytest.mark.slurm

PAGES = [p.name for p in pages() if any(s.mode == DEVCLUSTER for s in parse(p).steps)]


def test_some_page_has_dev_cluster_blocks() -> None:
    assert PAGES, "no tutorial block runs on the dev cluster any more: drop this file"


@pytest.mark.parametrize("name", PAGES)
def test_tutorial_dev_cluster_commands(devcluster, name: str, tmp_path: Path) -> None:
    page = next(parse(p) for p in pages() if p.name == name)
    work = tmp_path / "work"
    work.mkdir()
    env = environment(work, {"SLURM_CONF": devcluster.slurm_conf})
    ran = run_steps(page, DEVCLUSTER, work, env)
    found = problems(page, ran)
    assert not found, "\n\n".join(found)
    assert len(ran) == sum(s.mode == DEVCLUSTER for s in page.steps)
