"""Typed configuration: the dataclasses every layer below the CLI reads.

Each config group (model, data, optim, schedule, trainer, cluster) has one dataclass per
option; the YAML file's ``name`` field picks the dataclass. Plain stdlib only: this module
is imported on the login node and must never pull in torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional, Union

MISSING = "???"


# ----------------------------------------------------------------------------- model
@dataclass
class MlpConfig:
    name: str = "mlp"
    # The seed workshop's network: 30 inputs -> 30 -> 60 -> 2 classes.
    hidden_sizes: list[int] = field(default_factory=lambda: [30, 60])
    dropout: float = 0.5


@dataclass
class CnnConfig:
    name: str = "cnn"
    # One conv-relu-maxpool(2) block per entry; 2 blocks take 8x8 digits to 2x2.
    channels: list[int] = field(default_factory=lambda: [32, 64])
    kernel_size: int = 3
    hidden_size: int = 128
    dropout: float = 0.25


@dataclass
class Resnet18Config:
    name: str = "resnet18"
    # CIFAR-style stem: 3x3 conv, stride 1, no max-pool.
    width: int = 64


@dataclass
class CustomModelConfig:
    name: str = "custom"
    # "package.module:factory"; called as factory(input_shape=..., num_classes=..., **kwargs).
    target: str = MISSING
    kwargs: dict[str, Any] = field(default_factory=dict)


ModelConfig = Union[MlpConfig, CnnConfig, Resnet18Config, CustomModelConfig]
MODEL_SCHEMAS: dict[str, type] = {
    "mlp": MlpConfig,
    "cnn": CnnConfig,
    "resnet18": Resnet18Config,
    "custom": CustomModelConfig,
}


# ----------------------------------------------------------------------------- data
@dataclass
class DataCommon:
    name: str = MISSING
    val_fraction: float = 0.15
    test_fraction: float = 0.15
    split_seed: int = 0
    standardize: bool = True
    # k-fold cross-validation over train+val: 0 = off; fold in [0, num_folds).
    num_folds: int = 0
    fold: int = 0
    # In-memory datasets live on the training device as tensors (no DataLoader in the hot
    # path); in_memory=false uses a DataLoader with workers and pinned memory instead.
    in_memory: bool = True
    num_workers: int = 2


@dataclass
class BreastCancerConfig(DataCommon):
    name: str = "breast_cancer"


@dataclass
class DigitsConfig(DataCommon):
    name: str = "digits"
    # Feed 1x8x8 images (cnn) or flat 64-vectors (mlp).
    as_images: bool = True


@dataclass
class MnistConfig(DataCommon):
    name: str = "mnist"
    # Folder holding train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz],
    # t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz].
    path: str = MISSING
    as_images: bool = True


@dataclass
class Cifar10Config(DataCommon):
    name: str = "cifar10"
    # Folder "cifar-10-batches-py" with data_batch_1..5 and test_batch.
    path: str = MISSING


@dataclass
class FilesConfig(DataCommon):
    name: str = "files"
    # .npz (arrays x and y), .npy (features; labels in labels_path) or .csv (label column).
    path: str = MISSING
    labels_path: Optional[str] = None
    label_column: str = "label"
    # A CSV's feature columns, by name, in this order (null: every column but label_column):
    # leaves out IDs, notes and other columns without editing the file.
    feature_columns: Optional[list[str]] = None


@dataclass
class SyntheticConfig(DataCommon):
    name: str = "synthetic"
    num_samples: int = 2048
    num_classes: int = 4
    shape: list[int] = field(default_factory=lambda: [16])
    noise: float = 1.0
    seed: int = 0


@dataclass
class CustomDataConfig(DataCommon):
    """Your own map-style torch Datasets, read lazily through a DataLoader (never whole)."""

    name: str = "custom"
    # "package.module:function", called as function(**kwargs); returns {"train", "val"[,
    # "test"]} datasets, a (train, val[, test]) tuple, or one dataset that hpcdl splits
    # with val_fraction/test_fraction and split_seed.
    target: str = MISSING
    kwargs: dict[str, Any] = field(default_factory=dict)
    # Classes for task=classification, when the dataset has no `classes`/`num_classes`.
    num_classes: Optional[int] = None
    # "package.module:function" to collate a list of samples into a batch (default: torch's).
    collate_fn: Optional[str] = None
    # Batches each DataLoader worker reads ahead.
    prefetch_factor: int = 2


@dataclass
class ImageFolderConfig(DataCommon):
    """Images in one sub-folder per class (PNG/JPEG, decoded with Pillow as they are read);
    PATH/train, PATH/val and PATH/test sub-folders are used when present."""

    name: str = "imagefolder"
    path: str = MISSING
    # Resize the shorter side to image_size, then crop to crop_size (center, or random).
    image_size: Optional[int] = None
    crop_size: Optional[int] = None
    random_crop: bool = False
    random_flip: bool = False
    # Per-channel normalization after scaling pixels to [0, 1]; null = none.
    mean: Optional[list[float]] = None
    std: Optional[list[float]] = None
    channels: int = 3
    prefetch_factor: int = 2
    # One folder split by val/test_fraction: keep each class's share in every split (the
    # YAML sets true; runs stored before it existed split by a plain permutation).
    stratify: bool = False


DataConfig = Union[
    BreastCancerConfig,
    DigitsConfig,
    MnistConfig,
    Cifar10Config,
    FilesConfig,
    SyntheticConfig,
    CustomDataConfig,
    ImageFolderConfig,
]
DATA_SCHEMAS: dict[str, type] = {
    "breast_cancer": BreastCancerConfig,
    "digits": DigitsConfig,
    "mnist": MnistConfig,
    "cifar10": Cifar10Config,
    "files": FilesConfig,
    "synthetic": SyntheticConfig,
    "custom": CustomDataConfig,
    "imagefolder": ImageFolderConfig,
}
# Sources read lazily as Datasets (a DataLoader per split), not as arrays in memory.
DATASET_SOURCES = ("custom", "imagefolder")


# ----------------------------------------------------------------------------- task
@dataclass
class ClassificationTaskConfig:
    """Cross-entropy on integer class labels; metric: accuracy."""

    name: str = "classification"


class LabelKind(str, Enum):
    classes = "classes"
    numbers = "numbers"


@dataclass
class CustomTaskConfig:
    name: str = "custom"
    # "package.module:function", called as function(model, batch, **kwargs) and returning
    # (loss, {metric_name: value}): the batch's mean loss (a scalar tensor) and mean metrics.
    target: str = MISSING
    kwargs: dict[str, Any] = field(default_factory=dict)
    # "package.module:function" for `hpcdl predict`, called as function(model, batch) (eval
    # mode, no gradients) and returning a tensor or {name: tensor} with one entry or row per
    # sample; null: predict refuses the run. Frozen with the code on Slurm like target.
    predict: Optional[str] = None
    # "package.module:function" called as function(means) with a split's mean loss and
    # metrics ({"loss": ..., name: ...}) and returning {name: number}: metrics that are no
    # mean over the samples (a perplexity: exp of the mean loss), as train_/val_/test_<name>.
    derived: Optional[str] = None
    # How data=files (and data=custom) labels reach the function: classes (integers or
    # names, as class indices 0..K-1) or numbers (float32 values as they are, one model
    # output): a numeric target with your own loss.
    labels: LabelKind = LabelKind.classes


def numeric_targets(task: object) -> bool:
    """Whether the run's labels are numbers (one model output, no classes): task=regression,
    or task=custom with task.labels=numbers."""
    if isinstance(task, RegressionTaskConfig):
        return True
    return isinstance(task, CustomTaskConfig) and task.labels == LabelKind.numbers


class RegressionLoss(str, Enum):
    mse = "mse"
    l1 = "l1"


@dataclass
class RegressionTaskConfig:
    """One numeric target per sample; metrics: mae, rmse, r2 (in the target's units)."""

    name: str = "regression"
    loss: RegressionLoss = RegressionLoss.mse
    # Train on (y - mean) / std of the training targets (built-in sources); metrics and
    # predictions stay in the target's own units.
    standardize_target: bool = True


TaskConfig = Union[ClassificationTaskConfig, RegressionTaskConfig, CustomTaskConfig]
TASK_SCHEMAS: dict[str, type] = {
    "classification": ClassificationTaskConfig,
    "regression": RegressionTaskConfig,
    "custom": CustomTaskConfig,
}
# The data sources that can hold a numeric regression target.
REGRESSION_SOURCES = ("files", "custom")


# ----------------------------------------------------------------------------- optim
@dataclass
class SgdConfig:
    name: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0
    # One fused kernel per step ("auto": on CUDA, or with trainer.lagged_sync=true), which
    # can also skip a non-finite step on the device; true or false.
    fused: str = "auto"


@dataclass
class AdamConfig:
    name: str = "adam"
    lr: float = 0.001
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.0
    fused: str = "auto"  # as SgdConfig.fused


@dataclass
class AdamWConfig(AdamConfig):
    name: str = "adamw"
    weight_decay: float = 0.01


@dataclass
class RmspropConfig:
    name: str = "rmsprop"
    lr: float = 0.01
    alpha: float = 0.99
    momentum: float = 0.0
    eps: float = 1e-8
    weight_decay: float = 0.0


OptimConfig = Union[SgdConfig, AdamConfig, AdamWConfig, RmspropConfig]
OPTIM_SCHEMAS: dict[str, type] = {
    "sgd": SgdConfig,
    "adam": AdamConfig,
    "adamw": AdamWConfig,
    "rmsprop": RmspropConfig,
}


# ----------------------------------------------------------------------------- schedule
@dataclass
class ScheduleConfig:
    """Learning-rate schedule, stepped once per optimizer step."""

    name: str = "none"
    # Linear warmup from 0 over this many steps, in front of any schedule.
    warmup_steps: int = 0
    # step: multiply by gamma every step_size_epochs epochs.
    step_size_epochs: int = 10
    gamma: float = 0.1
    # cosine: decay to min_lr_ratio * lr by the last step.
    min_lr_ratio: float = 0.0
    # onecycle: peak at max_lr_ratio * lr after pct_start of the run.
    max_lr_ratio: float = 10.0
    pct_start: float = 0.3


SCHEDULE_NAMES = ("none", "step", "cosine", "onecycle", "warmup")


# ----------------------------------------------------------------------------- trainer
class Precision(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class Mode(str, Enum):
    min = "min"
    max = "max"


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


@dataclass
class EarlyStoppingConfig:
    monitor: str = "val_loss"
    # Whether lower (min) or higher (max) is better; None (auto): the monitored metric's
    # own direction (hpcdl.config.metrics.monitor_mode), decided where it is read, so a
    # resume that changes the monitor also changes the direction.
    mode: Optional[Mode] = None
    # Evaluations without improvement before stopping; 0 = off.
    patience: int = 0
    min_delta: float = 0.0
    # Stop once the monitored metric reaches this value (<= for mode=min, >= for max).
    target: Optional[float] = None


@dataclass
class TrainerConfig:
    max_epochs: int = 30
    # When set, training stops after this many optimizer steps (may end mid-epoch).
    max_steps: Optional[int] = None
    # Global batch size: split across all ranks.
    batch_size: int = 32
    # Each rank's share of a step's batch run as this many forward/backward passes
    # (gradient accumulation: a K-th of the activation memory, the same step).
    micro_batches: int = 1
    precision: Precision = Precision.fp32
    compile: bool = False
    channels_last: bool = False
    grad_clip_norm: Optional[float] = None
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    # Validation runs at every epoch end, and also every N steps / S seconds when set.
    eval_every_steps: Optional[int] = None
    eval_every_s: Optional[float] = None
    # A checkpoint is saved at every epoch end, and also every N steps / S seconds when set.
    checkpoint_every_steps: Optional[int] = None
    checkpoint_every_s: Optional[float] = None
    keep_last: int = 2
    # Milestones: the checkpoint saved at the end of every K-th epoch is kept forever, besides
    # the keep_last newest (each one a full checkpoint on disk). None: off.
    keep_every_epochs: Optional[int] = None
    # Write checkpoints in a background thread from a copy in host memory: "auto" (on when
    # training on CUDA), "true" or "false". A string, not an Enum: a bare true/false on the
    # command line reaches the schema as a bool, which an Enum field refuses.
    async_checkpoint: str = "auto"
    # Read each step's loss sums and agreed flags (stop, eval/save due) one step later, so
    # the host queues the next step before waiting for this one: "auto" (on when training
    # on CUDA with a fused optimizer), "true" (needs optim sgd, adam or adamw) or "false".
    lagged_sync: str = "auto"
    deterministic: bool = False
    seed: int = 0
    # Non-finite losses in a row before the run stops with an error.
    max_bad_steps: int = 5
    # Progress line interval (steps) when stdout is not a terminal.
    log_every_steps: int = 50
    device: Device = Device.auto
    # A rank with no optimizer step for this long dumps its stacks and exits (the stall
    # watchdog); the first step gets stall_first_step_s (null: twice this), an evaluation
    # this much again from its start. Also the timeout of every collective (the first
    # step's allowance until the first step is done).
    stall_timeout_s: float = 1800.0
    stall_first_step_s: Optional[float] = None
    # Telemetry (RUN_DIR/telemetry, `hpcdl status`): warn when the GPU stays below this.
    low_gpu_util_pct: float = 30.0
    # 'package.module:function' called after every optimizer step with a StepEvent
    # (hpcdl.hooks); frozen with the code on Slurm like model.target.
    step_hooks: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- cluster
class Launcher(str, Enum):
    debug = "debug"
    local = "local"
    slurm = "slurm"


class Requeue(str, Enum):
    scontrol = "scontrol"  # the job requeues itself (`scontrol requeue`): same job id
    chain = "chain"  # the job submits its continuation (`--dependency=afterany:<id>`)


class ContainerRuntime(str, Enum):
    apptainer = "apptainer"  # `apptainer exec --nv --bind ... IMAGE python3 ...` inside srun
    singularity = "singularity"  # the same, for sites that still call it singularity
    pyxis = "pyxis"  # `srun --container-image=IMAGE --container-mounts=...` (enroot)


@dataclass
class ContainerConfig:
    """Run each rank inside a container image (Slurm profiles only). Off while image is
    null. The image needs Python with torch and hpcdl's dependencies; hpcdl itself and
    the user's modules come from the frozen code dir, which is mounted with the run dir."""

    image: Optional[str] = (
        None  # a .sif file or sandbox dir; pyxis: e.g. nvcr.io#nvidia/pytorch:25.01-py3
    )
    runtime: ContainerRuntime = ContainerRuntime.apptainer
    # More host paths to mount (data, scratch): "/scratch" or "/host/path:/in/container".
    binds: list[str] = field(default_factory=list)
    # The interpreter inside the image.
    python: str = "python3"


@dataclass
class ClusterConfig:
    name: str = "debug"
    launcher: Launcher = Launcher.debug
    nodes: int = 1
    # Ranks per node; null = gpus_per_node (one task per GPU), or 1 without GPUs.
    tasks_per_node: Optional[int] = None
    gpus_per_node: int = 0
    gpu_type: Optional[str] = None
    cpus_per_task: int = 1
    mem_gb: Optional[int] = None
    timeout_min: int = 60
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    # Signal sent signal_delay_s before the time limit (USR2: NCCL may catch USR1).
    signal: str = "USR2"
    signal_delay_s: int = 120
    max_requeues: int = 3
    # How a stopped job comes back: `scontrol requeue`, or a chain of jobs where requeue is
    # unavailable (inside containers, or JobRequeue disabled by the site).
    requeue: Requeue = Requeue.scontrol
    # A stalled job (trainer.stall_timeout_s) requeues itself instead of only ending.
    requeue_on_stall: bool = False
    # Shell lines run before the payload, e.g. "module load cuda".
    setup: list[str] = field(default_factory=list)
    # The interpreter the Slurm job's ranks run: a name looked up on the node's PATH after
    # `setup` (python3), or an absolute path; null = the one running hpcdl here. Not with a
    # container, whose interpreter is container.python.
    python: Optional[str] = None
    sbatch_extra: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    rendezvous_timeout_s: int = 300
    # Job-array concurrency limit (%N) for sweeps; 0 = no limit.
    array_parallelism: int = 0
    container: ContainerConfig = field(default_factory=ContainerConfig)


# ----------------------------------------------------------------------------- logger
class WandbMode(str, Enum):
    offline = "offline"  # written under RUN_DIR/wandb; `wandb sync` uploads it afterwards
    online = "online"  # streamed to the W&B server: needs internet on the compute nodes


@dataclass
class TensorBoardConfig:
    """Event files in RUN_DIR/tensorboard, one log dir for every attempt of the run."""

    enabled: bool = False  # set by conf/logger/tensorboard.yaml


@dataclass
class WandbConfig:
    enabled: bool = False  # set by conf/logger/wandb.yaml
    project: str = "hpcdl"
    entity: Optional[str] = None
    # Display name; null: the run dir's name.
    name: Optional[str] = None
    # W&B group; null: a sweep's trials are grouped by their sweep dir's name.
    group: Optional[str] = None
    tags: list[str] = field(default_factory=list)
    mode: WandbMode = WandbMode.offline


@dataclass
class MlflowConfig:
    enabled: bool = False  # set by conf/logger/mlflow.yaml
    # null: a file store in RUN_DIR/mlruns (no server needed); or e.g. http://host:5000.
    tracking_uri: Optional[str] = None
    experiment: str = "hpcdl"
    # Run name; null: the run dir's name.
    run_name: Optional[str] = None


@dataclass
class LoggerConfig:
    """Experiment trackers beside metrics.csv, which is always written. A tracker is on
    when its YAML is chosen (logger=tensorboard, or several: logger=[tensorboard,wandb]),
    which sets its `enabled`; the keys of a tracker that is off are kept but unused."""

    tensorboard: TensorBoardConfig = field(default_factory=TensorBoardConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)

    def chosen(self) -> list[str]:
        """The trackers that are on, in a fixed order."""
        return [name for name in TRACKER_PACKAGES if getattr(self, name).enabled]


# The import name and the pip extra of each tracker (checked before the run dir exists).
TRACKER_PACKAGES: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "hpcdl[tensorboard]"),
    "wandb": ("wandb", "hpcdl[wandb]"),
    "mlflow": ("mlflow", "hpcdl[mlflow]"),
}


# ----------------------------------------------------------------------------- scripts
class ScriptLauncher(str, Enum):
    srun = "srun"  # one task per GPU (or cluster.tasks_per_node), the rank env exported
    torchrun = "torchrun"  # one task per node running torchrun (c10d rendezvous)


@dataclass
class ScriptConfig:
    """`hpcdl run -- COMMAND...` or `hpcdl run entry=pkg.mod:fn`: the user's own program."""

    command: list[str] = field(default_factory=list)
    # "package.module:function", called with entry_kwargs in a fresh Python per rank.
    entry: Optional[str] = None
    entry_kwargs: dict[str, Any] = field(default_factory=dict)
    launcher: ScriptLauncher = ScriptLauncher.srun
    # A file (relative to the run dir) the script writes its metrics to, JSON object or
    # CSV with a header (last row wins): copied into summary.json for sweep summaries.
    metrics_file: Optional[str] = None
    # A rank whose program has written no output and made no hpcdl.api call for this long
    # is ended (its stacks dumped, a stall recorded, exit status 4); None: not watched.
    stall_timeout_s: Optional[float] = None


# ----------------------------------------------------------------------------- top level
@dataclass
class Config:
    # One of the group's dataclasses, picked by the YAML's `name` (OmegaConf never sees
    # this class: convert.py types each group on its own).
    model: ModelConfig = field(default_factory=MlpConfig)
    data: DataConfig = field(default_factory=BreastCancerConfig)
    task: TaskConfig = field(default_factory=ClassificationTaskConfig)
    optim: OptimConfig = field(default_factory=SgdConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    # Decided once, at submit time; requeues and reruns reuse it.
    run_dir: Optional[str] = None
    # Warm start: a run dir or checkpoint file; weights only, fresh optimizer.
    init_from: Optional[str] = None
    # Set by `hpcdl run`: the job runs this program instead of hpcdl's trainer.
    script: Optional[ScriptConfig] = None
    # The folder the run was created from (absolute), recorded once with run_dir: every
    # attempt runs there, and resume, evaluate and predict read its relative paths from
    # there. None: a run created before hpcdl recorded it (today's folder is used).
    workdir: Optional[str] = None

    @property
    def world_size(self) -> int:
        return self.cluster.nodes * tasks_per_node(self.cluster)


def slurm_tasks_per_node(cfg: Config) -> int:
    """Slurm tasks per node: one per rank, or one torchrun per node for `hpcdl run
    launcher=torchrun` (torchrun then starts tasks_per_node workers)."""
    if cfg.script is not None and cfg.script.launcher == ScriptLauncher.torchrun:
        return 1
    return tasks_per_node(cfg.cluster)


def tasks_per_node(cluster: ClusterConfig) -> int:
    if cluster.tasks_per_node is not None:
        return cluster.tasks_per_node
    return max(1, cluster.gpus_per_node)
