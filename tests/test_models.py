"""Models: output shapes, the workshop MLP's layers, CIFAR ResNet-18, custom targets, errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hpcdl.config import schema
from hpcdl.errors import ConfigError
from hpcdl.models import build_model


def linear_sizes(model: nn.Module) -> list[tuple[int, int]]:
    return [(m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear)]


def test_mlp_default_is_the_workshop_network():
    model = build_model(schema.MlpConfig(), (30,), 2)
    assert linear_sizes(model) == [(30, 30), (30, 60), (60, 2)]
    dropouts = [m.p for m in model.modules() if isinstance(m, nn.Dropout)]
    assert dropouts == [0.5, 0.5]
    assert build_model(schema.MlpConfig(), (30,), 2)(torch.randn(5, 30)).shape == (5, 2)


def test_mlp_flattens_images_and_allows_no_hidden_layer():
    model = build_model(schema.MlpConfig(hidden_sizes=[16]), (1, 8, 8), 10)
    assert model(torch.randn(3, 1, 8, 8)).shape == (3, 10)
    assert linear_sizes(build_model(schema.MlpConfig(hidden_sizes=[]), (4,), 3)) == [(4, 3)]


@pytest.mark.parametrize(
    ("input_shape", "channels", "kernel_size"),
    [
        ((1, 8, 8), [32, 64], 3),
        ((3, 32, 32), [8, 8, 8], 5),
        ((1, 2, 2), [4, 4, 4], 3),
        ((1, 7, 5), [4], 2),
    ],
)
def test_cnn_output_shapes(input_shape, channels, kernel_size):
    cfg = schema.CnnConfig(channels=channels, kernel_size=kernel_size, hidden_size=16)
    model = build_model(cfg, input_shape, 10)
    assert model(torch.randn(2, *input_shape)).shape == (2, 10)


def test_cnn_default_on_digits_pools_8x8_to_2x2():
    model = build_model(schema.CnnConfig(), (1, 8, 8), 10)
    assert linear_sizes(model) == [(64 * 2 * 2, 128), (128, 10)]
    assert sum(isinstance(m, nn.MaxPool2d) for m in model.modules()) == 2


def test_resnet18_is_the_cifar_variant():
    model = build_model(schema.Resnet18Config(), (3, 32, 32), 10)
    # kuangliu/pytorch-cifar's ResNet18: 11,173,962 parameters for 10 classes.
    assert sum(p.numel() for p in model.parameters()) == 11_173_962
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())
    stem = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    assert stem.kernel_size == (3, 3) and stem.stride == (1, 1)
    model.eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_resnet18_narrow_on_small_images():
    model = build_model(schema.Resnet18Config(width=4), (1, 8, 8), 3)
    assert model(torch.randn(4, 1, 8, 8)).shape == (4, 3)
    model(torch.randn(4, 1, 8, 8)).sum().backward()


@pytest.mark.parametrize(
    ("cfg", "input_shape", "match"),
    [
        (schema.MlpConfig(dropout=1.5), (30,), r"model.dropout=1.5: must be in \[0, 1\)"),
        (schema.MlpConfig(hidden_sizes=[30, 0]), (30,), r"model.hidden_sizes\[1\]=0: must be > 0"),
        (schema.CnnConfig(), (30,), r"model=cnn needs image input.*data.as_images=true"),
        (schema.CnnConfig(channels=[]), (1, 8, 8), r"model.channels=\[\]"),
        (schema.CnnConfig(channels=[8, -1]), (1, 8, 8), r"model.channels\[1\]=-1"),
        (schema.CnnConfig(kernel_size=0), (1, 8, 8), "model.kernel_size=0"),
        (schema.CnnConfig(dropout=-0.1), (1, 8, 8), "model.dropout=-0.1"),
        (schema.Resnet18Config(), (64,), "model=resnet18 needs image input"),
        (schema.Resnet18Config(width=0), (3, 32, 32), "model.width=0"),
    ],
)
def test_model_config_errors(cfg, input_shape, match):
    with pytest.raises(ConfigError, match=match):
        build_model(cfg, input_shape, 2)


def test_unknown_model_name():
    cfg = schema.MlpConfig(name="transformer")
    with pytest.raises(ConfigError, match=r"model\.name='transformer': unknown; choose one of mlp"):
        build_model(cfg, (30,), 2)


CUSTOM_MODULE = """
from torch import nn


def build(input_shape, num_classes, hidden=8):
    layers = [nn.Flatten(), nn.Linear(input_shape[-1], hidden), nn.Linear(hidden, num_classes)]
    return nn.Sequential(*layers)


class Factories:
    @staticmethod
    def wide(input_shape, num_classes):
        return nn.Linear(input_shape[0], num_classes)


def not_a_model(input_shape, num_classes):
    return "a string"


NOT_CALLABLE = 3


class Net(nn.Module):
    # An existing model: its own constructor, no input_shape or num_classes.
    def __init__(self, width=8, depth=2):
        super().__init__()
        hidden = [nn.Linear(width, width) for _ in range(depth - 1)]
        self.net = nn.Sequential(nn.Linear(7, width), *hidden)


class WithClasses(nn.Module):
    def __init__(self, num_classes, width=4):
        super().__init__()
        self.head = nn.Linear(width, num_classes)


class NeedsFeatures(nn.Module):
    def __init__(self, in_features, num_classes):
        super().__init__()
        self.head = nn.Linear(in_features, num_classes)


def catch_all(**kwargs):
    catch_all.seen = kwargs
    return nn.Identity()


def starred(*layers, num_classes):
    return nn.Sequential(*layers)


def raises(input_shape, num_classes):
    raise ValueError("no layer fits\\nsecond line of the message")


def raises_bare():
    raise RuntimeError()


def buggy(num_classes):
    return nn.Linear("7" + 1, num_classes)
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "user_models_for_test.py").write_text(CUSTOM_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "user_models_for_test"


def test_custom_target_with_kwargs(user_module):
    cfg = schema.CustomModelConfig(target=f"{user_module}:build", kwargs={"hidden": 5})
    model = build_model(cfg, (7,), 3)
    assert linear_sizes(model) == [(7, 5), (5, 3)]
    assert model(torch.randn(2, 7)).shape == (2, 3)
    nested = schema.CustomModelConfig(target=f"{user_module}:Factories.wide")
    assert linear_sizes(build_model(nested, (7,), 3)) == [(7, 3)]


@pytest.mark.parametrize(
    ("target", "kwargs", "match"),
    [
        ("???", {}, "model.target='\\?\\?\\?': expected 'package.module:name'"),
        ("{m}.build", {}, "expected 'package.module:name' .*, e.g. {m}:build \\(or {m}.build:NAME"),
        ("no_such_pkg_xyz.models:build", {}, "cannot import 'no_such_pkg_xyz.models'"),
        ("{m}:missing", {}, "has no attribute 'missing'$"),
        # A typo: the name it meant, as the Slurm submission's look at the source says.
        ("{m}:biuld", {}, "has no attribute 'biuld'; did you mean {m}:build\\?$"),
        ("{m}:Factories.wdie", {}, "'Factories.wdie'; did you mean {m}:Factories.wide\\?$"),
        ("{m}:NOT_CALLABLE", {}, "'NOT_CALLABLE' is a int, not callable"),
        ("{m}:not_a_model", {}, "returned a str, not a torch.nn.Module"),
        (
            "{m}:build",
            {"depth": 3},
            r"'{m}:build': build takes no model.kwargs.depth; "
            r"its parameters: input_shape, num_classes, hidden$",
        ),
        (
            "{m}:Net",
            {"widht": 16, "height": 2},
            r"Net takes no model.kwargs.widht, model.kwargs.height; its parameters: width, depth$",
        ),
        (
            "{m}:NeedsFeatures",
            {},
            r"NeedsFeatures needs in_features; set model.kwargs.in_features=\.\.\.; "
            r"its parameters: in_features, num_classes$",
        ),
        (
            "{m}:starred",
            {"depth": 1},
            r"starred takes no model.kwargs.depth; its parameters: \*layers, num_classes$",
        ),
        ("{m}:raises", {}, r"^model.target='{m}:raises': raised ValueError: no layer fits$"),
        ("{m}:raises_bare", {}, r"^model.target='{m}:raises_bare': raised RuntimeError$"),
        ("{m}:buggy", {}, r"'{m}:buggy': raised TypeError: can only concatenate str"),
    ],
)
def test_custom_target_errors(user_module, target, kwargs, match):
    cfg = schema.CustomModelConfig(target=target.format(m=user_module), kwargs=kwargs)
    with pytest.raises(ConfigError, match=match.replace("{m}", user_module)) as info:
        build_model(cfg, (7,), 3)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("source", "match"),
    [
        (
            "import math\nraise RuntimeError('no GPU here')\n",
            r"^model.target='{m}:Net': importing '{m}' raised RuntimeError: no GPU here "
            r"\({m}.py line 2\); fix the module so that it imports$",
        ),
        (
            "def Net(:\n    pass\n",
            r"^model.target='{m}:Net': importing '{m}' raised SyntaxError: .*\({m}.py, line 1\)",
        ),
    ],
)
def test_a_module_that_fails_as_it_is_imported_is_one_line(tmp_path, monkeypatch, source, match):
    # Before: the import's traceback, and exit status 1 from the command.
    name = f"broken_models_{len(source)}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = schema.CustomModelConfig(target=f"{name}:Net")
    with pytest.raises(ConfigError, match=match.replace("{m}", name)) as info:
        build_model(cfg, (7,), 3)
    assert "\n" not in str(info.value)


def test_custom_target_gets_only_the_data_arguments_it_names(user_module):
    def build(target: str, **kwargs) -> nn.Module:
        cfg = schema.CustomModelConfig(target=f"{user_module}:{target}", kwargs=kwargs)
        return build_model(cfg, (7,), 3)

    assert linear_sizes(build("Net", width=16)) == [(7, 16), (16, 16)]
    assert linear_sizes(build("Net", depth=1)) == [(7, 8)]
    assert linear_sizes(build("WithClasses")) == [(4, 3)]
    assert linear_sizes(build("WithClasses", width=5, num_classes=9)) == [(5, 9)]  # user wins
    assert linear_sizes(build("NeedsFeatures", in_features=6)) == [(6, 3)]
    module = __import__(user_module)
    build("catch_all", depth=2)
    assert module.catch_all.seen == {"input_shape": (7,), "num_classes": 3, "depth": 2}
    build("catch_all", input_shape=[1, 7])
    assert module.catch_all.seen == {"input_shape": [1, 7], "num_classes": 3}


def test_samples_of_unknown_shape_give_no_input_shape(user_module):
    """Dict samples without x/y keys: hpcdl cannot tell their shape. It passed
    input_shape=(), which failed later as a matmul error; now the callable's own default
    applies, and a required input_shape is asked for by name."""

    def build(target: str, **kwargs) -> nn.Module:
        cfg = schema.CustomModelConfig(target=f"{user_module}:{target}", kwargs=kwargs)
        return build_model(cfg, (), 3)

    module = __import__(user_module)
    build("catch_all")
    assert module.catch_all.seen == {"num_classes": 3}
    assert linear_sizes(build("build", input_shape=[6])) == [(6, 8), (8, 3)]
    with pytest.raises(ConfigError) as info:
        build("build")
    assert str(info.value) == (
        f"model.target='{user_module}:build': takes input_shape, but the data's samples are "
        "not (x, y) pairs or x/y dicts, so hpcdl cannot tell it; set "
        "model.kwargs.input_shape=[...]"
    )


class UnreadableSignature:
    """A callable without a readable signature, as builtins and C extensions have."""

    __signature__ = "not a signature"

    def __call__(self, **kwargs):
        if set(kwargs) != {"input_shape", "num_classes"}:
            raise TypeError(f"unexpected {sorted(kwargs)}")
        return nn.Linear(kwargs["input_shape"][0], kwargs["num_classes"])


def test_custom_target_without_a_signature_gets_both_data_arguments(tmp_path, monkeypatch):
    import inspect

    with pytest.raises((TypeError, ValueError)):
        inspect.signature(UnreadableSignature())
    monkeypatch.setattr(
        "hpcdl.models.custom.resolve_callable", lambda key, target: UnreadableSignature()
    )
    cfg = schema.CustomModelConfig(target="builtin_like:factory")
    assert linear_sizes(build_model(cfg, (7,), 3)) == [(7, 3)]
    cfg = schema.CustomModelConfig(target="builtin_like:factory", kwargs={"depth": 2})
    with pytest.raises(ConfigError) as info:
        build_model(cfg, (7,), 3)
    assert str(info.value) == (
        "model.target='builtin_like:factory': calling it with input_shape, num_classes and "
        "model.kwargs={'depth': 2} failed (unexpected ['depth', 'input_shape', 'num_classes']); "
        "it must accept those keyword arguments"
    )
