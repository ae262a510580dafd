"""A custom model's (data's, task's) kwargs checked against the callable's source on the
login node, where none of the user's code is imported: a key it cannot take is refused
before the Slurm job waits in the queue to find it out; where the source does not tell for
certain, nothing is refused (the job checks the real signature)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.errors import ConfigError
from hpcdl.launch.static_kwargs import refuse_unknown_kwargs, static_signature

NETS = """\
import dataclasses
import functools
from torch import nn


class Net(nn.Module):
    def __init__(self, in_features=8, width=16, *, depth=2):
        super().__init__()


class Inherits(Net):
    pass


class Open(nn.Module):
    def __init__(self, width, **extra):
        super().__init__()


@dataclasses.dataclass
class Config:
    width: int = 3


def build(width, /, dropout=0.1):
    return Net(width=width)


@functools.lru_cache
def cached(width):
    return Net(width=width)


try:
    def guarded(size):
        return Net(width=size)
except ImportError:
    guarded = None

alias = build

if __name__ == "__main__":
    print(Net())
"""


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    package = tmp_path / "sklab_pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('never imported')\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "nets.py").write_text(NETS)
    (tmp_path / "sklab_mod.py").write_text(NETS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def names(target: str) -> list[str] | None:
    signature = static_signature(target)
    return None if signature is None else list(signature.parameters)


def test_parameters_are_read_from_the_source_without_importing_it(lab: Path) -> None:
    assert names("sklab_pkg.sub.nets:Net") == ["in_features", "width", "depth"]
    assert names("sklab_mod:Net") == ["in_features", "width", "depth"]
    assert names("sklab_mod:Open") == ["width", "extra"]
    assert names("sklab_mod:build") == ["width", "dropout"]
    # Not told for certain by the source: left to the job.
    for name in ("Inherits", "Config", "cached", "guarded", "alias", "missing"):
        assert names(f"sklab_mod:{name}") is None, name
    assert names("sklab_pkg.sub.absent:Net") is None
    assert names("numpy:zeros") is None  # installed: not the user's
    with pytest.raises(RuntimeError):  # the package really would have raised if imported
        __import__("sklab_pkg")


def test_a_key_the_callable_cannot_take_is_refused_in_the_jobs_own_words(lab: Path) -> None:
    with pytest.raises(ConfigError) as info:
        refuse_unknown_kwargs("model", "sklab_pkg.sub.nets:Net", {"widht": 8, "depth": 3})
    assert str(info.value) == (
        "model.target='sklab_pkg.sub.nets:Net': Net takes no model.kwargs.widht; its "
        "parameters: in_features, width, depth"
    )
    refuse_unknown_kwargs("model", "sklab_mod:Open", {"anything": 1})  # **extra takes it
    refuse_unknown_kwargs("model", "sklab_mod:Inherits", {"widht": 1})  # the job decides
    with pytest.raises(ConfigError, match=r"build takes no data\.kwargs\.size"):
        refuse_unknown_kwargs("data", "sklab_mod:build", {"size": 1})


def test_a_slurm_submit_and_its_dry_run_refuse_the_key(hpcdl, lab: Path) -> None:
    model = ["model=custom", "model.target=sklab_mod:Net", "model.kwargs.widht=8"]
    env = {"PYTHONPATH": str(lab)}
    for how in (["--dry-run"], ["-m", "optim.lr=0.1,0.01", "--dry-run"], ["--no-preflight"]):
        out = hpcdl("train", "cluster=rivanna_a100", *model, *how, "--no-preflight", env=env)
        assert out.returncode == 2, out.stdout + out.stderr
        assert (
            "model.target='sklab_mod:Net': Net takes no model.kwargs.widht; its "
            "parameters: in_features, width, depth\n"
        ) in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert not list(lab.glob("outputs")) and not list(lab.glob("multirun"))  # nothing made


def test_a_name_its_module_never_binds_is_named_with_the_close_one(lab: Path) -> None:
    """model.target=mybio.models:Regg went to Slurm and failed on every node of a sweep's
    array (persona, sweeps): the source binds no Regg."""
    from hpcdl.launch.static_kwargs import unbound_name

    nets = lab / "sklab_pkg" / "sub" / "nets.py"
    assert unbound_name("sklab_pkg.sub.nets:Nett") == (
        f"{nets} has no 'Nett'; did you mean sklab_pkg.sub.nets:Net?"
    )
    for bound in ("Net", "guarded", "alias", "nn", "functools"):  # def, try, assignment, import
        assert unbound_name(f"sklab_pkg.sub.nets:{bound}") is None
    (lab / "starry.py").write_text("from sklab_mod import *\n")
    (lab / "lazy.py").write_text("def __getattr__(name):\n    return name\n")
    for module in ("starry", "lazy"):  # may bind any name: left to the job
        assert unbound_name(f"{module}:Anything") is None
    assert unbound_name("json:nothing_there") is None  # not the user's code
