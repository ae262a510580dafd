"""One-line messages as users meet them: a sweep value without -m, counts in words."""

from __future__ import annotations

from pathlib import Path


def test_a_comma_list_without_m_names_the_override_and_says_add_m(hpcdl, tmp_path: Path) -> None:
    cases = [
        (
            ["train", "optim.lr=0.1,0.01"],
            "error: optim.lr=0.1,0.01: several values are a sweep: add -m for one run per "
            "value; for one value, quote it: \"optim.lr='0.1,0.01'\" or write a list: "
            "optim.lr=[0.1,0.01]",
        ),
        # A group's options: no string to quote.
        (["train", "model=mlp,cnn"], "error: model=mlp,cnn: several values are a sweep: add -m"),
        (["train", "optim.lr=range(1,3)"], "error: optim.lr=range(1,3): several values"),
        # hpcdl run -m sweeps the program's command only: -m would not help.
        (
            ["run", "cluster.gpus_per_node=1,2", "--", "echo", "hi"],
            "error: cluster.gpus_per_node=1,2: hpcdl run takes one value per key (its -m "
            "sweeps only the lists in the command after --",
        ),
    ]
    for args, expected in cases:
        out = hpcdl(*args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(expected), (args, out.stderr)
        if args[0] == "train":
            assert lines[0].endswith(("add -m for one run per value", "[0.1,0.01]")), lines
    assert list(tmp_path.iterdir()) == []
