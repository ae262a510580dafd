"""The training loop: restore -> for step -> train_step -> log -> maybe evaluate -> maybe save.

Knows nothing about Slurm, submitit or Hydra: it gets typed config, its rank identity and
built parts, and returns how it ended. Every rank runs the same steps; one small
all-reduce per step carries the loss sums and the agreed flags (non-finite loss, stop
requested, eval/save due), so all ranks decide the same thing at the same step boundary.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from hpcdl import early_stop
from hpcdl.checkpoint import CheckpointStore, capture_rng_state, restore_rng_state, unmap
from hpcdl.config.metrics import monitor_mode, reads_as_neither
from hpcdl.config.schema import Config, EarlyStoppingConfig, Mode, Precision
from hpcdl.data.feed import Feed, TrainBatch
from hpcdl.data.loader import channels_last_inputs
from hpcdl.data.sharding import EpochSharder
from hpcdl.deferred_stats import DeferredStats
from hpcdl.dist import all_gather_objects, all_reduce_sum, set_collective_timeout
from hpcdl.env import RankEnv
from hpcdl.errors import (
    CheckpointError,
    DeviceMemoryError,
    HpcdlError,
    RunDirError,
    plural,
)
from hpcdl.evaluation import EvalResult, evaluate
from hpcdl.hooks import StepEvent, StepHook
from hpcdl.nothing_to_train import limit_reached_line
from hpcdl.optim import StepSchedule, load_optimizer_state, match_parameter_layout
from hpcdl.progress import ProgressReporter
from hpcdl.provenance import collect_versions, weights_sha256
from hpcdl.rundir import EPOCHS_NEEDING_A_CHECKPOINT, MetricsLog, RunDir
from hpcdl.signals import StopFlag
from hpcdl.state import Progress
from hpcdl.step_sums import StepSums, Value, mean_of
from hpcdl.step_sync import (
    HostCopies,
    InFlight,
    found_inf_of,
    reduce_on_device,
    skip_on_device,
    solo_sums,
)
from hpcdl.tasks import BatchStats, ClassificationTask, RegressionTask, Task, check_monitor
from hpcdl.telemetry import Telemetry
from hpcdl.trackers.base import Logger, NullLogger
from hpcdl.watchdog import Watchdog, first_step_allowance

FORMAT_VERSION = 1


class Outcome(str, Enum):
    completed = "completed"
    interrupted = "interrupted"


@dataclass
class FitResult:
    outcome: Outcome
    progress: Progress
    signal_name: Optional[str] = None
    checkpoint: Optional[Path] = None


@dataclass
class Parts:
    """Everything the loop works on, built once by hpcdl.build."""

    feed: Feed
    raw_model: nn.Module  # plain module: state dicts, evaluation
    model: nn.Module  # what the step calls: maybe DDP- and compile-wrapped
    optimizer: torch.optim.Optimizer
    scheduler: StepSchedule
    scaler: torch.amp.GradScaler
    sharder: EpochSharder
    store: CheckpointStore
    metrics: MetricsLog
    reporter: ProgressReporter
    device: torch.device
    config_hash: str
    model_config: dict[str, Any]
    data_config: dict[str, Any]  # in checkpoints: a resume names the keys that changed
    task: Task = field(default_factory=ClassificationTask)
    step_hooks: list[StepHook] = field(default_factory=list)  # trainer.step_hooks
    logger: Logger = field(default_factory=NullLogger)  # logger=tensorboard/wandb/mlflow
    telemetry: Optional[Telemetry] = None  # step time, GPU figures at the log interval


class NonFiniteLossError(HpcdlError):
    """Too many non-finite losses in a row."""


@dataclass
class Start:
    """Where fit() begins: the newest valid checkpoint (None: from the start), and the first
    epoch's batches when their loader was started early (hpcdl.build starts it before it
    builds the model, so the loader's workers read ahead meanwhile)."""

    checkpoint: Optional[tuple[Path, dict[str, Any]]] = None
    batches: Optional[Iterator[TrainBatch]] = None

    def progress(self, sharder: EpochSharder, early_stopping: EarlyStoppingConfig) -> Progress:
        if self.checkpoint is None:
            return Progress()
        return resumed_progress(*self.checkpoint, sharder, early_stopping)


def resumed_progress(
    path: Path, state: dict[str, Any], sharder: EpochSharder, early_stopping: EarlyStoppingConfig
) -> Progress:
    """Where a checkpoint's run goes on. A run that stopped early trains on when the resume
    changes trainer.early_stopping (hpcdl.early_stop). Saved mid-epoch with another
    trainer.batch_size (lowered after running out of memory, say), the epoch goes on at the
    same sample of its permutation, so that each sample is still trained once per epoch,
    when a batch of the new size can start there; else refused (samples would be skipped or
    repeated).
    Checkpoints saved before they recorded their batch size are taken as they are."""
    progress = Progress.from_dict(state["progress"])
    progress = early_stop.resumed(progress, state.get("early_stopping"), early_stopping)
    saved = state.get("batch_size")
    if saved is None or saved == sharder.global_batch_size or progress.step_in_epoch == 0:
        return progress
    consumed = min(progress.step_in_epoch * saved, sharder.num_samples)
    step = sharder.step_starting_at(consumed)
    if step is None:
        others = [size for size in sharder.batch_sizes_starting_at(consumed) if size != saved]
        fits = " or ".join(map(str, others))
        raise CheckpointError(
            f"{path} was saved {consumed} samples into epoch {progress.epoch + 1} with "
            f"trainer.batch_size={saved}; batches of {sharder.global_batch_size} cannot start "
            f"there (samples would be skipped or repeated): resume with "
            f"trainer.batch_size={saved}{f' or {fits}' if fits else ''}, and change it when "
            f"the epoch is over (trainer.max_epochs={progress.epoch + 1}, then resume again)"
        )
    progress.step_in_epoch = step
    return progress


# What checkpoint.json holds of a checkpoint (hpcdl.nothing_to_train and the split check
# of `hpcdl resume` read it): plain data, no tensors.
CHECKPOINT_RECORD_KEYS = ("progress", "batch_size", "early_stopping", "data_config")


def saved_with(saved: dict[str, Any], now: dict[str, Any], group: str) -> str:
    """' (model.hidden_sizes=[32, 16])': the saved config's values where this run's differ."""
    keys = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
    return f" ({' '.join(f'{group}.{k}={saved.get(k)}' for k in keys)})" if keys else ""


def config_changes(state: dict[str, Any], parts: Parts) -> str:
    """'data.num_workers 2 -> 0 changed': the model and data keys whose values differ from
    the checkpoint's (a checkpoint saved before it held its data config names none)."""

    def shown(value: Any) -> str:
        return str(value).lower() if isinstance(value, bool) or value is None else str(value)

    changes = []
    for group, saved, now in [
        ("model", state.get("model_config"), parts.model_config),
        ("data", state.get("data_config"), parts.data_config),
    ]:
        if saved is None:
            continue
        keys = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
        changes += [f"{group}.{k} {shown(saved.get(k))} -> {shown(now.get(k))}" for k in keys]
    return f"{', '.join(changes) or 'model/data config'} changed"


class Trainer:
    # Set by the job payload (hpcdl.job): told of every step and of each phase with its
    # own allowance. None: no stall watchdog (tests, benchmarks driving the trainer).
    watchdog: Optional[Watchdog] = None

    def __init__(
        self, cfg: Config, env: RankEnv, parts: Parts, stop: StopFlag, start: Optional[Start] = None
    ) -> None:
        self.cfg = cfg
        self.t = cfg.trainer
        self.env = env
        self.p = parts
        self.stop = stop
        parts.reporter.on_closed = self._output_closed
        self.progress = Progress()
        self.autocast_dtype = {
            Precision.fp32: None,
            Precision.bf16: torch.bfloat16,
            Precision.fp16: torch.float16,
        }[self.t.precision]
        self._last_save = self._last_eval = time.monotonic()
        # When this attempt began (hpcdl.job sets its job's start) and the wall time of the
        # attempts before it, up to the checkpoint restored: Progress.wall_s at each save.
        self.attempt_started = self._last_save
        self._wall_s_before = 0.0
        self._last_saved_step = -1
        self._last_saved_path: Optional[Path] = None
        self._monitor_checked = False
        self._steady = False  # the collectives' timeout is the first step's allowance
        self._asked: Optional[float] = None  # when fit() asked for the next batch
        self._start = start or Start(checkpoint=parts.store.load_latest(mmap=True))
        # An epoch's batches whose loader has started reading ahead (see Start).
        self._pending: Optional[Iterator[TrainBatch]] = self._start.batches
        self.lagged = lagged_sync(self.t.lagged_sync, parts.device, parts.optimizer)
        self._in_flight: Optional[InFlight] = None  # lagged: the latest step's sums, unread
        self._copies = HostCopies()  # lagged: their pinned buffers
        self._last_loss = float("nan")  # the latest step's mean loss read on the host
        self._unlogged: list[tuple[int, float]] = []  # (step, loss) not yet sent to the tracker
        # The gradient norm of each step a tracker keeps (on the device until it is sent):
        # only where a tracker gets it, and only those steps, so no other step pays for it.
        self._tracks_grad_norm = not isinstance(parts.logger, NullLogger)
        self._grad_norms: dict[int, torch.Tensor] = {}
        self._loss_gradients: dict[tuple[float, torch.dtype, torch.device], torch.Tensor] = {}
        # One rank reading each step's sums at once: the task's statistics (classification's
        # correct predictions) are counted a chunk of steps at a time (hpcdl.deferred_stats).
        task = parts.task
        defer = task.defers_stats and env.world_size == 1
        self._deferred = DeferredStats(task.stats_of) if defer else None
        self._task_step = task.batch_loss if defer else task.batch_stats  # (model, batch)

    # ------------------------------------------------------------------ the loop
    def fit(self) -> FitResult:
        try:
            return self._fit()
        except BaseException as exc:
            self._wait_for_checkpoint_after_error()
            self.p.logger.close(failed=True)
            short = out_of_memory(exc)
            if short is None:
                raise
            t = self.t
            raise DeviceMemoryError(
                f"out of {self.p.device.type} memory at global step {self.progress.global_step} "
                f"(trainer.batch_size={t.batch_size}, trainer.precision={t.precision.value}): "
                "lower trainer.batch_size, split each step's batch with trainer.micro_batches="
                f"{2 * t.micro_batches}, train in trainer.precision=bf16, or spread the batch "
                f"over more GPUs (cluster.gpus_per_node); the checkpoints are intact ({short})"
            ) from exc

    def _fit(self) -> FitResult:
        # The loaded state is dropped once restored: its tensors are mapped from the file.
        found, self._start.checkpoint = self._start.checkpoint, None
        self.restore(found)
        del found  # not held for the whole loop: a purged file's space must be freed
        first = first_step_allowance(self.t.stall_timeout_s, self.t.stall_first_step_s)
        self._beat("first step", first)  # imports, compilation, the first collective
        if self._stop_before_first_step():
            return self.interrupt()
        while not self.finished():
            self.p.reporter.start_epoch(
                self.progress.epoch, self.progress.step_in_epoch, self.p.sharder.num_steps_per_epoch
            )
            self._asked = time.monotonic()  # for the epoch's first batch
            for step_in_epoch, batch, global_count in self._take_batches():
                flags = self.train_step(batch, global_count)
                self._beat()
                self.run_step_hooks()
                if self._in_flight is not None and self._must_settle(flags):
                    flags = self._settle(flags)
                self.log_step(step_in_epoch, flags)
                if flags["eval_due"]:
                    _, improved = self.evaluate_and_track()
                    if improved:
                        self.save(is_best=True)
                if flags["stop"]:
                    return self.interrupt()
                if flags["save_due"]:
                    self.save()
                if self.max_steps_reached():
                    break
                self._asked = time.monotonic()  # for the next batch
            self._read_ahead_next_epoch()
            self.end_epoch()
        return self.complete()

    def _output_closed(self) -> None:
        """stdout lost its reader (`hpcdl train | head`, in the foreground): stop at the next
        step with a checkpoint, as on a hangup (docs/reliability.md)."""
        if self.stop.signal_name is None:
            self.stop.signal_name = "SIGHUP"

    def _stop_before_first_step(self) -> bool:
        """A stop asked for while the job was starting (imports, rendezvous, build, restore:
        a requeue or preemption right after the start) ends it now, before any step, where
        the checkpoint on disk already is, instead of after a first step that Slurm's
        KillWait may not leave time for. The ranks agree first: a signal may have reached
        some of them only."""
        requested = float(self.stop.requested)
        if self.env.world_size > 1:
            flag = torch.tensor([requested], dtype=torch.float64, device=self.p.device)
            with self._waiting("the start"):
                requested = float(all_reduce_sum(flag).item())
        return requested > 0

    def batches(self) -> Iterator[TrainBatch]:
        pr = self.progress
        return self.p.feed.train_batches(self.p.sharder, pr.epoch, pr.step_in_epoch, self.p.device)

    def _beat(self, phase: str = "training", allowance_s: Optional[float] = None) -> None:
        if self.watchdog is not None:
            self.watchdog.beat(phase, allowance_s)

    def _waiting(self, what: str) -> contextlib.AbstractContextManager[None]:
        """A wait on the other ranks, as the stall watchdog names it (hpcdl.watchdog); one
        rank waits on none (its lagged read waits on its own GPU)."""
        if self.watchdog is None or self.env.world_size == 1:
            return contextlib.nullcontext()
        return self.watchdog.waiting(what)

    def _take_batches(self) -> Iterator[TrainBatch]:
        pending, self._pending = self._pending, None
        return pending if pending is not None else self.batches()

    def _read_ahead_next_epoch(self) -> None:
        """Start the next epoch's batches before this epoch's validation and checkpoint, so
        the loader's workers read ahead meanwhile (when the next epoch will run at all;
        early stopping may still end the run, and the batches read are then dropped)."""
        pr = self.progress
        if pr.step_in_epoch < self.p.sharder.num_steps_per_epoch or self.max_steps_reached():
            return
        if pr.early_stopped or pr.epoch + 1 >= self.t.max_epochs:
            return
        self._pending = self.p.feed.train_batches(self.p.sharder, pr.epoch + 1, 0, self.p.device)

    def finished(self) -> bool:
        pr = self.progress
        return pr.early_stopped or pr.epoch >= self.t.max_epochs or self.max_steps_reached()

    def max_steps_reached(self) -> bool:
        return self.t.max_steps is not None and self.progress.global_step >= self.t.max_steps

    # ------------------------------------------------------------------ one step
    def train_step(self, batch: Any, global_count: int) -> dict[str, bool]:
        # An epoch's time counts the wait for its batches too (a data-bound run shows as
        # one): from when fit() asked for this batch, else from now.
        started = time.monotonic() if self._asked is None else self._asked
        p, pr = self.p, self.progress
        if self.t.channels_last:
            batch = channels_last_inputs(batch)
        p.optimizer.zero_grad(set_to_none=True)
        # Sum over this rank's samples / global batch * world: DDP's gradient averaging then
        # gives exactly the gradient of the global batch mean, even for a short last batch.
        scale = self.env.world_size / global_count
        if self.t.micro_batches > 1:
            out = self._micro_batch_passes(batch, scale)
        else:
            with self._autocast():
                out = self._task_step(p.model, batch)
            self._backward(out.loss_sum, scale)
        if out.loss_count is not None:
            self._weigh_by_count(out.loss_count, global_count)
        if not self._monitor_checked:
            self._check_monitor()

        local_flags = self._local_flags()
        if self.env.world_size == 1:
            if self.lagged:
                ready = self._one_rank_lagged_step(out, local_flags)
            else:
                ready = [self._one_rank_step(out, local_flags)]
        else:
            ready = self._exchange(out, local_flags)
        if not self._steady:  # the first step is done: its allowance ends for collectives too
            set_collective_timeout(self.t.stall_timeout_s)
            self._steady = True
        pr.global_step += 1
        pr.step_in_epoch += 1
        flags = self._account(ready)
        elapsed = time.monotonic() - started
        pr.epoch_s += elapsed
        pr.train_s += elapsed
        every = self.t.eval_every_steps
        flags["eval_due"] = flags["eval_due"] or bool(every and pr.global_step % every == 0)
        flags["save_due"] = flags["save_due"] or self._save_due_by_steps()
        return flags

    def _backward(self, loss_sum: torch.Tensor, scale: float) -> None:
        if self.p.scaler.is_enabled():
            self.p.scaler.scale(loss_sum * scale).backward()
        else:  # the scale as the backward's starting gradient: the same numbers, one node less
            loss_sum.backward(self._loss_gradient(scale, loss_sum))

    def _weigh_by_count(self, count: Value, global_count: int) -> None:
        """A step that returns its loss's count (unpadded tokens): the backward weighted the
        passes' and ranks' mean losses by their samples; each gradient times the global
        samples / the global count makes it the gradient of the mean over every counted item
        of the step, whatever trainer.micro_batches and the number of ranks. One scalar
        all-reduce with several ranks; nothing waits on the host."""
        if isinstance(count, torch.Tensor):  # a copy: the step's own count is summed too
            total = count.detach().to(self.p.device, torch.float64).reshape(1).clone()
        else:
            total = torch.full((1,), float(count), dtype=torch.float64, device=self.p.device)
        if self.env.world_size > 1:
            all_reduce_sum(total)
        factor = torch.where(total > 0, global_count / total, torch.zeros_like(total))
        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for param in self.p.raw_model.parameters():
            if param.grad is not None:
                groups.setdefault((param.grad.device, param.grad.dtype), []).append(param.grad)
        for (device, dtype), grads in groups.items():
            torch._foreach_mul_(grads, factor.to(device=device, dtype=dtype).reshape(()))

    def _micro_batch_passes(self, batch: Any, scale: float) -> BatchStats:
        """trainer.micro_batches: the batch's forward and backward passes a part at a time,
        their gradients adding up (DDP all-reduces them once, in the last pass)."""
        from hpcdl.micro_batches import combined, split_batch

        model = self.p.model
        parts = split_batch(batch, self.t.micro_batches)
        outs = []
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            no_sync = getattr(model, "no_sync", None)
            with contextlib.nullcontext() if last or no_sync is None else no_sync():
                with self._autocast():
                    out = self._task_step(model, part)
                self._backward(out.loss_sum, scale)
            outs.append(out)
        return combined(outs)

    def _one_rank_step(
        self, out: BatchStats, local_flags: tuple[float, float, float]
    ) -> tuple[int, StepSums]:
        """One rank, eager: its own sums read now (a tensor read is ~0.2 us on a CPU; packing
        them into one tensor costs tens), then step, or skip a non-finite one. The task's
        statistics of a taken step are deferred where the task allows it."""
        deferred = self._deferred
        names = () if deferred is not None else self.p.task.stat_names
        stats = tuple(float(out.stats[name]) for name in names)
        stop, eval_due, save_due = local_flags
        sums = StepSums(
            out.loss_sum.item(),  # no detach: a read keeps no graph
            float(out.num_samples),
            float(out.loss_weight),
            stop,
            eval_due,
            save_due,
            stats,
        )
        if self._step_unless_nonfinite(sums) and deferred is not None:
            assert out.outputs is not None and out.targets is not None
            self._defer_stats(out.outputs, out.targets)
        return self.progress.global_step + 1, sums

    def _one_rank_lagged_step(
        self, out: BatchStats, local_flags: tuple[float, float, float]
    ) -> list[tuple[int, StepSums]]:
        """One rank, lagged: nothing to all-reduce, so nothing is packed. The skip is decided
        on the device from the loss, only the loss (and a custom task's tensor statistics)
        goes to the host, and the task's statistics are deferred as in the eager step: a
        step costs two small kernels (found_inf_of) and a copy more than a hand-written one."""
        p, deferred = self.p, self._deferred
        names = () if deferred is not None else p.task.stat_names
        stats = [out.stats[name] for name in names]
        if not p.scaler.is_enabled():  # fp16: the scaler hands over its own found_inf
            skip_on_device(p.optimizer, found_inf_of(out.loss_sum.detach()))
        self._optimizer_step()
        host = (float(out.num_samples), out.loss_weight, *local_flags)
        values, fill = solo_sums(out.loss_sum, [*host, *stats])
        keep = None
        if deferred is not None:
            assert out.outputs is not None and out.targets is not None
            keep = (out.outputs.detach(), out.targets)  # the step's graph is not kept alive
        step = self.progress.global_step + 1
        older, self._in_flight = self._in_flight, self._copies.send(step, values, fill, keep)
        if older is None:
            return []
        with self._waiting("step sums"):
            return [self._consume(older)]

    def _consume(self, in_flight: InFlight) -> tuple[int, StepSums]:
        """A lagged step's sums, read; its deferred statistics kept if the step was taken."""
        sums = in_flight.read()
        if in_flight.keep is not None and not sums.nonfinite:
            self._defer_stats(*in_flight.keep)
        return in_flight.step, sums

    def _exchange(
        self, out: BatchStats, local_flags: tuple[float, float, float]
    ) -> list[tuple[int, StepSums]]:
        """Several ranks: the sums and flags go through one all-reduce."""
        stop_local, eval_local, save_local = local_flags
        stats: list[Value] = [out.stats[name] for name in self.p.task.stat_names]
        mine: dict[str, Value] = {
            "loss_sum": out.loss_sum.detach(),  # copied into the float64 sums
            "num_samples": float(out.num_samples),
            "loss_count": out.loss_weight,
            "num_stop": stop_local,
            "eval_due": eval_local,
            "save_due": save_local,
        }
        return self._lagged_step(stats, mine) if self.lagged else [self._eager_step(stats, mine)]

    def _eager_step(self, stats: list[Value], mine: dict[str, Value]) -> tuple[int, StepSums]:
        """Read the step's all-reduced sums on the host now, then step (or skip a non-finite
        one)."""
        with self._waiting("step sums"):
            sums = StepSums.unpack(all_reduce_sum(StepSums.pack(self.p.device, stats, **mine)))
        self._step_unless_nonfinite(sums)
        return self.progress.global_step + 1, sums

    def _step_unless_nonfinite(self, sums: StepSums) -> bool:
        """The optimizer step, or its skip (gradients dropped) when some rank's loss was not
        finite; whether it stepped."""
        if sums.nonfinite:
            self.p.optimizer.zero_grad(set_to_none=True)
            return False
        self._optimizer_step()
        return True

    def _lagged_step(self, stats: list[Value], mine: dict[str, Value]) -> list[tuple[int, StepSums]]:
        """Step with the skip decided on the device, send this step's sums on their way and
        read the ones before it (trainer.lagged_sync; see hpcdl.step_sync)."""
        p = self.p
        packed = StepSums.pack(p.device, stats, **mine)
        found_inf = reduce_on_device(packed)  # all-reduces packed in place
        if not p.scaler.is_enabled():  # fp16: the scaler hands over its own found_inf
            skip_on_device(p.optimizer, found_inf)
        self._optimizer_step()
        step = self.progress.global_step + 1
        older, self._in_flight = self._in_flight, self._copies.send(step, packed)
        if older is None:
            return []
        with self._waiting("step sums"):
            return [self._consume(older)]

    def _must_settle(self, flags: dict[str, bool]) -> bool:
        """Whether this boundary reads the steps still in flight first: when it acts on
        anything (flags, the epoch's end, max_steps). Decided from agreed values only, so
        every rank settles at the same boundary."""
        pr = self.progress
        epoch_end = pr.step_in_epoch >= self.p.sharder.num_steps_per_epoch
        return any(flags.values()) or epoch_end or self.max_steps_reached()

    def _settle(self, flags: Optional[dict[str, bool]] = None) -> dict[str, bool]:
        """Read and count the step still in flight; its flags join ``flags``."""
        started = time.monotonic()
        older, self._in_flight = self._in_flight, None
        with self._waiting("step sums"):
            ready = [] if older is None else [self._consume(older)]
        settled = self._account(ready)
        elapsed = time.monotonic() - started  # the wait for the last step's kernels
        self.progress.epoch_s += elapsed
        self.progress.train_s += elapsed
        return {k: v or settled[k] for k, v in (flags or settled).items()}

    def _account(self, ready: list[tuple[int, StepSums]]) -> dict[str, bool]:
        """Count steps' sums into the epoch (in step order, each once) and return the flags
        they carry. A non-finite step was skipped: counted, and past trainer.max_bad_steps
        in a row the run stops with an error."""
        pr, flags = self.progress, {"stop": False, "eval_due": False, "save_due": False}
        for step, sums in ready:
            if sums.nonfinite:
                self._count_bad_step(step)
            else:
                pr.num_bad_steps_in_row = 0
                pr.epoch_loss_sum += sums.loss_sum
                pr.epoch_count += sums.num_samples
                pr.epoch_loss_count += sums.loss_count
                if sums.stats:  # none: deferred (_count_deferred)
                    for name, value in zip(self.p.task.stat_names, sums.stats, strict=True):
                        pr.epoch_stats[name] = pr.epoch_stats.get(name, 0.0) + value
            pr.num_samples_seen += int(sums.num_samples)
            self._last_loss = sums.mean_loss
            self._unlogged.append((step, self._last_loss))
            flags["stop"] = flags["stop"] or sums.num_stop > 0
            flags["eval_due"] = flags["eval_due"] or sums.eval_due > 0
            flags["save_due"] = flags["save_due"] or sums.save_due > 0
        return flags

    def _defer_stats(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        assert self._deferred is not None
        self._deferred.add(outputs, targets)
        if self._deferred.full:
            self._count_deferred()

    def _count_deferred(self) -> None:
        """The deferred statistics into the epoch's sums: before anything reads or saves them."""
        if self._deferred is None:
            return
        pr = self.progress
        for name, value in self._deferred.take().items():
            pr.epoch_stats[name] = pr.epoch_stats.get(name, 0.0) + value

    def _loss_gradient(self, scale: float, loss: torch.Tensor) -> torch.Tensor:
        """d(loss_sum * scale)/d(loss_sum) as a tensor like the loss, made once per value (a
        run has two: the full and the short last batch); a fill, not a copy from the host.
        The bits are those of multiplying by the Python float, which autograd casts so."""
        key = (scale, loss.dtype, loss.device)
        gradient = self._loss_gradients.get(key)
        if gradient is None:
            gradient = torch.full((), scale, dtype=loss.dtype, device=loss.device)
            self._loss_gradients[key] = gradient
        return gradient

    def _autocast(self) -> Any:
        """Mixed precision for the forward pass; nothing at all in fp32 (entering a disabled
        autocast still costs a few microseconds a step, which tiny models notice)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.p.device.type, dtype=self.autocast_dtype)

    def _check_monitor(self) -> None:
        es = self.t.early_stopping
        check_monitor(es.monitor, self.p.task)
        self._monitor_checked = True
        if es.mode is None and reads_as_neither(es.monitor):  # a guess that may keep the worst
            self.p.reporter.message(
                f"warning: trainer.early_stopping.monitor={es.monitor}: its name says neither "
                "whether lower or higher is better; best.pt and early stopping take lower "
                "(min). Set trainer.early_stopping.mode=max if higher is better (or =min to "
                "say so)"
            )

    def train_metrics(self) -> dict[str, float]:
        """This epoch's training metrics so far, from the running sums."""
        self._count_deferred()
        pr = self.progress
        stats = {name: pr.epoch_stats.get(name, 0.0) for name in self.p.task.stat_names}
        loss = mean_of(pr.epoch_loss_sum, pr.epoch_loss_count)
        return self.p.task.metrics(stats, pr.epoch_count, loss)

    def _local_flags(self) -> tuple[float, float, float]:
        """(stop requested here, eval due by time, save due by time): rank 0's clock decides."""
        now = time.monotonic()
        eval_s, save_s = self.t.eval_every_s, self.t.checkpoint_every_s
        main = self.env.is_main
        return (
            float(self.stop.requested),
            float(main and eval_s is not None and now - self._last_eval >= eval_s),
            float(main and save_s is not None and now - self._last_save >= save_s),
        )

    def _save_due_by_steps(self) -> bool:
        every = self.t.checkpoint_every_steps
        return bool(every and self.progress.global_step % every == 0)

    def _optimizer_step(self) -> None:
        p = self.p
        step = self.progress.global_step + 1  # the step being taken
        tracked = self._tracks_grad_norm and step % self.t.log_every_steps == 0
        if self.t.grad_clip_norm is not None or tracked:
            p.scaler.unscale_(p.optimizer)  # the norm of the true gradients (fp16)
        norm: Optional[torch.Tensor] = None
        if self.t.grad_clip_norm is not None:  # the norm before clipping, as torch returns it
            norm = nn.utils.clip_grad_norm_(p.raw_model.parameters(), self.t.grad_clip_norm)
        elif tracked:
            grads = [q.grad for q in p.raw_model.parameters() if q.grad is not None]
            norm = nn.utils.get_total_norm(grads) if grads else None
        if tracked and norm is not None:
            self._grad_norms[step] = norm.detach()
        if p.scaler.is_enabled():
            p.scaler.step(p.optimizer)
            p.scaler.update()
        else:  # what a disabled scaler's step does, without its two calls a step
            p.optimizer.step()
        p.scheduler.step()

    def _count_bad_step(self, step: int) -> None:
        pr = self.progress
        pr.num_bad_steps_in_row += 1
        pr.num_skipped_steps += 1
        self.p.reporter.message(
            f"step {step}: non-finite loss, step skipped "
            f"({pr.num_bad_steps_in_row} in a row, limit trainer.max_bad_steps={self.t.max_bad_steps})"
        )
        if pr.num_bad_steps_in_row >= self.t.max_bad_steps:
            raise NonFiniteLossError(
                f"{pr.num_bad_steps_in_row} non-finite losses in a row at step {step}: "
                "lower optim.lr, set trainer.grad_clip_norm, or check the data for NaN/inf"
            )

    def run_step_hooks(self) -> None:
        if not self.p.step_hooks:
            return
        pr = self.progress
        event = StepEvent(
            global_step=pr.global_step,
            epoch=pr.epoch,
            step_in_epoch=pr.step_in_epoch,
            rank=self.env.rank,
            world_size=self.env.world_size,
            read_loss=self._this_steps_loss,
        )
        for hook in self.p.step_hooks:
            hook(event)

    def _this_steps_loss(self) -> float:
        """The latest step's mean loss (with lagged sync, a hook asking for it waits for
        that step; its flags still act where every rank acts on them)."""
        if self._in_flight is not None:
            return self._in_flight.read().mean_loss
        return self._last_loss

    def log_step(self, step_in_epoch: int, flags: dict[str, bool]) -> None:
        self.p.reporter.step(
            self.progress.epoch,
            step_in_epoch,
            self.p.sharder.num_steps_per_epoch,
            self._last_loss,
            self.p.optimizer.param_groups[0]["lr"],
        )
        self._log_to_tracker()

    def _log_to_tracker(self) -> None:
        """The tracker's rows of the steps read since the last call (with lagged sync, a
        step's row is written one step later), after the step hooks have run. Trackers keep
        every trainer.log_every_steps-th step only: the others are not sent."""
        every = self.t.log_every_steps
        for step, loss in self._unlogged:
            if step % every:
                continue
            lr = self.p.optimizer.param_groups[0]["lr"]
            values: dict[str, float] = {"train_loss": loss, "lr": lr}
            norm = self._grad_norms.pop(step, None)
            if norm is not None:  # none for a step skipped as non-finite
                values["grad_norm"] = float(norm)
            if self.p.telemetry is not None:
                sample = self.p.telemetry.sample(step)  # step time, GPU figures: to the tracker too
                values.update({k: v for k, v in sample.items() if k not in ("time", "global_step")})
            self.p.logger.log_step(step, values)
        if self._unlogged:  # a skipped step's norm, never sent
            newest = self._unlogged[-1][0]
            self._grad_norms = {k: v for k, v in self._grad_norms.items() if k > newest}
        self._unlogged.clear()

    # ------------------------------------------------------------------ evaluation
    def evaluate_split(self, split: str, keep_predictions: bool = False) -> EvalResult:
        env, feed = self.env, self.p.feed
        per_rank = max(1, self.t.batch_size // env.world_size)
        batches = feed.eval_batches(split, env.rank, env.world_size, self.p.device, per_rank)
        return evaluate(
            self.p.raw_model,
            batches,
            self.p.task,
            feed.num_classes,
            self.p.device,
            autocast_dtype=self.autocast_dtype,
            keep_predictions=keep_predictions,
        )

    def evaluate_and_track(self) -> tuple[Optional[EvalResult], bool]:
        """Validate and update the best metric / early stopping; returns (result, improved)."""
        self._beat("evaluation")  # its own allowance, from its start
        self._last_eval = time.monotonic()
        if self.p.feed.num_samples("val") == 0:
            return None, False
        result = self.evaluate_split("val")
        pr, es = self.progress, self.t.early_stopping
        value = self._monitored(result)
        sign = 1.0 if monitor_mode(es.monitor, es.mode) == Mode.min else -1.0
        improved = pr.best_metric is None or sign * (pr.best_metric - value) > es.min_delta
        if improved:
            pr.best_metric, pr.best_epoch = value, pr.epoch + 1
            pr.num_evals_without_improvement = 0
        else:
            pr.num_evals_without_improvement += 1
            if es.patience and pr.num_evals_without_improvement >= es.patience:
                pr.early_stopped = True
        if es.target is not None and sign * (value - es.target) <= 0:
            pr.early_stopped = True  # the target is reached: at or past it
        return result, improved

    def _monitored(self, result: EvalResult) -> float:
        split, _, metric = self.t.early_stopping.monitor.partition("_")
        if split == "val":
            return result.loss if metric == "loss" else result.metrics[metric]
        pr = self.progress
        if metric == "loss":
            return mean_of(pr.epoch_loss_sum, pr.epoch_loss_count)
        return self.train_metrics()[metric]

    # ------------------------------------------------------------------ epoch end
    def end_epoch(self) -> None:
        pr = self.progress
        if self._in_flight is not None:  # (the loop has settled already: a safeguard)
            self._settle()
        self._count_deferred()
        self._log_to_tracker()
        epoch_done = pr.step_in_epoch >= self.p.sharder.num_steps_per_epoch
        if not epoch_done and not self.max_steps_reached():
            return
        result, improved = self.evaluate_and_track()
        names = self.p.task.metric_names
        row = {
            "epoch": pr.epoch + 1,
            "step": pr.global_step,
            "train_loss": mean_of(pr.epoch_loss_sum, pr.epoch_loss_count),
            **{f"train_{name}": value for name, value in self.train_metrics().items()},
            "val_loss": result.loss if result else None,
            **{f"val_{name}": result.metrics[name] if result else None for name in names},
            "lr": self.p.optimizer.param_groups[0]["lr"],
            "seconds": pr.epoch_s,
            "samples_per_s": pr.epoch_count / pr.epoch_s if pr.epoch_s > 0 else 0.0,
        }
        if self.env.is_main:
            self.p.metrics.append(row)
        self.p.logger.log_epoch(pr.global_step, row)
        self.p.reporter.epoch_row(row)
        if epoch_done:
            pr.epoch += 1
            pr.step_in_epoch = 0
            pr.start_epoch_sums()
        if pr.early_stopped:
            self.p.reporter.message(early_stop.stopped_line(pr, self.t.early_stopping))
        self.save(is_best=improved, milestone=epoch_done and self._milestone_epoch())

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self, rng_states: list[dict[str, Any]]) -> dict[str, Any]:
        data_state = self.p.feed.data_state()  # data=custom's fitted state, when it has one
        return {
            **({} if data_state is None else {"data_state": data_state}),
            "format_version": FORMAT_VERSION,
            "model": self.p.raw_model.state_dict(),
            "optimizer": self.p.optimizer.state_dict(),
            "scheduler": self.p.scheduler.state_dict(),
            "scaler": self.p.scaler.state_dict(),
            "progress": self.progress.to_dict(),
            "rng": rng_states,
            "world_size": self.env.world_size,
            # Threads split a CPU op's sums otherwise (hpcdl.threads): other floats.
            "cpu_threads": torch.get_num_threads(),
            "batch_size": self.t.batch_size,  # step_in_epoch counts batches of this size
            "config_hash": self.p.config_hash,
            "model_config": self.p.model_config,
            "data_config": self.p.data_config,
            "early_stopping": early_stop.settings(self.t.early_stopping),
            # The purge keeps this file forever if it is a milestone under the setting it
            # was saved with, whatever a later resume sets (hpcdl.checkpoint.milestone).
            "keep_every_epochs": self.t.keep_every_epochs,
            "data_info": self.p.feed.info(),
            "preprocessing": self.p.feed.preprocessing_state(),
        }

    def save(self, *, is_best: bool = False, milestone: bool = False) -> Optional[Path]:
        """Every rank calls this (the RNG states are gathered); rank 0 writes, in a
        background thread from a host copy with trainer.async_checkpoint (the path returned
        is then the file's once the store's wait() returns). A step saved already is saved
        again for ``best.pt``, and for a milestone (trainer.keep_every_epochs): the file of
        an epoch's last step saved before the epoch ended (checkpoint_every_steps/_s, a stop,
        a resume) must hold the ended epoch for the purge to know it."""
        self._beat("checkpoint")  # a large save gets its own allowance
        if self._in_flight is not None:  # the loop settles first; a checkpoint holds all sums
            self._settle()
        self._count_deferred()
        with self._waiting("checkpoint"):
            rng_states = all_gather_objects(capture_rng_state())
        self._last_save = time.monotonic()
        self.progress.wall_s = self._wall_s_before + (self._last_save - self.attempt_started)
        step = self.progress.global_step
        if not self.env.is_main:
            return None
        if step == self._last_saved_step and not (is_best or milestone):
            return self._last_saved_path
        self._last_saved_step = step
        write = self.p.store.save_async if self._async_checkpoint() else self.p.store.save
        state = self.state_dict(rng_states)
        self._last_saved_path = write(state, step, is_best=is_best)
        self._record_checkpoint(self._last_saved_path, state)
        return self._last_saved_path

    def _record_checkpoint(self, path: Path, state: dict[str, Any]) -> None:
        """The run dir's checkpoint.json: what `hpcdl resume` needs of this checkpoint on
        the login node, without torch. Trusted there only while it names the newest file
        on disk, so a record that cannot be written (a full disk) only leaves the decision
        to the job."""
        record = {key: state[key] for key in CHECKPOINT_RECORD_KEYS}
        with contextlib.suppress(HpcdlError, OSError, TypeError, ValueError):
            RunDir(self.p.store.directory.parent).write_checkpoint_record(path, record)

    def _milestone_epoch(self) -> bool:
        """The epoch just ended is one whose checkpoint is kept forever."""
        every = self.t.keep_every_epochs
        return every is not None and self.progress.epoch % every == 0

    def _async_checkpoint(self) -> bool:
        choice = self.t.async_checkpoint.lower()  # validated: auto, true or false
        return self.p.device.type == "cuda" if choice == "auto" else choice == "true"

    def _wait_for_checkpoint_after_error(self) -> None:
        """A save in flight completes before an error leaves fit(). The error that got us
        here is the one raised; a failed background write is only reported."""
        try:
            self.p.store.wait()
        except Exception as err:
            self.p.reporter.message(f"the checkpoint being written failed too: {err}")

    def restore(self, found: Optional[tuple[Path, dict[str, Any]]]) -> None:
        if found is None:
            self._start_over()
            return
        path, state = found
        p = self.p
        try:
            p.raw_model.load_state_dict(state["model"])
        except RuntimeError as exc:  # torch lists every mismatch, one line each
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            first = lines[1] if len(lines) > 1 else str(exc)  # after "Error(s) in loading ..."
            if (state.get("model_config"), state.get("data_config")) == (
                p.model_config,
                p.data_config,
            ):  # the same config built another model: its code changed (--fresh-code)
                raise CheckpointError(
                    f"{path} does not fit this run's model ({first}), built from the config "
                    "it was saved with: your model's or data's code changed since; resume "
                    "with the code it was saved by (a --fresh-code run keeps it in RUN_DIR/code.N), or start "
                    "a new run"
                ) from None
            saved = saved_with(state.get("model_config") or {}, p.model_config, "model")
            raise CheckpointError(
                f"{path} does not fit this run's model ({first}); resume "
                f"with the model and data config it was saved with{saved}, or start a new run "
                f"from the weights that fit with init_from={path}"
            ) from None
        load_optimizer_state(p.optimizer, state["optimizer"], str(path))
        # On the CPU the optimizer keeps the loaded tensors themselves, mapped from the file:
        # copied, so that the file's purge frees its space (no .nfs file holds on to it).
        unmap(p.optimizer.state)
        # A state saved without channels_last (or before async saves kept strides) takes its
        # parameter's layout: torch's fused CUDA steps refuse tensors whose strides differ.
        match_parameter_layout(p.optimizer)
        p.scheduler.load_state_dict(state["scheduler"])
        if p.scaler.is_enabled() and not state["scaler"]:  # saved in fp32 or bf16
            p.reporter.message(
                f"{path}: saved without trainer.precision=fp16; the fp16 loss scale starts "
                "at its initial value"
            )
        else:
            p.scaler.load_state_dict(state["scaler"])
        self.progress = resumed_progress(path, state, p.sharder, self.t.early_stopping)
        self._wall_s_before = self.progress.wall_s  # 0 for a checkpoint saved without it
        if self.progress.step_in_epoch != state["progress"]["step_in_epoch"]:
            p.reporter.message(
                f"trainer.batch_size {state['batch_size']} -> {self.t.batch_size}: epoch "
                f"{self.progress.epoch + 1} goes on at the same sample, step "
                f"{self.progress.step_in_epoch} of the epoch"
            )
        rng = state["rng"]
        if len(rng) == self.env.world_size:
            restore_rng_state(rng[self.env.rank])
        else:
            p.reporter.message(
                f"resuming {len(rng)}-rank state with {plural(self.env.world_size, 'rank')}: "
                "RNG streams restart from the seed, so results will differ from an uninterrupted run"
            )
        self._warn_other_threads(path, state.get("cpu_threads"))
        if state["config_hash"] != p.config_hash:
            changed = config_changes(state, p)
            p.reporter.message(f"{path}: {changed} since this checkpoint was saved")
        self._last_saved_step = self.progress.global_step
        if self.env.is_main:
            p.metrics.truncate_after_epoch(self.progress.epoch)
        p.reporter.message(f"resumed from {path} ({self.progress.position()})")
        self._report_early_stop(path, state)
        self._report_nothing_left(path)

    def _report_nothing_left(self, path: Path) -> None:
        """A resume of a run that has reached trainer.max_epochs (or max_steps) says so,
        rather than end at once with nothing trained (a run that stopped early says why)."""
        if self.progress.early_stopped:
            return
        line = limit_reached_line(self.progress, self.t.max_epochs, self.t.max_steps)
        if line is not None:
            self.p.reporter.message(f"{path}: {line}")

    def _warn_other_threads(self, path: Path, saved: Optional[int]) -> None:
        """On the CPU, an op's sums are split over the threads: another thread count gives
        other floats (checkpoints saved before they held it: not known, no warning)."""
        threads = torch.get_num_threads()
        if saved is None or saved == threads or self.p.device.type != "cpu":
            return
        from hpcdl.threads import usable_cpus

        ranks_here, cpus = max(1, self.env.world_size // self.env.num_nodes), usable_cpus()
        cost = (
            f", which puts {saved * ranks_here} threads on {cpus} CPUs: slower"
            if saved * ranks_here > cpus
            else ""
        )
        self.p.reporter.message(
            f"{path}: saved with {saved} CPU thread{'s' * (saved != 1)} per rank, resumed "
            f"with {threads}: sums "
            f"run in another order, so results will differ from those of {saved} thread"
            f"{'s' * (saved != 1)} throughout (set OMP_NUM_THREADS={saved} to match{cost})"
        )

    def _report_early_stop(self, path: Path, state: dict[str, Any]) -> None:
        """A run that stopped early says whether it trains on, and if not why not."""
        if not state["progress"].get("early_stopped"):
            return
        saved, es = state.get("early_stopping"), self.t.early_stopping
        if self.progress.early_stopped:
            line = early_stop.nothing_to_train_line(self.progress, saved, es)
        else:
            line = early_stop.going_on_line(self.progress, saved, es)
        self.p.reporter.message(f"{path}: {line}")

    def _start_over(self) -> None:
        """No checkpoint to continue from. One epoch on record is a kill between its
        metrics row and its first save: forget the row. More means checkpoints that were
        saved are gone: retraining silently would mix two runs' histories."""
        epochs = len(self.p.metrics.read())
        if epochs >= EPOCHS_NEEDING_A_CHECKPOINT:
            run = self.p.metrics.path.parent
            raise RunDirError(
                f"{run}: metrics.csv records {plural(epochs, 'epoch')} but "
                f"{self.p.store.directory} holds no valid checkpoint to continue from; retrain from epoch 1 with "
                f"`hpcdl resume {run} --from-scratch` (clears its metrics and summary)"
            )
        if epochs and self.env.is_main:
            self.p.metrics.truncate_after_epoch(0)

    # ------------------------------------------------------------------ the end
    @property
    def class_names(self) -> list[str]:
        return list(self.p.feed.class_names)

    def test_summary(
        self, result: FitResult, wall_s: float
    ) -> tuple[Optional[dict[str, Any]], Optional[EvalResult]]:
        """Test-set evaluation (every rank takes part) and, on rank 0, the run's summary."""
        # Regression keeps the test predictions for the predicted-vs-true plot.
        keep = isinstance(self.p.task, RegressionTask)
        test = self.evaluate_split("test", keep) if self.p.feed.num_samples("test") else None
        if not self.env.is_main:
            return None, test
        pr = result.progress
        summary: dict[str, Any] = {
            "outcome": result.outcome.value,
            "test_loss": test.loss if test else None,
            **{
                f"test_{name}": test.metrics[name] if test else None
                for name in self.p.task.metric_names
            },
            "num_test_samples": test.num_samples if test else 0,
            "best_metric_name": self.t.early_stopping.monitor,
            "best_metric": pr.best_metric,
            "best_epoch": pr.best_epoch,
            "early_stopped": pr.early_stopped,
            "steps": pr.global_step,
            "epochs": pr.epoch,
            "num_skipped_steps": pr.num_skipped_steps,
            "world_size": self.env.world_size,
            "cpu_threads": torch.get_num_threads(),  # this rank's (hpcdl.threads)
            "train_s": pr.train_s,
            "wall_s": wall_s,  # this attempt's
            "wall_s_total": self._wall_s_before + wall_s,  # every attempt's, up to the weights
            "samples_per_s": pr.num_samples_seen / pr.train_s if pr.train_s > 0 else 0.0,
            "num_samples_seen": pr.num_samples_seen,
            "peak_rss_mb": peak_rss_mb(),
            "weights_sha256": weights_sha256(self.p.raw_model.state_dict()),
            "checkpoint": str(result.checkpoint) if result.checkpoint else None,
            "versions": collect_versions(),
        }
        self.p.logger.finish(summary)
        return summary, test

    # ------------------------------------------------------------------ endings
    def interrupt(self) -> FitResult:
        path = self.save()
        self._beat("checkpoint")
        self.p.store.wait()  # the run stops only once its checkpoint is on disk
        self.p.logger.close()  # buffered tracker events to disk; the next attempt continues
        self.p.reporter.close(
            f"stopped by {self.stop.signal_name or 'another rank'} at global step "
            f"{self.progress.global_step}; "
            "checkpoint saved"
        )
        return FitResult(Outcome.interrupted, self.progress, self.stop.signal_name, path)

    def complete(self) -> FitResult:
        path = self.save()
        self._beat("checkpoint")
        self.p.store.wait()
        self.p.reporter.close()
        return FitResult(Outcome.completed, self.progress, None, path)


def out_of_memory(exc: BaseException) -> Optional[str]:
    """torch's own first words for running out of device (or host) memory; None for any
    other error."""
    text = str(exc)
    if isinstance(exc, torch.OutOfMemoryError) or "DefaultCPUAllocator: can't allocate" in text:
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        # "CUDA out of memory. Tried to allocate 2.00 GiB"
        return ". ".join(first.split(". ")[:2])[:200]
    return None


def lagged_sync(choice: str, device: torch.device, optimizer: torch.optim.Optimizer) -> bool:
    """trainer.lagged_sync resolved: "auto" is on where it can pay, on CUDA, when the optimizer
    can skip a non-finite step on the device (a fused one). Measured on an H100 for one rank
    (2026-11-26, docs/performance.md): a GPU-bound ResNet-18 in bf16 took 1.05x the
    hand-written loop's epoch with it and 1.12-1.30x without (the host waiting for each
    step leaves the GPU idle while it queues the next); tiny models bound by the host
    launching kernels lose 0.05-0.15x with it (its two kernels and bookkeeping), a fraction
    of a millisecond a step. Several ranks would otherwise also wait on the sums'
    all-reduce every step."""
    choice = str(choice).lower()  # validated: auto, true or false
    if choice != "auto":
        return choice == "true"
    fused = bool(getattr(optimizer, "_step_supports_amp_scaling", False))
    return device.type == "cuda" and fused


def peak_rss_mb() -> float:
    """This process's peak resident memory (ru_maxrss: KiB on Linux), in MiB."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def total_steps(cfg: Config, steps_per_epoch: int) -> int:
    by_epochs = cfg.trainer.max_epochs * steps_per_epoch
    if cfg.trainer.max_steps is None:
        return by_epochs
    return min(by_epochs, cfg.trainer.max_steps)
