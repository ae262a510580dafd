"""probe_user_code: run the user's model, data and task once before the run dir exists.

A broken model.target, data.target, collate_fn, task.target or task.predict (one that cannot
be imported, raises, returns the wrong thing, or gives samples the task cannot use), or a
trainer.step_hooks entry that cannot be imported, is then
refused as one line, with nothing written, instead of inside the job. The same goes for the
content of the user's data files (data=files, mnist, cifar10): rows of different widths,
labels that are not class labels, a missing label column; and an init_from checkpoint
that does not verify or does not fit the model. Only for launchers that train on
this machine (debug, local): a Slurm login node never imports torch or reads the data, so
there the job finds such errors on its first batch.
"""

from __future__ import annotations

import inspect
import math
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, Optional

from hpcdl.config.schema import (
    DATASET_SOURCES,
    Config,
    CustomDataConfig,
    CustomModelConfig,
    CustomTaskConfig,
    Device,
    Launcher,
)
from hpcdl.errors import ConfigError, DataWarning, HpcdlError, HpcdlWarning

# Built-in sources that read files the user points data.path at (the others are bundled).
FILE_SOURCES = ("files", "mnist", "cifar10")


def uses_user_code(cfg: Config) -> bool:
    """User code, or user files, that only running them can check."""
    return (
        isinstance(cfg.model, CustomModelConfig)
        or isinstance(cfg.task, CustomTaskConfig)
        or cfg.data.name in DATASET_SOURCES
        or cfg.data.name in FILE_SOURCES
        or cfg.init_from is not None  # a checkpoint: verified, and fitted to the model
    )


def probe_user_code(cfg: Config, here: bool = False) -> bool:
    """Build the data and the model, and run the task's step on the first training batch
    (no optimizer step, nothing written), and task.predict on it when set; raises the
    one-line errors the job (or `hpcdl predict`) would. `here`: for a Slurm run too
    (`hpcdl train --probe`), on this machine's CPU. False where the user's code asked for
    CUDA itself in a run that trains on GPUs (warned: checked up to there), else True."""
    if cfg.cluster.launcher == Launcher.slurm and not here:
        return True
    if cfg.trainer.step_hooks:  # imported only: a hook runs on steps, not in a probe
        from hpcdl.hooks import load_step_hooks

        load_step_hooks(cfg.trainer.step_hooks)
    if not uses_user_code(cfg):
        return True
    import torch

    from hpcdl.data.feed import build_feed
    from hpcdl.data.sharding import EpochSharder
    from hpcdl.errors import raised
    from hpcdl.models import build_model
    from hpcdl.tasks import build_prediction, build_task, check_monitor

    device = torch.device("cpu")  # this machine's, whatever the run trains on
    # One batch: no worker processes needed.
    data = replace(cfg.data, num_workers=0)
    with warnings.catch_warnings():  # the job reads the same data and says them once
        warnings.simplefilter("ignore", DataWarning)
        feed = build_feed(data, device, seed=cfg.trainer.seed, task=cfg.task)
    model = build_model(cfg.model, feed.input_shape, feed.num_classes)
    if cfg.init_from is not None:  # as the job's warm start does (hpcdl.build)
        from hpcdl.build import warm_start, warm_start_checkpoint
        from hpcdl.config.convert import to_plain

        warm_start(model, warm_start_checkpoint(cfg.init_from), to_plain(cfg)["model"])
    task = build_task(cfg.task, feed.target_stats, feed.num_classes)
    sharder = EpochSharder(
        num_samples=feed.num_samples("train"),
        global_batch_size=cfg.trainer.batch_size,
        rank=0,
        world_size=1,
        seed=cfg.trainer.seed,
    )
    batches = feed.train_batches(sharder, 0, 0, device)
    try:
        _, batch, _ = next(iter(batches))
    except HpcdlError:
        raise
    except Exception as exc:  # the user's dataset or collate_fn: one line naming it
        raise ConfigError(
            f"{_data_key(cfg)}: reading the first training batch failed: {raised(exc)}"
        ) from None
    try:
        out = task.batch_stats(model, batch)
        loss = float(out.loss_sum.detach())
        out.loss_sum.backward()
    except HpcdlError:
        raise
    except Exception as exc:  # the user's forward or step: one line naming which
        key = culprit(cfg, exc, model, task)
        if asks_for_cuda(exc) and trains_on_gpus(cfg):  # fine where the ranks run
            warnings.warn(
                HpcdlWarning(
                    f"{key}: checked up to its first use of CUDA: on this machine's CPU the "
                    f"first training batch {raised(exc)}; the job's ranks run it on their GPUs"
                ),
                stacklevel=1,
            )
            return False
        hint = f" ({CPU_ADVICE}; this run trains on the CPU)" if asks_for_cuda(exc) else ""
        raise ConfigError(
            f"{key}: the first training batch failed: {raised(exc)}"
            + (hint or batch_hint(cfg, exc, batch))
        ) from None
    if not math.isfinite(loss):
        raise ConfigError(
            f"{culprit(cfg, None, model, task)}: the loss of the first training batch is {loss}, "
            "before any training step: check the loss function and the data for NaN/inf"
        )
    check_monitor(cfg.trainer.early_stopping.monitor, task)
    if isinstance(cfg.task, CustomTaskConfig) and cfg.task.predict is not None:
        model.eval()
        with torch.no_grad():
            build_prediction(cfg.task).outputs(model, batch)
    return True


# What torch says when code run on the (probe's) CPU asks for CUDA: a CPU build, no
# driver, or a tensor on the GPU beside the CPU's.
CUDA_ERRORS = ("Torch not compiled with CUDA", "NVIDIA driver", "found at least two devices")


def asks_for_cuda(exc: BaseException) -> bool:
    return any(marker in str(exc) for marker in CUDA_ERRORS)


def trains_on_gpus(cfg: Config) -> bool:
    """Whether the run trains on GPUs: in this process (cluster=debug) where CUDA is
    here, else where its ranks are given GPUs (cluster.gpus_per_node); never with
    trainer.device=cpu."""
    if cfg.trainer.device == Device.cpu:
        return False
    if cfg.cluster.launcher == Launcher.debug:
        import torch

        return torch.cuda.is_available()
    return cfg.cluster.gpus_per_node > 0


CPU_ADVICE = (
    "code that moves tensors to 'cuda' itself fails on the CPU; take the device from the "
    "inputs, e.g. torch.zeros(n, device=x.device)"
)


def _data_key(cfg: Config) -> str:
    """data.collate_fn=... or data.target=... (data=custom), else data=<name>."""
    target = getattr(cfg.data, "target", None)
    if target is None:
        return f"data={cfg.data.name}"
    collate = getattr(cfg.data, "collate_fn", None)
    return f"data.target={target!r}" + (f" (or data.collate_fn={collate!r})" if collate else "")


def culprit(cfg: Config, exc: Optional[BaseException], model: Any, task: Any) -> str:
    """The key whose code failed: the one whose source file holds the deepest frame of the
    traceback (model.target's forward, task.target's step, data.target's dataset), else the
    user's step, model or data, in that order. task: None when no step ran."""
    mine: dict[str, str] = {}
    if isinstance(cfg.data, CustomDataConfig):  # imported by now: its datasets ran
        from hpcdl.targets import resolve_target

        try:
            found = resolve_target("data.target", cfg.data.target)
        except HpcdlError:
            found = None
        if found is not None:
            mine[_source(found)] = f"data.target={cfg.data.target!r}"
    if isinstance(cfg.model, CustomModelConfig):
        mine[_source(type(model))] = f"model.target={cfg.model.target!r}"
    if isinstance(cfg.task, CustomTaskConfig) and task is not None:
        fn = getattr(task.fn, "func", task.fn)  # task.kwargs: a partial
        mine[_source(fn)] = f"task.target={cfg.task.target!r}"
    frames = traceback.extract_tb(exc.__traceback__) if exc is not None else []
    for frame in reversed(frames):
        if frame.filename in mine:
            return mine[frame.filename]
    mine.pop("", None)  # no source file known
    first = [key for key in mine.values() if not key.startswith("data.")]
    return (first or list(mine.values()) or [f"data={cfg.data.name}"])[-1]


# torch's refusals of index tensors of another dtype: nn.Embedding's and the losses' targets.
INDEX_DTYPE_ERRORS = ("argument #1 'indices' to have one of", "expected target dtype to be")


def batch_hint(cfg: Config, exc: BaseException, batch: Any) -> str:
    """What in the batch likely caused an error the model or step raised: integer ids of a
    dtype torch does not index with (uint16 tokens from a memmap), or values that are no
    tensors (strings) that default batching passed on as lists. "" when nothing stands out."""
    import torch

    leaves = list(_leaves(batch))
    target = getattr(cfg.data, "target", None)
    collate = getattr(cfg.data, "collate_fn", None)
    source = f"data.target={target!r}" if target else "the dataset"
    if collate:  # the function that made the batch's tensors
        source = f"data.collate_fn={collate!r}"
    keyed = "indices must be integers or slices, not str" in str(exc)  # batch["input_ids"]
    if keyed and isinstance(batch, (tuple, list)):
        return (
            f" (the batch is a {type(batch).__name__} of {len(batch)}, not a dict: {source} made "
            "it; return a dict of name -> tensor from it, or index the batch by position)"
        )
    if any(marker in str(exc) for marker in INDEX_DTYPE_ERRORS):
        shown = sorted({str(t.dtype) for t in leaves if isinstance(t, torch.Tensor)})
        return (
            f" (the batch holds {', '.join(shown)} tensors: token ids and class labels must be "
            f"torch.int64; cast them in {source}, e.g. torch.from_numpy(ids.astype('int64')))"
        )
    integers = sorted(
        {str(t.dtype) for t in leaves if isinstance(t, torch.Tensor) and not t.is_floating_point()}
    )
    if integers and any(marker in str(exc) for marker in INPUT_DTYPE_ERRORS):
        return (
            f" (the batch holds {', '.join(integers)} tensors: a model's inputs must be floating "
            f"point; convert them in {source}, e.g. torch.from_numpy(x.astype('float32')))"
        )
    others = sorted({type(leaf).__name__ for leaf in leaves if not isinstance(leaf, torch.Tensor)})
    if others:
        return (
            f" (the batch holds {', '.join(others)} values, not only tensors: make {source} "
            "return numbers or tensors"
            + (")" if collate else ", or set data.collate_fn to batch the others)")
        )
    if any(marker in str(exc) for marker in SHAPE_ERRORS):  # a layer sized for other inputs
        shapes = [list(t.shape) for t in leaves if isinstance(t, torch.Tensor)]
        return f" (the batch's tensors have shapes {', '.join(map(str, shapes))})"
    return ""


# What torch says when a layer's float weights get integer inputs (a uint16 memmap's).
INPUT_DTYPE_ERRORS = (
    "Input type (",  # conv: "Input type (short unsigned int) and bias type (float) ..."
    "must have the same dtype",  # linear: "mat1 and mat2 must have the same dtype"
    "not implemented for '",  # "addmm_impl_cpu_" not implemented for 'Short'
    "expected scalar type",
)


# What torch says when a layer gets inputs of another size than it was built for.
SHAPE_ERRORS = (
    "shapes cannot be multiplied",
    "size mismatch",
    "Expected input batch_size",
    "expected input",
    "must match the size of tensor",
    "to have 3 channels",
    "channels, but got",
)


def _leaves(batch: Any) -> Iterator[Any]:
    if isinstance(batch, dict):
        for value in batch.values():
            yield from _leaves(value)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            yield from _leaves(value)
    else:
        yield batch


def _source(obj: Any) -> str:
    try:
        return inspect.getsourcefile(obj) or ""
    except TypeError:
        return ""
