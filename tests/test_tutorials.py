"""Every tutorial page's commands run for real, here on the CPU, and print what the page
shows (tests/tutorial_pages.py: how a page marks its blocks). The dev-cluster blocks run
in the slurm tier (tests/slurm/test_tutorials_slurm.py)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from tests.tutorial_pages import (
    CPU,
    IMAGES,
    NOT_RUN,
    REPO,
    TUTORIALS,
    PageError,
    environment,
    missing_lines,
    pages,
    parse,
    problems,
    run_steps,
)

PAGES = [p.name for p in pages()]
# Pages whose commands make no picture; every other page shows one from a real run.
NO_PICTURE = {
    "index.md": "the list of tutorials",
    "04-cpu-vs-gpu.md": "hpcdl bench devices prints a table, which the page shows",
}


def write_mnist_stand_in(folder: Path) -> None:
    """The four MNIST IDX files, made from scikit-learn's bundled digits (8x8, 0..16):
    each pixel as a 3x3 block, padded to 28x28, 0..255; 1500 training and 297 test
    images. The real files are 55 MB and not downloadable here."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.kron(digits.images, np.ones((3, 3))) * (255 / 16)
    images = np.pad(images, ((0, 0), (2, 2), (2, 2))).round().astype(np.uint8)
    labels = digits.target.astype(np.uint8)
    folder.mkdir(parents=True)
    parts = {"train": slice(0, 1500), "t10k": slice(1500, None)}
    for prefix, part in parts.items():
        for kind, array in (("images-idx3", images[part]), ("labels-idx1", labels[part])):
            header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
                int(n).to_bytes(4, "big") for n in array.shape
            )
            with gzip.open(folder / f"{prefix}-{kind}-ubyte.gz", "wb") as f:
                f.write(header + array.tobytes())


def test_the_pages_are_well_formed_and_every_block_is_run_or_marked() -> None:
    index = (TUTORIALS / "index.md").read_text()
    assert PAGES, "no tutorial pages"
    for path in pages():
        page = parse(path)
        assert path.name == "index.md" or f"({path.name})" in index, f"index.md lacks {path.name}"
        modes = [s.mode for s in page.steps]
        assert CPU in modes, f"{path.name}: no command that runs here"
        for step in page.steps:
            if step.mode == NOT_RUN:
                assert len(step.block.argument) > 5, f"{path.name}:{step.block.line}: say why"
        for image in page.images:
            assert (path.parent / image).is_file(), f"{path.name}: missing picture {image}"
            assert (path.parent / image).resolve().parent == IMAGES
        assert bool(page.images) != (path.name in NO_PICTURE), f"{path.name}: pictures"
        for block in page.files:
            source = REPO / block.argument
            assert source.is_file(), f"{path.name}:{block.line}: no file {block.argument}"
            assert block.text in source.read_text(), (
                f"{path.name}:{block.line}: the block is no longer a copy of {block.argument}"
            )


def test_every_picture_in_img_is_shown_on_a_page() -> None:
    shown = {(TUTORIALS / i).resolve() for p in pages() for i in parse(p).images}
    for png in IMAGES.glob("*.png"):
        assert png.resolve() in shown, f"{png.name} is embedded nowhere"


@pytest.mark.parametrize(
    ("expected", "output", "missing"),
    [
        ("a 1\n...\nc ...\n", "a 1\nb\nc 3.14\n", []),
        ("a 1\nc ...\n", "c 3\na 1\n", ["c ..."]),  # in order
        ("x:   1   2\n", "  x: 1 2  \n", []),  # runs of spaces
        ("run dir: .../r\n", "run dir: /tmp/x/r2\n", ["run dir: .../r"]),  # whole lines
        ("acc 0.9...\n", "acc 0.87\n", ["acc 0.9..."]),
    ],
)
def test_expected_output_matching(expected: str, output: str, missing: list[str]) -> None:
    assert missing_lines(expected, output) == missing


def test_a_marker_without_a_block_and_an_unmarked_shell_block_are_refused(tmp_path) -> None:
    for text, message in [
        ("<!-- not-run: needs a GPU -->\nsome prose\n```bash\nls\n```\n", "marker without"),
        ("```console\n$ ls\n```\n", "write commands as ```bash"),
        ("<!-- not-run -->\n```bash\nls\n```\n", "needs a reason"),
        ("```text\nx\n```\n", "without a command above"),
        ("```\nls\n```\n", "give the fence a language"),
    ]:
        page = tmp_path / "page.md"
        page.write_text(text)
        with pytest.raises(PageError, match=message):
            parse(page)


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("mnist") / "mnist"
    write_mnist_stand_in(folder)
    return folder


@pytest.mark.parametrize("name", PAGES)
def test_tutorial_commands_run_and_print_what_the_page_shows(
    name: str, tmp_path: Path, mnist_dir: Path
) -> None:
    page = parse(TUTORIALS / name)
    work = tmp_path / "work"
    work.mkdir()
    env = environment(work, {"MNIST_DIR": str(mnist_dir)})
    ran = run_steps(page, CPU, work, env)
    found = problems(page, ran)
    assert not found, "\n\n".join(found)
    assert len(ran) == sum(s.mode == CPU for s in page.steps)
    for r in ran:
        print(f"{name}:{r.step.block.line}: {r.seconds:.1f}s")
    CHECKS.get(name, lambda _: None)(work)


def check_cancer_mlp(work: Path) -> None:
    """The workshop's figure: at least 0.95 test accuracy, final weights and best.pt."""
    summary = json.loads((work / "runs/cancer/summary.json").read_text())
    best = json.loads((work / "runs/cancer/eval/best/metrics.json").read_text())
    assert summary["test_accuracy"] >= 0.95, summary
    assert best["test_accuracy"] >= 0.95, best
    assert summary["early_stopped"] and summary["best_metric_name"] == "val_loss"


CHECKS = {"01-mlp-breast-cancer.md": check_cancer_mlp}
