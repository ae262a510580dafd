"""P1 and P2: hpcdl's training loop vs loops doing the same work without it.

The same work for every loop (benchmarks.loops.Work): the model hpcdl builds from the
case's config, its optimizer, its own split of the bundled data's training rows, the
batch size and precision. hpcdl's rows stay resident on the device (data.in_memory=true,
the default for the bundled sets). Per round, interleaved, one run each of:

    hand        the hand-written loop, the strict baseline: randperm, x[idx] slicing of the
                resident rows, one loss read per epoch
    hpcdl       hpcdl's job payload, in this process, as `hpcdl train cluster=debug` runs it
    dataloader  DataLoader(TensorDataset(x, y), batch_size, shuffle=True): rows on the
                host, default collate, no workers
    lightning   a Lightning Trainer(barebones=True) on the hand loop's batches
                (benchmarks.lightning_loop; left out, with a note, when not installed)

hpcdl adds its per-step work on top of the step: the task's statistics, the all-reduced
step sums (loss, samples, non-finite count, stop/eval/save flags), the schedule step, the
progress line, the step hooks. A step hook (benchmarks.hooks.record_time) stamps the time
after every step, in every loop. Epoch 0 of each run is warm-up and not counted.
"""

from __future__ import annotations

import collections
import itertools
import statistics
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from benchmarks import hooks, lightning_loop, loops
from benchmarks.base import Row, Settings
from benchmarks.inprocess import create_run, environ, run_in_process
from benchmarks.lazy_epoch import compared, epoch_times
from benchmarks.timing import interleaved, median_ratio

# P2: on a GPU, hpcdl's resident-data epoch should take at most a third of the
# DataLoader(TensorDataset) loop's, for small data. On a CPU the batch is copied either way.
GPU_VS_DATALOADER_GOAL = 1 / 3


# P1's goals for hpcdl's loop / the hand loop: on a CPU; on a GPU for the tiny models (a
# case's own gpu_goal where it has one: ResNet-18 in bf16).
CPU_GOAL = 1.05
GPU_GOAL = 1.10


@dataclass(frozen=True)
class Case:
    name: str
    overrides: tuple[str, ...]  # model, data, batch size: the rest is hpcdl's defaults
    epochs: int  # 1 warm-up + measured (>= 2 measured: epoch_times needs a boundary)
    gpu_goal: float = GPU_GOAL


FULL = (
    # The workshop's MLP on breast cancer at hpcdl's defaults (batch 32): a tiny model,
    # where a framework's per-step cost shows most.
    Case("mlp", ("model=mlp", "data=breast_cancer", "trainer.batch_size=32"), 6),
    Case("cnn", ("model=cnn", "data=digits", "trainer.batch_size=64"), 4),
)
SMOKE = (Case("mlp", ("model=mlp", "data=breast_cancer", "trainer.batch_size=128"), 3),)
# Only where CUDA is: P1's ResNet-18 in bf16 on CIFAR-shaped data (synthetic 3x32x32
# images of 10 classes; seconds a step on a CPU).
GPU_ONLY = (
    Case(
        "resnet18",
        (
            "model=resnet18",
            "data=synthetic",
            "data.shape=[3,32,32]",
            "data.num_classes=10",
            "data.num_samples=16384",
            "data.val_fraction=0.25",  # 10240 training rows: 40 full batches
            "data.test_fraction=0.125",
            "trainer.batch_size=256",
            "trainer.precision=bf16",
        ),
        4,
        gpu_goal=1.03,
    ),
)


def run(settings: Settings) -> list[Row]:
    settings.work_dir.mkdir(parents=True)
    with_lightning = lightning_loop.version() is not None
    if not with_lightning:
        print(f"  {lightning_loop.NOT_INSTALLED}", flush=True)
    rows: list[Row] = []
    for case in cases(settings.smoke):
        rows += rows_from(measure(case, settings, with_lightning))
    return rows


def cases(smoke: bool) -> tuple[Case, ...]:
    import torch

    if smoke:
        return SMOKE
    return FULL + GPU_ONLY if torch.cuda.is_available() else FULL


def overrides_for(case: Case) -> list[str]:
    return [
        *case.overrides,
        f"trainer.max_epochs={case.epochs}",
        "trainer.step_hooks=[benchmarks.hooks:record_time]",
        "trainer.log_every_steps=1000000",
        "trainer.early_stopping.patience=1000",
    ]


@dataclass
class Measured:
    case: Case
    rounds: dict[str, list[dict[str, float]]]  # loop -> each round's epoch_times
    num_steps_per_epoch: int
    device: str  # "cpu", "cuda"
    lightning: Optional[str] = None  # its version, when it ran
    setup: dict[str, Any] = field(default_factory=dict)  # for the rows' details
    # loop -> weights_sha256 of its final weights, each run (warm-up rounds included)
    weights: dict[str, list[str]] = field(default_factory=dict)

    def same_weights(self, loop: str, baseline: str = "hand") -> Optional[bool]:
        """Whether every run of `loop` ended with the baseline's final weights, bit for
        bit (the loops draw hpcdl's epoch orders and seeds); None when not recorded."""
        ours, theirs = self.weights.get(loop), self.weights.get(baseline)
        if not ours or not theirs:
            return None
        return len(set(ours) | set(theirs)) == 1


def measure(case: Case, settings: Settings, with_lightning: bool = True) -> Measured:
    """Every loop's epoch times, `settings.repeats` rounds after the warm-up rounds."""
    from hpcdl.provenance import weights_sha256

    work_dir = settings.work_dir
    counter = itertools.count()
    found: dict[str, Any] = {}
    weights: dict[str, list[str]] = collections.defaultdict(list)  # loop -> each run's

    def baseline(name: str, loop: Callable[[loops.Work, int], None]) -> Callable[[], Any]:
        def call() -> dict[str, float]:
            times = work_dir / f"{case.name}-{name}-{next(counter)}.times"
            work = loops.build_work(overrides_for(case))
            found.update(steps=work.num_steps_per_epoch, device=work.device.type)
            log = settings.log
            records = {hooks.TIMES_VAR: str(times), hooks.STEPS_VAR: str(work.num_steps_per_epoch)}
            with environ(records), redirect_stdout(log), redirect_stderr(log):
                loop(work, case.epochs)
            weights[name].append(weights_sha256(work.model.state_dict()))
            return epoch_times(hooks.read_records(times), work.num_steps_per_epoch)

        return call

    def hpcdl_run() -> dict[str, float]:
        index = next(counter)
        times = work_dir / f"{case.name}-hpcdl-{index}.times"
        run_dir = create_run(overrides_for(case), work_dir / f"{case.name}-run-{index}")
        records = {hooks.TIMES_VAR: str(times), hooks.STEPS_VAR: str(found["steps"])}
        run_in_process(run_dir, settings.log, records)
        summary = run_dir.read_summary()
        if summary is None:
            raise RuntimeError(f"{run_dir.path}: the run wrote no summary")
        weights["hpcdl"].append(summary["weights_sha256"])
        return epoch_times(hooks.read_records(times), found["steps"])

    # The hand loop runs first in each round: it also tells how many steps an epoch has.
    candidates = {
        "hand": baseline("hand", loops.raw_slicing_loop),
        "hpcdl": hpcdl_run,
        "dataloader": baseline("dataloader", loops.dataloader_loop),
    }
    if with_lightning:
        candidates["lightning"] = baseline("lightning", lightning_loop.lightning_loop)
    rounds = interleaved(candidates, settings.repeats, settings.warmup_rounds)
    return Measured(
        case=case,
        rounds=rounds,
        num_steps_per_epoch=found["steps"],
        device=found["device"],
        lightning=lightning_loop.version() if with_lightning else None,
        setup={"case": asdict(case), "num_steps_per_epoch": found["steps"]},
        weights=dict(weights),
    )


def rows_from(m: Measured) -> list[Row]:
    name, setup = m.case.name, {**m.setup, "device": m.device}
    hpcdl, hand = m.rounds["hpcdl"], m.rounds["hand"]
    loop, step = compared(hpcdl, hand, "loop"), compared(hpcdl, hand, "step")
    period = compared(hpcdl, hand, "period")
    dataloader = m.rounds["dataloader"]
    vs_loader = compared(hpcdl, dataloader, "loop")
    rows = [
        Row(
            id=f"overhead.{name}.loop",
            what=f"hpcdl's training loop over one epoch ({' '.join(m.case.overrides)}), rows "
            "resident on the device: first to last step, no epoch boundary",
            baseline="a hand-written loop: same model, optimizer, rows (one tensor on the "
            "device, randperm, x[idx] slicing), batch size; one loss read per epoch",
            ratio=loop.pop("ratio"),
            goal=m.case.gpu_goal if m.device == "cuda" else CPU_GOAL,
            details={
                **loop,
                "step": step,
                # Same seeds and orders: the same arithmetic, so the same final weights.
                "final_weights_identical_to_hand": m.same_weights("hpcdl"),
                **setup,
            },
        ),
        Row(
            id=f"overhead.{name}.epoch",
            what="a whole hpcdl epoch, last step to last step: the loop plus the epoch end "
            "(validation pass, checkpoint, metrics row)",
            baseline="a whole hand-written epoch (its loop and its epoch's loss read; no "
            "validation, no checkpoint)",
            ratio=period.pop("ratio"),
            goal=None,
            details={**period, **setup},
        ),
        Row(
            id=f"overhead.{name}.vs_dataloader",
            what="hpcdl's training loop over one epoch, rows resident on the device (as in "
            f"overhead.{name}.loop)",
            baseline="a DataLoader(TensorDataset(x, y), batch_size, shuffle=True) loop: rows "
            "on the host, default collate, no workers, each batch copied to the device; "
            "same model, optimizer, batch size; one loss read per epoch",
            ratio=vs_loader.pop("ratio"),
            goal=GPU_VS_DATALOADER_GOAL if m.device == "cuda" else None,
            details={
                **vs_loader,
                "step": compared(hpcdl, dataloader, "step"),
                # The DataLoader's price by itself: the same loop with x[idx] batches.
                "dataloader_vs_hand": compared(dataloader, hand, "loop")["ratio"],
                **setup,
            },
        ),
    ]
    if m.lightning is not None:
        lightning = m.rounds["lightning"]
        vs_lightning = compared(hpcdl, lightning, "loop")
        rows.append(
            Row(
                id=f"overhead.{name}.lightning",
                what=f"hpcdl's training loop over one epoch (as in overhead.{name}.loop)",
                baseline=f"Lightning {m.lightning}, Trainer(barebones=True) on one device: "
                "same model, optimizer, resident rows and batches (randperm, x[idx]), batch "
                "size; timed the same way, from a callback after each optimizer step",
                ratio=vs_lightning.pop("ratio"),
                goal=1.0,  # faster than Lightning
                details={
                    **vs_lightning,
                    "step": compared(hpcdl, lightning, "step"),
                    # The way round: how many times longer Lightning's epoch takes.
                    "lightning_over_hpcdl": median_ratio(
                        [r["loop"] for r in lightning], [r["loop"] for r in hpcdl]
                    ),
                    "lightning_version": m.lightning,
                    "final_weights_identical_to_hand": m.same_weights("lightning"),
                    **setup,
                },
            )
        )
    return rows


LOOP_NAMES = {  # table order
    "hpcdl": "hpcdl",
    "hand": "hand-written: randperm, x[idx]",
    "dataloader": "DataLoader(TensorDataset, shuffle=True)",
    "lightning": "Lightning {version}, Trainer(barebones=True)",
}


def table(m: Measured) -> str:
    """`hpcdl bench overhead`'s table: each loop's epoch and step (medians over rounds), and
    its epoch / hpcdl's epoch (the median of the rounds' ratios), and whether it ended with
    hpcdl's final weights, bit for bit (the DataLoader draws its own order: it cannot)."""
    hpcdl = [r["loop"] for r in m.rounds["hpcdl"]]
    lines = [
        "| loop | epoch (ms) | step (ms) | time / hpcdl's | hpcdl's final weights |",
        "|---|---|---|---|---|",
    ]
    for key, name in LOOP_NAMES.items():
        if key not in m.rounds:
            continue
        rounds = m.rounds[key]
        epoch_ms = 1e3 * statistics.median(r["loop"] for r in rounds)
        step_ms = 1e3 * statistics.median(r["step"] for r in rounds)
        ratio = median_ratio([r["loop"] for r in rounds], hpcdl)
        label = name.format(version=m.lightning)
        same = None if key == "hpcdl" else m.same_weights(key, "hpcdl")
        weights = {None: "-", True: "identical", False: "differ"}[same]
        lines.append(f"| {label} | {epoch_ms:.2f} | {step_ms:.3f} | {ratio:.2f}x | {weights} |")
    return "\n".join(lines)
