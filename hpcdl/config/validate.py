"""Value checks on a typed Config, run before anything starts or is submitted.

Types and key names are already checked by convert.py; this checks ranges and files, with
one line per problem naming the key. Stdlib only: runs on the login node. The builders on
the torch side (models, data, optim) call the per-group checks too, so a config built in
code gets the same one-line errors and no check is written twice.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import zipfile
from pathlib import Path
from typing import Optional

from hpcdl.config import schema
from hpcdl.config.metrics import TASK_METRICS
from hpcdl.errors import ConfigError, DataError, did_you_mean

TARGET_FORM = "expected 'package.module:name' (a module, a colon, then a function or class in it)"
AUTO_TRUE_FALSE = ("auto", "true", "false")


def validate(cfg: schema.Config, *, resuming: bool = False) -> None:
    """Every value of `cfg`, before anything runs. `resuming`: a stored config, whose
    init_from no longer matters (its run goes on from its own checkpoints)."""
    check_model(cfg.model)
    check_data(cfg.data)
    check_optim(cfg.optim)
    check_schedule(cfg.schedule)
    check_task(cfg.task)
    _check_task_fits_data(cfg.task, cfg.data)
    _check_trainer(cfg.trainer)
    check_lagged_sync(cfg.trainer, cfg.optim)
    _check_monitor(cfg.trainer.early_stopping.monitor, cfg.task)
    _check_cluster(cfg.cluster)
    _check_gpu_per_rank(cfg)
    _check_batch_covers_ranks(cfg)
    _check_logger(cfg.logger, cfg.cluster)
    _check_model_fits_data(cfg.model, cfg.data)
    if resuming:
        return
    if cfg.init_from is not None and not Path(cfg.init_from).expanduser().exists():
        raise ConfigError(
            f"init_from={cfg.init_from!r}: no such run dir or checkpoint file; "
            "give a run dir (its best checkpoint, else its newest) or a .pt file"
        )


def _positive(key: str, value: float | int | None, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or value <= 0:
        raise ConfigError(f"{key}={value}: must be > 0")


def _non_negative(key: str, value: float | int) -> None:
    if value < 0:
        raise ConfigError(f"{key}={value}: must be >= 0")


def _fraction(key: str, value: float, *, upper_open: bool = True) -> None:
    if not (0 <= value < 1 if upper_open else 0 <= value <= 1):
        raise ConfigError(f"{key}={value}: must be in [0, 1{')' if upper_open else ']'}")


def check_model(model: object) -> None:
    if isinstance(model, schema.MlpConfig):
        for i, size in enumerate(model.hidden_sizes):
            _positive(f"model.hidden_sizes[{i}]", size)
        _fraction("model.dropout", model.dropout)
    elif isinstance(model, schema.CnnConfig):
        if not model.channels:
            raise ConfigError("model.channels=[]: give at least one conv block, e.g. [32, 64]")
        for i, size in enumerate(model.channels):
            _positive(f"model.channels[{i}]", size)
        _positive("model.kernel_size", model.kernel_size)
        _positive("model.hidden_size", model.hidden_size)
        _fraction("model.dropout", model.dropout)
    elif isinstance(model, schema.Resnet18Config):
        _positive("model.width", model.width)
    elif isinstance(model, schema.CustomModelConfig):
        check_target_form("model.target", model.target)


def check_target_form(key: str, target: str) -> None:
    """'package.module:attribute', checked on the login node without importing anything."""
    module, sep, attr = target.partition(":")
    if sep and module and attr:
        return
    head, dot, tail = target.rpartition(".")
    if not sep and dot and head and tail.isidentifier():  # 'mylab.tasks.perplexity'
        example = f"{head}:{tail} (or {target}:NAME if {target} is the module)"
    else:
        example = "mypkg.models:build"
    raise ConfigError(f"{key}={target!r}: {TARGET_FORM}, e.g. {example}")


def _check_model_fits_data(model: object, data: schema.DataCommon) -> None:
    """Conv models need (C,H,W) samples; catch the known flat sources before anything runs."""
    if not isinstance(model, (schema.CnnConfig, schema.Resnet18Config)):
        return
    flat = (
        isinstance(data, schema.BreastCancerConfig)
        or (isinstance(data, (schema.DigitsConfig, schema.MnistConfig)) and not data.as_images)
        or (isinstance(data, schema.SyntheticConfig) and len(data.shape) != 3)
    )
    if flat:
        raise ConfigError(
            f"model={model.name} needs image samples (C,H,W) but data={data.name} gives flat rows; "
            "use image data (data=digits, data=mnist, data=cifar10, or data.shape=[C,H,W])"
        )


def check_data(data: schema.DataCommon) -> None:
    _fraction("data.val_fraction", data.val_fraction)
    _fraction("data.test_fraction", data.test_fraction)
    if data.val_fraction + data.test_fraction >= 1:
        raise ConfigError(
            f"data.val_fraction + data.test_fraction = {data.val_fraction + data.test_fraction}: "
            "must leave training data (sum < 1)"
        )
    _non_negative("data.num_workers", data.num_workers)
    if data.num_folds == 1 or data.num_folds < 0:
        raise ConfigError(f"data.num_folds={data.num_folds}: use 0 (off) or >= 2")
    if data.fold and not data.num_folds:  # else the fold is ignored: the usual split
        raise ConfigError(
            f"data.fold={data.fold}: a k-fold split needs data.num_folds; set it too, e.g. "
            f"data.num_folds={max(5, data.fold + 1)} data.fold={data.fold}"
        )
    if data.num_folds and not 0 <= data.fold < data.num_folds:
        raise ConfigError(f"data.fold={data.fold}: must be in [0, data.num_folds={data.num_folds})")
    if isinstance(data, schema.SyntheticConfig):
        _positive("data.num_samples", data.num_samples)
        if data.num_classes < 2:
            raise ConfigError(f"data.num_classes={data.num_classes}: must be >= 2")
        if data.num_samples < data.num_classes:
            raise ConfigError(
                f"data.num_samples={data.num_samples}: need at least one sample per class "
                f"(data.num_classes={data.num_classes})"
            )
        if not data.shape:
            raise ConfigError("data.shape=[]: give the per-sample shape, e.g. [16] or [1,8,8]")
        for i, size in enumerate(data.shape):
            _positive(f"data.shape[{i}]", size)
        _non_negative("data.noise", data.noise)
    if isinstance(data, (schema.CustomDataConfig, schema.ImageFolderConfig)):
        _check_dataset_source(data)
    path = getattr(data, "path", None)
    if path in (schema.MISSING, ""):
        raise ConfigError(f"data.path is not set: data={data.name} needs data.path=/path/to/data")
    if path is not None and not Path(path).expanduser().exists():
        raise ConfigError(f"data.path={path!r}: no such file or folder; point it at your data")
    labels = getattr(data, "labels_path", None)
    if labels is not None and not Path(labels).expanduser().exists():
        raise ConfigError(f"data.labels_path={labels!r}: no such file")
    suffix = Path(path).suffix.lower() if isinstance(path, str) else ""
    if labels is not None and suffix in (".npz", ".csv"):  # it would be ignored
        own = "its y array" if suffix == ".npz" else "its data.label_column"
        raise ConfigError(
            f"data.labels_path={labels!r}: only a .npy of features takes a labels file; "
            f"data.path={path!r} brings its own labels ({own}): remove data.labels_path"
        )
    label_column = getattr(data, "label_column", "label")
    if suffix in (".npy", ".npz") and label_column != "label":  # a CSV's key: ignored
        labels_from = "its y array" if suffix == ".npz" else "data.labels_path"
        raise ConfigError(
            f"data.label_column={label_column!r}: names a .csv's label column; "
            f"data.path={path!r} is an array file (labels from {labels_from}): remove it"
        )
    if data.name == "files" and isinstance(path, str):
        _check_array_file("data.path", path)
        if labels is not None:
            _check_array_file("data.labels_path", labels)


NPY_MAGIC = b"\x93NUMPY"


def _check_array_file(key: str, path: str) -> None:
    """An .npy or .npz that is none, or an .npz without its x and y arrays, named from its
    first bytes or its zip directory (stdlib only): on a login node, before a job waits in
    the queue to find it out. Their contents are the job's to read."""
    file = Path(path).expanduser()
    suffix = file.suffix.lower()
    if suffix not in (".npy", ".npz") or not file.is_file():
        return
    try:
        with file.open("rb") as f:
            head = f.read(len(NPY_MAGIC))
        names = None
        if suffix == ".npz" and zipfile.is_zipfile(file):
            with zipfile.ZipFile(file) as z:
                names = [n.removesuffix(".npy") for n in z.namelist() if n.endswith(".npy")]
    except (OSError, zipfile.BadZipFile):
        return  # unreadable here: the job says why
    if (suffix == ".npy" and head != NPY_MAGIC) or (suffix == ".npz" and names is None):
        save = "np.save" if suffix == ".npy" else "np.savez"
        raise DataError(
            f"{key}: cannot read '{path}' as {suffix}: not a NumPy file (neither .npy nor a zip "
            f"of arrays); save it with {save}"
        )
    missing = [k for k in ("x", "y") if names is not None and k not in names]
    if missing:
        raise DataError(
            f"{key}='{path}': no array {missing[0]!r} (has {sorted(names or [])}); save with "
            "np.savez(path, x=features, y=labels)"
        )


def _check_dataset_source(data: schema.CustomDataConfig | schema.ImageFolderConfig) -> None:
    if data.num_folds:
        raise ConfigError(
            f"data.num_folds={data.num_folds}: k-fold splits need the labels in memory; "
            f"data={data.name} reads samples lazily, so return your own folds from your datasets"
        )
    _positive("data.prefetch_factor", data.prefetch_factor)
    if isinstance(data, schema.CustomDataConfig):
        check_target_form("data.target", data.target)
        if data.collate_fn is not None:
            check_target_form("data.collate_fn", data.collate_fn)
        _positive("data.num_classes", data.num_classes, allow_none=True)
        return
    if Path(data.path).expanduser().is_file():
        other = "data=files" if Path(data.path).suffix.lower() in (".csv", ".npy", ".npz") else ""
        hint = f" (for this file: {other} data.path={data.path})" if other else ""
        raise ConfigError(
            f"data.path={data.path!r}: a file; data=imagefolder reads a folder of class "
            f"sub-folders of images{hint}"
        )
    _positive("data.image_size", data.image_size, allow_none=True)
    _positive("data.crop_size", data.crop_size, allow_none=True)
    if data.channels not in (1, 3):
        raise ConfigError(f"data.channels={data.channels}: use 1 (grayscale) or 3 (RGB)")
    for key in ("mean", "std"):
        values = getattr(data, key)
        if values is not None and len(values) != data.channels:
            raise ConfigError(
                f"data.{key}={values}: give one value per channel (data.channels={data.channels})"
            )
    if data.std is not None and any(v <= 0 for v in data.std):
        raise ConfigError(f"data.std={data.std}: every value must be > 0")


def check_script(
    script: schema.ScriptConfig, cluster: schema.ClusterConfig, workdir: Optional[str] = None
) -> None:
    """`hpcdl run`: the program exists and can be started; nothing is imported or run.
    `workdir`: `hpcdl resume`'s check, of the command as the job starts it there."""
    usage = (
        "hpcdl run [overrides] -- python train.py ...  or  hpcdl run entry=package.module:function"
    )
    if bool(script.command) == bool(script.entry):
        raise ConfigError(
            f"hpcdl run: give a command after -- or entry=..., not {'both' if script.command else 'neither'}: {usage}"
        )
    if (
        script.launcher == schema.ScriptLauncher.torchrun
        and cluster.launcher != schema.Launcher.slurm
    ):
        raise ConfigError(
            f"launcher=torchrun: starts one torchrun per node of a Slurm job, and cluster={cluster.name} "
            "is not Slurm; use launcher=srun (the default) on this machine"
        )
    if script.entry is not None:
        check_target_form("entry", script.entry)
        if not locatable(script.entry.partition(":")[0]):
            raise ConfigError(
                f"entry={script.entry!r}: module {script.entry.partition(':')[0]!r} is not "
                "importable here; install it or put its folder on PYTHONPATH"
            )
        return
    _refuse_torchrun_in_ranks(script, cluster)
    base = Path(workdir) if workdir is not None else Path.cwd()
    torchrun = script.launcher == schema.ScriptLauncher.torchrun
    if torchrun and script.command[0].endswith(".py") and (base / script.command[0]).is_file():
        return  # `launcher=torchrun -- train.py ...`: torchrun starts the interpreter
    frozen = cluster.launcher == schema.Launcher.slurm
    if workdir is None:
        _check_command(script.command, base, "give its path relative to here", frozen)
    else:
        fix = (
            "the run's job starts its program there (workdir); give its path from there "
            "(hpcdl resume RUN_DIR -- COMMAND...), or workdir=FOLDER where it moved"
        )
        _check_command(script.command, base, fix, frozen)


TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def _refuse_torchrun_in_ranks(script: schema.ScriptConfig, cluster: schema.ClusterConfig) -> None:
    """`-- torchrun ...` where hpcdl starts several ranks (or torchruns) itself: each would
    start its own torchrun, separate jobs writing the same files. Under cluster=debug's
    one rank it is the program's own launcher, and fine."""
    command = script.command
    rest = command[1:]
    runs_torchrun = Path(command[0]).name == "torchrun" or (
        Path(command[0]).name.startswith("python")
        and rest[:1] == ["-m"]
        and len(rest) > 1
        and rest[1] in TORCHRUN_MODULES
    )
    if not runs_torchrun:
        return
    which = shlex.join(command[:3] if command[0] != "torchrun" else command[:1])
    program = next((i for i, t in enumerate(command) if t.endswith(".py")), None)
    plain = f"-- python {shlex.join(command[program:])}" if program is not None else "-- python ..."
    if script.launcher == schema.ScriptLauncher.torchrun:
        raise ConfigError(
            f"{which}: launcher=torchrun starts torchrun on each node itself; give the "
            f"program without it: {plain}"
        )
    ranks = (
        1
        if cluster.launcher == schema.Launcher.debug
        else (cluster.nodes * schema.tasks_per_node(cluster))
    )
    if ranks > 1:
        raise ConfigError(
            f"{which}: hpcdl starts {ranks} ranks here (cluster.nodes={cluster.nodes}, "
            f"{schema.tasks_per_node(cluster)} per node), and each would start its own "
            f"torchrun: separate jobs writing the same files; give the program without it, "
            f"{plain}, with the ranks as cluster.tasks_per_node (or launcher=torchrun on Slurm)"
        )


# Interpreter options that take a value (`python -X dev train.py`).
PYTHON_OPTIONS_WITH_VALUE = ("-X", "-W", "-Q")


def _check_command(command: list[str], base: Path, fix: str, frozen: bool = True) -> None:
    """The program and its script, from `base` (where it will start); `fix`: how to give a
    script that is not there. `frozen`: a Slurm job's, which starts the frozen copy."""
    import shutil

    program = command[0]
    if Path(program).name.startswith("python") and shutil.which(program):
        rest = command[1:]
        if "-c" in rest:
            return  # python -c CODE
        if rest[:1] == ["-m"] and len(rest) > 1:
            # python -m finds a module in the folder it starts in; on Slurm the job starts
            # hpcdl's frozen copy, which takes -m modules from PYTHONPATH only.
            if not locatable(rest[1]) and (frozen or _module_here(rest[1], base) is None):
                raise ConfigError(_module_not_found(rest[1], base))
            return
        values = {i + 1 for i, t in enumerate(rest) if t in PYTHON_OPTIONS_WITH_VALUE}
        script = next(
            (t for i, t in enumerate(rest) if not t.startswith("-") and i not in values), None
        )
        if script is None:  # an interpreter reading its input: it would wait, or do nothing
            raise ConfigError(
                f"{shlex.join(command)}: no script to run; give it after the interpreter "
                f"({program} train.py ...), or {program} -m package.module, or -c CODE"
            )
        if not (base / Path(script).expanduser()).is_file():
            raise ConfigError(
                f"{script}: no such script (from {base}{_close_file(script, base)}); {fix}"
            )
        return
    path = base / Path(program).expanduser()
    if "/" in program:
        if not path.is_file():
            raise ConfigError(
                f"{program}: no such file; give the program's path or its name on PATH"
            )
        if not os.access(path, os.X_OK):
            raise ConfigError(
                f"{program}: not executable; chmod +x it, or start it with its interpreter "
                f"(python {program}, bash {program})"
            )
        return
    if Path(program).name in ("srun", "mpirun", "mpiexec") and len(command) > 1:
        raise ConfigError(
            f"{program}: hpcdl starts each rank itself (with srun on Slurm, as processes "
            f"here); give the program without it: -- {shlex.join(command[1:])} (and "
            "cluster.nodes / cluster.tasks_per_node for the ranks)"
        )
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", program):  # `VAR=1 python train.py`
        name, _, value = program.partition("=")
        raise ConfigError(
            f"{program}: a variable, not a command (no shell reads the command); set it with "
            f"cluster.env.{name}={value}, or start with env: -- env {program} {shlex.join(command[1:])}"
        )
    if shutil.which(program) is None:
        import difflib

        usual = ("python", "python3", "torchrun", "bash", "sh", "apptainer", "singularity")
        close = difflib.get_close_matches(program, [p for p in usual if shutil.which(p)], n=1)
        hint = f"did you mean {close[0]}?" if close else "give its full path"
        raise ConfigError(f"{program}: command not found on PATH; {hint}")


def _close_file(script: str, base: Path) -> str:
    """'; did you mean train.py?' for a script name a letter or two off one in its folder."""
    import difflib

    folder = (base / Path(script).expanduser()).parent
    try:
        names = [p.name for p in folder.iterdir() if p.is_file()]
    except OSError:
        return ""
    close = difflib.get_close_matches(Path(script).name, names, n=1, cutoff=0.85)
    return f"; did you mean {Path(script).with_name(close[0])}?" if close else ""


def _module_here(module: str, base: Path) -> Optional[Path]:
    """Where `python -m module` started in `base` would find it (the module's file, or its
    package's folder), or None."""
    parts = module.split(".")
    here = [base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts)]
    return next((path for path in here if path.exists()), None)


def _module_not_found(module: str, base: Path) -> str:
    """`-m MODULE` not found on PYTHONPATH: one line, saying so when it is in `base` (where
    plain `python -m` would find it, as it puts the current folder first)."""
    parts = module.split(".")
    here = [(base / parts[0]).with_suffix(".py"), base / parts[0]]  # its package, at least
    found = _module_here(module, base) or next((p for p in here if p.exists()), None)
    if found is None:
        return f"-m {module}: no such module here; check PYTHONPATH"
    file = base.joinpath(*parts).with_suffix(".py")
    script = file if file.is_file() else None
    instead = f", or give the script: python {script.relative_to(base)}" if script else ""
    return (
        f"-m {module}: {found} is here, but hpcdl finds -m modules on PYTHONPATH (to freeze "
        f"them with the run), which does not hold {base}; run PYTHONPATH=. hpcdl run ..."
        f"{instead}"
    )


def locatable(module: str) -> bool:
    """Whether `module` (dotted) can be imported here, found without running any of it."""
    import importlib.util

    top, *rest = module.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    locations = list(spec.submodule_search_locations or [])
    for part in rest:
        found = [Path(d) / part for d in locations]
        packages = [p for p in found if (p / "__init__.py").is_file() or p.is_dir()]
        if any(p.with_suffix(".py").is_file() for p in found):
            return True  # a module file: deeper parts would be attributes
        if not packages:
            return False
        locations = [str(p) for p in packages]
    return True


def check_optim(optim: object) -> None:
    _positive("optim.lr", getattr(optim, "lr", None))
    _non_negative("optim.weight_decay", getattr(optim, "weight_decay", 0.0))
    eps = getattr(optim, "eps", 1.0)
    if eps <= 0:
        raise ConfigError(f"optim.eps={eps}: must be > 0")
    if isinstance(optim, schema.RmspropConfig):
        _fraction("optim.alpha", optim.alpha)
        _non_negative("optim.momentum", optim.momentum)
    if isinstance(optim, schema.SgdConfig):
        _non_negative("optim.momentum", optim.momentum)
        if optim.nesterov and optim.momentum <= 0:
            raise ConfigError("optim.nesterov=true needs optim.momentum > 0")
    fused = getattr(optim, "fused", None)
    if fused is not None:
        _auto_true_false(
            "optim.fused", fused, "on when training on CUDA or with trainer.lagged_sync=true"
        )
    if isinstance(optim, schema.AdamConfig) and (
        len(optim.betas) != 2 or not all(0 <= b < 1 for b in optim.betas)
    ):
        raise ConfigError(f"optim.betas={optim.betas}: need two values in [0, 1)")


def check_schedule(schedule: schema.ScheduleConfig) -> None:
    if schedule.name not in schema.SCHEDULE_NAMES:
        raise ConfigError(
            f"schedule.name={schedule.name!r}: unknown; choose one of {', '.join(schema.SCHEDULE_NAMES)}"
        )
    _non_negative("schedule.warmup_steps", schedule.warmup_steps)
    _positive("schedule.step_size_epochs", schedule.step_size_epochs)
    _positive("schedule.gamma", schedule.gamma)
    _fraction("schedule.min_lr_ratio", schedule.min_lr_ratio, upper_open=False)
    if schedule.max_lr_ratio < 1:
        raise ConfigError(f"schedule.max_lr_ratio={schedule.max_lr_ratio}: must be >= 1 (the peak)")
    if not 0 < schedule.pct_start < 1:
        raise ConfigError(f"schedule.pct_start={schedule.pct_start}: must be in (0, 1)")


def _check_trainer(t: schema.TrainerConfig) -> None:
    _positive("trainer.max_epochs", t.max_epochs)
    _positive("trainer.stall_timeout_s", t.stall_timeout_s)
    _non_negative("trainer.low_gpu_util_pct", t.low_gpu_util_pct)
    _positive("trainer.stall_first_step_s", t.stall_first_step_s, allow_none=True)
    _positive("trainer.max_steps", t.max_steps, allow_none=True)
    _positive("trainer.batch_size", t.batch_size)
    _positive("trainer.micro_batches", t.micro_batches)
    _positive("trainer.grad_clip_norm", t.grad_clip_norm, allow_none=True)
    _positive("trainer.eval_every_steps", t.eval_every_steps, allow_none=True)
    _positive("trainer.eval_every_s", t.eval_every_s, allow_none=True)
    _positive("trainer.checkpoint_every_steps", t.checkpoint_every_steps, allow_none=True)
    _positive("trainer.checkpoint_every_s", t.checkpoint_every_s, allow_none=True)
    _positive("trainer.keep_last", t.keep_last)
    _positive("trainer.keep_every_epochs", t.keep_every_epochs, allow_none=True)
    _auto_true_false("trainer.async_checkpoint", t.async_checkpoint, "on when training on CUDA")
    _auto_true_false("trainer.lagged_sync", t.lagged_sync, "on CUDA with a fused optimizer")
    _positive("trainer.max_bad_steps", t.max_bad_steps)
    _positive("trainer.log_every_steps", t.log_every_steps)
    _non_negative("trainer.early_stopping.patience", t.early_stopping.patience)
    for i, target in enumerate(t.step_hooks):
        check_target_form(f"trainer.step_hooks[{i}]", target)


def _auto_true_false(key: str, value: str, auto_means: str) -> None:
    if str(value).lower() not in AUTO_TRUE_FALSE:  # a CLI true arrives as "True"
        raise ConfigError(f"{key}={value!r}: choose auto ({auto_means}), true or false")


def check_lagged_sync(t: schema.TrainerConfig, optim: object) -> None:
    """trainer.lagged_sync=true skips a non-finite step on the device: only a fused
    optimizer can (sgd, adam, adamw)."""
    if t.lagged_sync.lower() != "true":
        return
    name = getattr(optim, "name", "?")
    if not hasattr(optim, "fused"):
        raise ConfigError(
            f"trainer.lagged_sync=true: optim={name} has no fused step to skip a non-finite "
            "step on the device; use optim=sgd, adam or adamw, or set trainer.lagged_sync=false"
        )
    if str(optim.fused).lower() == "false":
        raise ConfigError(
            "trainer.lagged_sync=true: optim.fused=false cannot skip a non-finite step on the "
            "device; remove optim.fused=false, or set trainer.lagged_sync=false"
        )


def check_task(task: object) -> None:
    if isinstance(task, schema.CustomTaskConfig):
        check_target_form("task.target", task.target)
        if task.predict is not None:
            check_target_form("task.predict", task.predict)


def _check_task_fits_data(task: object, data: schema.DataCommon) -> None:
    if schema.numeric_targets(task) and data.name not in schema.REGRESSION_SOURCES:
        regression = isinstance(task, schema.RegressionTaskConfig)
        which = "task=regression" if regression else "task.labels=numbers"
        raise ConfigError(
            f"{which}: data={data.name} holds class labels; use data=files with a "
            "numeric label column (data.label_column) or data=custom"
        )


def _check_monitor(monitor: str, task: object) -> None:
    split, _, metric = monitor.partition("_")
    name = getattr(task, "name", "")
    if split not in ("train", "val") or not metric:
        own = next(iter(TASK_METRICS[name])) if TASK_METRICS.get(name) else "<metric>"
        raise ConfigError(
            f"trainer.early_stopping.monitor={monitor!r}: name a split and a metric, "
            f"e.g. val_loss, val_{own} or train_loss"
        )
    # A custom task's metrics are known only once its function has run: the job checks then.
    if name in TASK_METRICS and metric not in ("loss", *TASK_METRICS[name]):
        choices = [f"{s}_{m}" for s in ("val", "train") for m in ("loss", *TASK_METRICS[name])]
        raise ConfigError(
            f"trainer.early_stopping.monitor={monitor!r}: {did_you_mean(monitor, choices)}"
            f"task={name} reports {', '.join(choices)}; choose one of those"
        )


def _check_cluster(c: schema.ClusterConfig) -> None:
    _positive("cluster.nodes", c.nodes)
    _positive("cluster.tasks_per_node", c.tasks_per_node, allow_none=True)
    _non_negative("cluster.gpus_per_node", c.gpus_per_node)
    _positive("cluster.cpus_per_task", c.cpus_per_task)
    if c.mem_gb is not None:  # 0: all of each node's memory (sbatch's --mem=0)
        _non_negative("cluster.mem_gb", c.mem_gb)
    _positive("cluster.timeout_min", c.timeout_min)
    _non_negative("cluster.signal_delay_s", c.signal_delay_s)
    _non_negative("cluster.max_requeues", c.max_requeues)
    _positive("cluster.rendezvous_timeout_s", c.rendezvous_timeout_s)
    _non_negative("cluster.array_parallelism", c.array_parallelism)  # sbatch ignores %-1
    if c.container.image is not None and c.launcher != schema.Launcher.slurm:
        raise ConfigError(
            f"cluster.container.image: cluster={c.name} runs on this machine, outside any "
            "container; containers are for Slurm profiles (or start hpcdl inside the image)"
        )
    _check_cluster_python(c)
    if c.launcher != schema.Launcher.slurm and c.nodes != 1:
        raise ConfigError(
            f"cluster.nodes={c.nodes}: cluster={c.name} runs on this machine only; use nodes=1 "
            "or a Slurm profile"
        )
    if c.launcher == schema.Launcher.debug and schema.tasks_per_node(c) != 1:
        raise ConfigError(
            f"cluster.tasks_per_node={c.tasks_per_node}: cluster=debug runs one rank in-process; "
            "use cluster=local for several ranks"
        )
    if c.signal_delay_s >= c.timeout_min * 60:
        raise ConfigError(
            f"cluster.signal_delay_s={c.signal_delay_s}: must be shorter than "
            f"cluster.timeout_min={c.timeout_min} minutes"
        )


def _check_cluster_python(c: schema.ClusterConfig) -> None:
    """cluster.python: one word, a name the node's PATH has after cluster.setup or an
    absolute path. A path missing here is not refused: it may exist on the compute nodes
    only (--dry-run says so)."""
    python = c.python
    if python is None:
        return
    if not python or any(ch.isspace() for ch in python):
        raise ConfigError(
            f"cluster.python={python!r}: give one interpreter, a name on the node's PATH after "
            "cluster.setup (python3) or an absolute path, without spaces; activate an "
            "environment in cluster.setup, or drop the key (cluster.python=null: the "
            "interpreter running hpcdl)"
        )
    if "/" in python and not python.startswith("/"):
        where = Path(python).expanduser()
        example = where if where.is_absolute() else Path.cwd() / python
        raise ConfigError(
            f"cluster.python={python!r}: a relative path; give an absolute path ({example}) "
            "or a name on the node's PATH after cluster.setup (python3)"
        )
    if c.launcher != schema.Launcher.slurm:
        raise ConfigError(
            f"cluster.python={python!r}: cluster={c.name} runs its ranks here, in the "
            "interpreter running hpcdl; cluster.python is for Slurm profiles (or start hpcdl "
            "with that interpreter)"
        )
    if c.container.image is not None:
        raise ConfigError(
            f"cluster.python={python!r}: with cluster.container.image the ranks run the "
            f"image's interpreter, cluster.container.python={c.container.python!r}; set that "
            "instead, and drop cluster.python (cluster.python=null)"
        )


def _check_batch_covers_ranks(cfg: schema.Config) -> None:
    """The batch is global and split over the ranks: each needs a sample per step (also
    checked by the job's sharder; here before a run dir exists or a job is submitted)."""
    if cfg.script is None and cfg.trainer.batch_size < cfg.world_size:
        raise ConfigError(
            f"trainer.batch_size={cfg.trainer.batch_size}: smaller than the {cfg.world_size} "
            "ranks; the batch size is global, give each rank at least one sample per step "
            f"(trainer.batch_size={cfg.world_size} or more, or fewer ranks)"
        )
    share = cfg.trainer.batch_size // cfg.world_size  # each rank's (the smallest)
    if cfg.script is None and cfg.trainer.micro_batches > share:
        on = f" on {cfg.world_size} ranks" if cfg.world_size > 1 else ""
        raise ConfigError(
            f"trainer.micro_batches={cfg.trainer.micro_batches}: more passes than samples in "
            f"each rank's share of trainer.batch_size={cfg.trainer.batch_size} ({share}{on}); "
            f"give at most {share}"
        )


def _check_gpu_per_rank(cfg: schema.Config) -> None:
    """hpcdl's ranks on GPUs take one each (local rank modulo the GPUs): more ranks on a node
    than GPUs would put two on one GPU, which NCCL refuses at the job's start ("Duplicate
    GPU detected"). A script (`hpcdl run`) picks its own backend and is left to it."""
    if cfg.script is not None or cfg.trainer.device == schema.Device.cpu:
        return
    c = cfg.cluster
    ranks = schema.tasks_per_node(c)
    if 0 < c.gpus_per_node < ranks:
        raise ConfigError(
            f"cluster.tasks_per_node={ranks}: more ranks than cluster.gpus_per_node="
            f"{c.gpus_per_node} on a node, and each rank needs a GPU of its own; set "
            f"cluster.tasks_per_node={c.gpus_per_node} (or trainer.device=cpu)"
        )


def _check_logger(logger: schema.LoggerConfig, cluster: schema.ClusterConfig) -> None:
    if logger.wandb.enabled and not logger.wandb.project:
        raise ConfigError(
            "logger.wandb.project='': name the W&B project, e.g. logger.wandb.project=myproject"
        )
    if logger.mlflow.enabled and not logger.mlflow.experiment:
        raise ConfigError(
            "logger.mlflow.experiment='': name the MLflow experiment, e.g. logger.mlflow.experiment=mnist"
        )
    if cluster.container.image is not None or cluster.python is not None:
        return  # the job runs another Python (the image's), whose packages are not seen here
    for name in logger.chosen():
        _check_tracker_installed(name)


def _check_tracker_installed(name: str) -> None:
    """A chosen tracker's package, looked for here (the login node) without importing it,
    so a missing one is refused before the run dir exists or the job waits in the queue."""
    module, extra = schema.TRACKER_PACKAGES[name]
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"logger={name}: the {module} package is not installed; "
            f"pip install '{extra}' (in a checkout: pip install -e '.[{name}]')"
        )
