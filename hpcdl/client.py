"""The Python API: `hpcdl train` and `hpcdl train -m` from a notebook or a script.

    from hpcdl import Job, submit, submit_sweep
    job = submit(["cluster=devcluster", "model=cnn", "data=digits"])  # returns once queued
    job.status()                  # the report `hpcdl status` prints, as a dict
    summary = job.wait()          # summary.json, or JobFailedError naming the state and log
    job = Job.from_run_dir("outputs/2026-11-22/18-27-50")             # reattach later

Each call runs the command line's own functions (hpcdl.cli.main): the same composition,
validation, preflight, run dir and launch, and the same one-line HpcdlErrors. On a Slurm
profile nothing here imports torch. cluster=debug and cluster=local train in the
foreground, as the command does, and return once the run has ended.

(`submit_sweep`, not `sweep`: `hpcdl.sweep` is the sweep package, and the import system
sets that attribute whenever one of its modules is first imported.)
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, TypeVar, Union

from hpcdl.errors import ConfigError, HpcdlError
from hpcdl.rundir import RunDir, open_run_dir

if TYPE_CHECKING:
    import torch

PathLike = Union[str, "os.PathLike[str]"]
# "best", "newest", a file name in the run's checkpoints/, a path, or a global step (13).
CheckpointRef = Union[str, int, "os.PathLike[str]"]
T = TypeVar("T")

# Hydra's composition is global state: calls from several threads (a ThreadPoolExecutor of
# Slurm submissions) failed with `GlobalHydra is already initialized`. One at a time.
_COMPOSING = threading.Lock()

# Seconds between scheduler queries while waiting: a busy scheduler should see at most one
# query per 10 s from us (as `hpcdl status --watch`). Lower it on a dev cluster only.
POLL_S = 10.0


class JobFailedError(HpcdlError):
    """A run ended without completing: failed, cancelled, timed out, interrupted."""

    def __init__(self, message: str, state: str, log: Optional[Path]) -> None:
        super().__init__(message)
        self.state = state
        self.log = log


class WaitTimeoutError(HpcdlError, TimeoutError):
    """wait(timeout=...) ran out while the job or a trial was still queued or running."""


def submit(
    overrides: Sequence[str],
    *,
    config_dir: Union[PathLike, Sequence[PathLike], None] = None,
    preflight: bool = True,
    probe: bool = False,
) -> Job:
    """What `hpcdl train OVERRIDES` does: compose and validate, preflight (Slurm), probe
    your code (debug, local), create the run dir, launch. On a Slurm profile it returns as
    soon as the job is queued; on cluster=debug or cluster=local it trains first, in the
    foreground. Bad input raises the command's one-line HpcdlError, with nothing created.
    `config_dir`: one or more `--config-dir` folders; `preflight=False`: `--no-preflight`;
    `probe=True`: `--probe` (a Slurm run's code too, on one batch here)."""
    from hpcdl.cli import main as cli
    from hpcdl.cli.compose import SweepValueError, compose_config
    from hpcdl.config.schema import Launcher

    given = _overrides(overrides)
    try:
        with _COMPOSING:
            cfg = compose_config(given, _config_dirs(config_dir))
    except SweepValueError as err:  # the command's advice is its -m
        err.args = (str(err).replace("add -m", "call submit_sweep()", 1),)
        raise
    if cfg.cluster.launcher != Launcher.slurm:
        _check_main_thread("submit", f"cluster={cfg.cluster.launcher.value}")
    in_process = cfg.cluster.launcher == Launcher.debug
    command = _as_command("train", given, config_dir, preflight)
    with _imports_from_here(), command, _process_state_kept(in_process):
        if probe:
            from hpcdl.probe import probe_user_code

            probe_user_code(cfg, here=True)
        cfg, run_dir = cli.start_run(cfg, skip_preflight=not preflight)
        code = cli.launch_new(cfg, run_dir)
    return Job(run_dir.path, None if cfg.cluster.launcher == Launcher.slurm else code)


def submit_sweep(
    overrides: Sequence[str],
    *,
    config_dir: Union[PathLike, Sequence[PathLike], None] = None,
    preflight: bool = True,
    probe: bool = False,
) -> Sweep:
    """What `hpcdl train -m OVERRIDES` does: every trial composed and validated first, then
    the sweep dir and one job array (Slurm: returns once queued), or the trials run here in
    parallel processes (debug, local: returns once they have ended)."""
    from hpcdl.cli import main as cli
    from hpcdl.cli.expand import plan_sweep
    from hpcdl.config.schema import Launcher

    given = _overrides(overrides)
    with _COMPOSING:
        plan = plan_sweep(given, _config_dirs(config_dir))
    launchers = {t.config.cluster.launcher for t in plan.trials}
    if launchers != {Launcher.slurm}:
        _check_main_thread("submit_sweep", "a sweep on cluster=debug or cluster=local")
    with _as_command("train", ["-m", *given], config_dir, preflight):
        if probe:  # `train -m --probe`: the first trial's code, here
            cli.probe_first_trial(plan, here=True)
        sweep_dir, _ = cli.start_sweep(plan, skip_preflight=not preflight)
    return Sweep(sweep_dir)


def submit_program(
    command: Sequence[str] = (),
    overrides: Sequence[str] = (),
    *,
    config_dir: Union[PathLike, Sequence[PathLike], None] = None,
    preflight: bool = True,
) -> Job:
    """What `hpcdl run OVERRIDES -- COMMAND...` does (docs/scripts.md): your own program,
    e.g. ["python", "train.py", "--lr", "0.1"], run as the run dir's job on the cluster
    profile the overrides choose; `command=()` with `entry=package.module:function` in the
    overrides for a function. Returns once queued (Slurm), or once the program has ended
    (debug, local)."""
    from hpcdl.cli import main as cli
    from hpcdl.cli.run import start_program
    from hpcdl.config.schema import Launcher

    given, program, cfg, _ = _program_config("submit_program", command, overrides, config_dir)
    if cfg.cluster.launcher != Launcher.slurm:
        _check_main_thread("submit_program", f"cluster={cfg.cluster.launcher.value}")
    # The program (an entry= function too) runs in processes of its own, never in this one.
    with _imports_from_here(), _as_command("run", given, config_dir, preflight, program):
        cfg, run_dir = start_program(cfg, skip_preflight=not preflight)
        code = cli.launch_new(cfg, run_dir)
    return Job(run_dir.path, None if cfg.cluster.launcher == Launcher.slurm else code)


def submit_program_sweep(
    command: Sequence[str],
    overrides: Sequence[str] = (),
    *,
    config_dir: Union[PathLike, Sequence[PathLike], None] = None,
    preflight: bool = True,
    probe: bool = False,
) -> Sweep:
    """What `hpcdl run -m OVERRIDES -- COMMAND...` does: one trial per combination of the
    command's lists (`"--lr={0.1,0.03}"`, `"seed=1,2"`), one job array (Slurm: returns once
    queued) or local processes (returns once they have ended)."""
    from hpcdl.cli import main as cli
    from hpcdl.config.schema import Launcher

    call = "submit_program_sweep"
    given, program, cfg, plan = _program_config(call, command, overrides, config_dir, sweep=True)
    if cfg.cluster.launcher != Launcher.slurm:
        _check_main_thread("submit_program_sweep", "a sweep on cluster=debug or cluster=local")
    with _as_command("run", ["-m", *given], config_dir, preflight, program):
        sweep_dir, _ = cli.start_sweep(plan, skip_preflight=not preflight)
    return Sweep(sweep_dir)


def _program_config(
    call: str,
    command: Sequence[str],
    overrides: Sequence[str],
    config_dir: Union[PathLike, Sequence[PathLike], None],
    sweep: bool = False,
) -> tuple[list[str], list[str], Any, Any]:
    """submit_program's and submit_program_sweep's input, checked and composed as `hpcdl
    run` does: the overrides, the program's words, the config, and a sweep's plan. Neither
    or both of a command and entry= are refused in the API's words."""
    from hpcdl.cli.run import compose_program, program_sweep

    given, words, dirs = _overrides(overrides), _words(command), _config_dirs(config_dir)
    entry = any(o.startswith("entry=") for o in given)
    if bool(words) == entry:
        raise ConfigError(
            f"{call}: give command=['python', 'train.py', ...] or "
            f"'entry=package.module:function' in overrides, not {'both' if entry else 'neither'}"
        )
    with _COMPOSING:
        cfg, rest = compose_program(given, words, dirs, multirun=sweep)
        if not sweep:
            return given, words, cfg, None
        try:
            return given, words, cfg, program_sweep(cfg, rest)
        except ConfigError as err:  # the command's advice is its -m
            err.args = (re.sub(r"^-m:", f"{call}:", str(err)),)
            raise


def _words(command: Sequence[str]) -> list[str]:
    """A command as a list of words; a string (whose words hpcdl would have to guess) or
    anything not a word refused in one line."""
    given: Any = command
    if isinstance(given, (str, bytes)) or not isinstance(given, Iterable):
        raise ConfigError(
            f"command={given!r}: give the program as a list of words, e.g. "
            "['python', 'train.py', '--lr', '0.1'] (shlex.split('python train.py --lr 0.1'))"
        )
    words = [os.fspath(w) if isinstance(w, os.PathLike) else w for w in given]
    if not all(isinstance(w, str) for w in words):
        raise ConfigError(f"command={words!r}: each word must be a string")
    return words


# The sweep commands' flags, as Sweep.status()/summary() take them: keyword arguments.
_FLAG_AS_KEYWORD = re.compile(r"--(metric|mode|at|state) ([\w./-]+)")


# `hpcdl predict RUN task.predict=... --split test` in a refusal: Job.predict() says it as a call.
_PREDICT_COMMAND = re.compile(r"hpcdl predict \S+ (task\.predict=\S+) --split \S+")


@contextmanager
def _in_api_words() -> Iterator[None]:
    """A refusal worded for `hpcdl sweep status|summary` (`--metric val_acc`), reworded
    for the Python caller (`metric='val_acc'`): the same one line, the same class."""
    try:
        yield
    except HpcdlError as exc:
        message = str(exc)
        reworded = _FLAG_AS_KEYWORD.sub(lambda m: f"{m[1]}={m[2]!r}", message)
        if reworded == message:
            raise
        try:
            again = type(exc)(reworded)
        except TypeError:  # a class built from other arguments (WriteError: path, reason)
            again = HpcdlError(reworded)
        raise again from None


def _check_main_thread(call: str, what: str) -> None:
    """A run in the foreground takes Ctrl-C and the stop signals, to save at a step boundary
    first; Python lets only the main thread set signal handlers. Refused before anything is
    created (it failed after the run dir was made, with a ValueError from `signal`)."""
    if threading.current_thread() is not threading.main_thread():
        raise HpcdlError(
            f"{call}() from a thread other than the main one: {what} trains in the "
            "foreground and needs the main thread for Ctrl-C and the stop signals; call it "
            "there, or submit to a Slurm profile, or run `hpcdl train` in a terminal"
        )


def _overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides as a list of strings; a string, None, a dict (whose keys alone would
    be taken) or a number is refused in one line."""
    given: Any = overrides
    if isinstance(given, Iterable) and not isinstance(given, (str, bytes, Mapping)):
        given = list(given)  # a generator is read once, here
        if all(isinstance(o, str) for o in given):
            options = [o for o in given if o.startswith("-")]
            if options:  # Hydra's parser said `LexerNoViableAltException: -m`
                raise ConfigError(
                    f"{options[0]!r}: an option of the command, not an override; give "
                    "key=value strings, and for the options: submit_sweep() for -m, "
                    "config_dir= for --config-dir, preflight=False for --no-preflight"
                )
            return given
    raise ConfigError(
        f"overrides={given!r}: give a list of strings, e.g. ['model=cnn', 'trainer.max_epochs=5']"
    )


def _config_dirs(config_dir: Union[PathLike, Sequence[PathLike], None]) -> list[str]:
    if config_dir is None:
        return []
    if isinstance(config_dir, (str, os.PathLike)):
        return [os.fspath(config_dir)]
    if isinstance(config_dir, Iterable) and not isinstance(config_dir, (bytes, Mapping)):
        dirs = list(config_dir)
        if all(isinstance(d, (str, os.PathLike)) for d in dirs):
            return [os.fspath(d) for d in dirs]
    raise ConfigError(
        f"config_dir={config_dir!r}: give a folder (a str or Path) or a list of folders, "
        "as repeated --config-dir options"
    )


def _absolute(path: PathLike) -> Path:
    """A Job's or a Sweep's folder as a Path that a later os.chdir leaves valid."""
    return Path(path).expanduser().resolve()


@contextmanager
def _as_command(
    verb: str,
    words: list[str],
    config_dir: Union[PathLike, Sequence[PathLike], None],
    preflight: bool,
    program: Sequence[str] = (),
) -> Iterator[None]:
    """sys.argv as the `hpcdl` command line that does what this call does, while it runs:
    commands.log records it (it recorded the script or the notebook's kernel, `train: -c`,
    and a sweep trial's `Job.resume(["trainer.max_epochs=50"])` was no hand resume to the
    sweep's summary)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # sys.argv is the process's: calls in threads would leave each other's there
        return
    dirs = [w for d in _config_dirs(config_dir) for w in ("--config-dir", d)]
    saved = sys.argv
    tail = ["--", *program] if program else []
    sys.argv = ["hpcdl", verb, *words, *dirs, *([] if preflight else ["--no-preflight"]), *tail]
    try:
        yield
    finally:
        sys.argv = saved


@contextmanager
def _process_state_kept(in_process: bool) -> Iterator[None]:
    """A cluster=debug run trains in this process: the global state it sets for itself
    (trainer.seed into random, NumPy and torch's generators, or a checkpoint's states on a
    resume; trainer.deterministic into torch's deterministic mode and cuDNN; torch's threads;
    CUBLAS_WORKSPACE_CONFIG) is put back as it was, so the notebook's own code after it draws
    the numbers it drew before and is not made to raise on ops without a deterministic
    kernel. Nothing is imported for runs elsewhere (Slurm: no torch on a login node)."""
    if not in_process:
        yield
        return
    import torch

    from hpcdl.data.loader import kept_rng_states

    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.get_num_threads(),
        dict(os.environ),
    )
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        with kept_rng_states():  # Python's, NumPy's and torch's CPU generators
            yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[2:4]
        if torch.get_num_threads() != saved[4]:
            torch.set_num_threads(saved[4])
        os.environ.clear()
        os.environ.update(saved[5])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


@contextmanager
def _imports_from_here() -> Iterator[None]:
    """sys.path's relative entries also held to this folder while a call works in the run's
    workdir (cluster=debug training, evaluate, predict, resume): '' (a notebook's, `python
    -c`'s) is the current folder at each import, so a model=custom module beside the
    notebook was not found once hpcdl had entered the folder the run was created from.
    Each stays after its absolute form: one found in the workdir still is."""
    if threading.current_thread() is not threading.main_thread():
        yield  # as sys.argv above: sys.path is the process's too
        return
    saved = list(sys.path)
    held = [p for e in saved for p in ([e] if os.path.isabs(e) else [os.path.abspath(e), e])]
    sys.path[:] = held
    try:
        yield
    finally:
        if sys.path == held:  # else the call changed it on purpose: leave that
            sys.path[:] = saved


def _checkpoint(checkpoint: CheckpointRef) -> str:
    """load_model's, evaluate's and predict's `checkpoint` as the commands take it: a global
    step (an int, numpy's too) as its step file's name; anything else refused in one line
    (load_model(120) failed with TypeError 'expected str, bytes or os.PathLike')."""
    from hpcdl.checkpoint_file import step_file_name

    if isinstance(checkpoint, (str, os.PathLike)):
        return os.fspath(checkpoint)
    if not isinstance(checkpoint, bool) and hasattr(checkpoint, "__index__"):
        return step_file_name(int(checkpoint))
    raise ConfigError(
        f"checkpoint={checkpoint!r}: give 'best', 'newest', a file name in the run's "
        "checkpoints/ (step_000000013.pt), its global step (13) or a checkpoint file's path"
    )


def _poll(
    refresh: Callable[[], T],
    done: Callable[[T], bool],
    timeout: Optional[float],
    poll_s: float,
    what: str,
) -> T:
    """refresh() every poll_s seconds until done(its result); WaitTimeoutError at timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        result = refresh()
        if done(result):
            return result
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeoutError(f"{what} still running after {timeout:g} s; wait again later")
        left = poll_s if deadline is None else min(poll_s, deadline - time.monotonic())
        time.sleep(max(0.0, left))


@dataclass(frozen=True)
class Job:
    """One run: its run dir, and the Slurm job now training it (none for a run trained in
    the foreground). Every method reads the run dir and asks the scheduler afresh, so a
    Job made in another session, by from_run_dir, sees the same."""

    run_dir: Path
    # How the foreground command ended (debug, local), when this process ran it.
    exit_code: Optional[int] = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # Job("runs/exp1"), as its repr reads, made every method fail on `str / str`.
        object.__setattr__(self, "run_dir", _absolute(self.run_dir))

    @classmethod
    def from_run_dir(cls, path: PathLike) -> Job:
        """Reattach to a run (a run dir `hpcdl train` or submit() made, or a sweep's trial)."""
        _, run_dir = open_run_dir(os.fspath(path))
        return cls(run_dir.path)

    @property
    def job_id(self) -> Optional[str]:
        """The Slurm job id (`ARRAY_TASK` for a sweep trial; the newest link of a chain)."""
        record = RunDir(self.run_dir).read_submission()
        return str(record["job_id"]) if record else None

    def __repr__(self) -> str:
        return f"Job({str(self.run_dir)!r}, job_id={self.job_id!r})"

    def status(self) -> dict[str, Any]:
        """What `hpcdl status RUN_DIR` prints, as a dict: job_id, state, elapsed (a string,
        `[D-]HH:MM:SS` as sacct writes it, whoever ran the job), source, attempts, requeues,
        last_end, last_epoch, last_metrics (train_loss and the val_* metrics of the last epoch), test_metrics
        (summary.json's test_*), test_accuracy, ... of the run's newest attempt (an `hpcdl
        run` program's: metrics, its metrics file's numbers, instead of the training's keys)
        (a Slurm job, or a run in the foreground: job_id is then the local job's, None
        in-process; state COMPLETED, INTERRUPTED, FAILED or RUNNING)."""
        from hpcdl.launch.monitor import run_report

        report = run_report(RunDir(self.run_dir))
        if "test_metrics" in report:  # its own key before test_metrics held every test metric
            report["test_accuracy"] = report["test_metrics"].get("test_accuracy")
        return report

    def wait(self, timeout: Optional[float] = None, poll_s: float = POLL_S) -> dict[str, Any]:
        """Until the job has left the queue (requeues and chained jobs included), then its
        summary.json. Raises JobFailedError naming the state and the log when it ended
        without completing, WaitTimeoutError after `timeout` seconds."""
        from hpcdl.launch.monitor import NO_SLURM, SQUEUE_FAILED, is_active

        what = f"job {self.job_id} ({self.run_dir})"
        polls = 0

        def ended(report: dict[str, Any]) -> bool:
            # Slurm not answering is no end: it said `job N ended UNKNOWN`. Refused at once
            # (SLURM_CONF unset, another cluster's login node); later, a busy controller's
            # timeout is waited out, as a sweep's wait() keeps its trials' states.
            nonlocal polls
            polls += 1
            if report["source"] not in (NO_SLURM, SQUEUE_FAILED) or "test_metrics" in report:
                return not is_active(report["state"])
            if polls == 1:
                raise HpcdlError(
                    f"{what}: Slurm does not answer here ({report['source']}), so its state "
                    "is not known; wait where squeue works (is SLURM_CONF set? for the dev "
                    'cluster: eval "$(slurm/devcluster env)")'
                )
            return False

        report = _poll(self.status, ended, timeout, poll_s, what)
        run_dir = RunDir(self.run_dir)
        summary = run_dir.read_summary()
        # status() has test_metrics only when summary.json is the newest attempt's: an
        # earlier attempt's (a completed run resumed for more epochs, then cancelled or
        # failed) describes older weights, and is no result of this job.
        if summary is not None and ("test_metrics" in report or report["state"] == "COMPLETED"):
            return summary
        from hpcdl.launch.monitor import failure_cause, newest_launch

        cause = failure_cause(run_dir, newest_launch(run_dir), report["state"])
        failed_rank = re.match(r"rank (\d+): ", cause or "")
        # The failing rank's log, named in the cause (rank 0's said only that a peer was lost).
        log = self._log_file(int(failed_rank.group(1)) if failed_rank else 0)
        who = f"job {report['job_id']}" if report["job_id"] else "the run"
        end = f" (last end: {report['last_end']})" if report.get("last_end") else ""
        end += f"; cause: {cause}" if cause else ""
        if log is None:
            where = "its output is above (cluster=debug)"
        elif log.is_file():
            where = f"log: {log}"
        else:  # cancelled while pending, or refused by Slurm before it ran
            where, log = "no log: it ended before rank 0 wrote one", None
        raise JobFailedError(
            f"{self.run_dir}: {who} ended {report['state']}{end} without a summary; "
            f"{where}; continue it with `hpcdl resume {self.run_dir}`",
            report["state"],
            log,
        )

    def result(self) -> Optional[dict[str, Any]]:
        """summary.json (test metrics, weights hash, ...), or None until the run completed."""
        return RunDir(self.run_dir).read_summary()

    def logs(self, rank: int = 0) -> str:
        """A rank's log so far (`hpcdl logs RUN_DIR --rank N`)."""
        from hpcdl.launch.monitor import is_running, newest_launch, no_such_log

        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise HpcdlError(f"rank={rank!r}: give a rank as an int, 0 for the first")
        path = self._log_file(rank)
        if path is None:
            raise HpcdlError(
                f"{self.run_dir}: no log file for rank {rank}; a cluster=debug run prints "
                "to the console only"
            )
        if not path.is_file():
            run_dir = RunDir(self.run_dir)
            launch = newest_launch(run_dir)
            active, state = is_running(run_dir, launch)
            if not active and state != "UNKNOWN":  # as `hpcdl logs`: the ranks it had
                raise no_such_log(run_dir, launch, rank, state)
            raise HpcdlError(f"{path}: no log yet (job {self.job_id} may still be pending)")
        return path.read_text(errors="replace")

    def _log_file(self, rank: int) -> Optional[Path]:
        from hpcdl.launch.monitor import log_file, newest_launch

        run_dir = RunDir(self.run_dir)
        try:
            return log_file(run_dir, newest_launch(run_dir), rank)
        except HpcdlError:  # in-process (cluster=debug), or not launched yet
            return None

    def load_model(
        self, checkpoint: CheckpointRef = "best", device: Union[str, torch.device] = "cpu"
    ) -> torch.nn.Module:
        """The trained model, with a checkpoint's weights, in eval mode, on `device` (the
        CPU unless told): checkpoint "best" (best.pt), "newest" (the newest complete step
        file), a file name in the run's checkpoints/ folder, or a path. It is built as
        `hpcdl evaluate` and `predict` build it, from the model config the checkpoint was
        saved with; a model=custom class is imported from sys.path. Imports torch."""
        from hpcdl.inference import load_model

        cfg, run_dir = open_run_dir(self.run_dir)
        return load_model(cfg, run_dir, _checkpoint(checkpoint), device)

    def data_state(self, checkpoint: CheckpointRef = "best") -> Optional[dict[str, Any]]:
        """A data=custom run's fitted data state in a checkpoint (its train dataset's
        state_dict(), as `hpcdl predict` loads it into rebuilt datasets), for your own
        inference code: `dataset.load_state_dict(job.data_state())`. None for a run whose
        dataset has none (and for the built-in sources). Imports torch."""
        from hpcdl.inference import saved_data_state

        cfg, run_dir = open_run_dir(self.run_dir)
        return saved_data_state(cfg, run_dir, _checkpoint(checkpoint))

    def evaluate(
        self, checkpoint: CheckpointRef = "best", overrides: Sequence[str] = (), split: str = "test"
    ) -> dict[str, Any]:
        """`hpcdl evaluate RUN_DIR [--split S] [OVERRIDES]`: one checkpoint's metrics on a
        split of the run's data, or of other data that `overrides` point its data builder
        at (data.path=..., data.kwargs.KEY=...; paths are the current folder's). The dict
        metrics.json holds: checkpoint, split, <split>_loss, <split>_<metric>,
        num_<split>_samples, confusion_matrix and class_names (classification),
        data_overrides; plus output_dir, where the command writes them too. Imports torch."""
        from hpcdl.cli.main import inference_run
        from hpcdl.cli.other_data import check_split
        from hpcdl.inference import evaluate_checkpoint
        from hpcdl.workdir import reading_from

        check_split(split)
        with _COMPOSING:
            cfg, run_dir, checkpoint, applied = inference_run(
                str(self.run_dir), _checkpoint(checkpoint), _overrides(overrides), "evaluate"
            )
        with _imports_from_here(), reading_from(cfg.workdir):
            return evaluate_checkpoint(cfg, run_dir, checkpoint, split, applied)

    def predict(
        self,
        split: Optional[str] = None,
        overrides: Sequence[str] = (),
        checkpoint: CheckpointRef = "best",
        *,
        input: Optional[PathLike] = None,
        id_column: Optional[str] = None,
    ) -> list[dict[str, Any]]:
        """`hpcdl predict RUN_DIR --split S [OVERRIDES]` as data: one dict per sample, in the
        split's order (default: test), with the CSV's columns as keys and Python numbers as
        values (row, predicted, class_name, probability, true; regression: row, predicted,
        true; task=custom: task.predict's names; data=imagefolder: path too). `overrides`
        as for evaluate(), and task.predict=package.module:function. `input` is `--input`:
        new rows (.csv, .npy, .npz) or images (a folder of them, or one) instead of a
        split, without true values; `id_column` is `--id-column` (a CSV input's column
        copied into each row). Imports torch."""
        from hpcdl.cli.main import inference_run
        from hpcdl.cli.other_data import check_split
        from hpcdl.inference import predictions
        from hpcdl.workdir import reading_from

        if input is not None and split is not None:
            raise HpcdlError("job.predict: give split= or input=, not both")
        split = "test" if split is None else split
        check_split(split)
        with _COMPOSING:
            cfg, run_dir, checkpoint, applied = inference_run(
                str(self.run_dir), _checkpoint(checkpoint), _overrides(overrides), "predict"
            )
        if input is not None and applied:
            raise HpcdlError(
                f"{applied[0]}: data keys choose the data that split= reads; input= gives its "
                "rows itself (drop the data keys, or use split=)"
            )
        rows = None if input is None else str(_absolute(input))
        try:
            with _imports_from_here(), reading_from(cfg.workdir):
                if rows is not None:
                    table = predictions(
                        cfg, run_dir, checkpoint, input_path=rows, id_column=id_column
                    )
                    return table.as_dicts()
                return predictions(cfg, run_dir, checkpoint, split=split).as_dicts()
        except ConfigError as exc:  # the command's advice, in this call's words
            said = _PREDICT_COMMAND.sub(
                lambda m: f"job.predict(split={split!r}, overrides=[{m[1]!r}])", str(exc)
            )
            if said == str(exc):
                raise
            raise ConfigError(said) from None

    def resume(
        self,
        overrides: Sequence[str] = (),
        *,
        from_checkpoint: Optional[str] = None,
        new_run_dir: Optional[PathLike] = None,
        from_scratch: bool = False,
        fresh_code: bool = False,
        config_dir: Union[PathLike, Sequence[PathLike], None] = None,
        preflight: bool = True,
        command: Sequence[str] = (),
    ) -> Job:
        """`hpcdl resume RUN_DIR [OVERRIDES]`: continue the run from its newest valid
        checkpoint (trainer.max_epochs=20: for more epochs), or from `from_checkpoint`
        (`--from`: a step file's name, its global step, or "best"), in place or in
        `new_run_dir` (`--new-run-dir`: a branch; this run is left as it is). The Job of
        the run dir that goes on (new_run_dir's for a branch). `fresh_code` (`--fresh-code`,
        Slurm): the job runs your code as it is now, frozen anew (the copy the run's jobs
        ran moves to code.N), not the copy frozen at its first submission. On a Slurm
        profile it returns once the job is queued; on cluster=debug or local once the run
        has ended. `command` (an `hpcdl run` run's, `-- COMMAND...`): the program to start
        instead of the one recorded. Bad input raises the command's one-line HpcdlError,
        with nothing changed."""
        from argparse import Namespace

        from hpcdl.cli import main as cli
        from hpcdl.cli.compose import apply_overrides
        from hpcdl.config.schema import Launcher

        given, dirs = _overrides(overrides), _config_dirs(config_dir)
        cfg, _ = open_run_dir(self.run_dir)
        if given:
            with _COMPOSING:
                cfg = apply_overrides(cfg, given, dirs)
        if cfg.cluster.launcher != Launcher.slurm:
            _check_main_thread("Job.resume", f"cluster={cfg.cluster.launcher.value}")
        args = Namespace(
            run_dir=str(self.run_dir),
            overrides=given,
            config_dir=dirs,
            no_preflight=not preflight,
            from_scratch=from_scratch,
            from_checkpoint=None if from_checkpoint is None else str(from_checkpoint),
            new_run_dir=None if new_run_dir is None else os.fspath(new_run_dir),
            program=_words(command),
            dry_run=False,
            fresh_code=fresh_code,
        )
        words = [args.run_dir, *given]
        if args.from_checkpoint is not None:
            words += ["--from", args.from_checkpoint]
        if args.new_run_dir is not None:
            words += ["--new-run-dir", args.new_run_dir]
        if from_scratch:
            words.append("--from-scratch")
        if fresh_code:
            words.append("--fresh-code")
        in_process = cfg.cluster.launcher == Launcher.debug
        as_command = _as_command("resume", words, config_dir, preflight, args.program)
        # It composes again; a run in this process (main thread only) is not held up for.
        composing = contextlib.nullcontext() if in_process else _COMPOSING
        with _imports_from_here(), as_command, _process_state_kept(in_process), composing:
            code = cli.cmd_resume(args)
        target = self.run_dir if args.new_run_dir is None else _absolute(args.new_run_dir)
        if not target.exists():  # the checkpoint had trained to trainer.max_epochs already
            raise HpcdlError(
                f"new_run_dir={args.new_run_dir!r}: not created, as the line above says; "
                "nothing was trained or written"
            )
        return Job(target, None if cfg.cluster.launcher == Launcher.slurm else code)

    def cancel(self) -> None:
        """`hpcdl cancel RUN_DIR`: scancel the run's job."""
        from hpcdl.launch.monitor import cancel

        cancel(str(self.run_dir))


@dataclass(frozen=True)
class Sweep:
    """A `train -m` sweep: its sweep dir, whose ledger (sweep.json) every method reads."""

    sweep_dir: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "sweep_dir", _absolute(self.sweep_dir))

    def __repr__(self) -> str:
        return f"Sweep({str(self.sweep_dir)!r})"

    @classmethod
    def from_sweep_dir(cls, path: PathLike) -> Sweep:
        """Reattach to a sweep dir printed by `hpcdl train -m` or made by submit_sweep()."""
        from hpcdl.sweep.ledger import check_sweep_dir

        sweep_dir = Path(path).expanduser().resolve()
        check_sweep_dir(sweep_dir)
        return cls(sweep_dir)

    def status(
        self, metric: Optional[str] = None, state: str | Sequence[str] = ()
    ) -> list[dict[str, Any]]:
        """`hpcdl sweep status` as data: per trial its index, overrides, run_dir, job_id,
        state, attempts, requeues and metric (val_accuracy unless `metric` says). `state`
        (`--state`): only the trials in these states, e.g. "failed,timeout" or
        ["failed", "timeout"] (case-insensitive; an unknown name raises HpcdlError)."""
        from hpcdl.sweep.report import chosen_states, refresh

        with _in_api_words():
            states = chosen_states([state] if isinstance(state, str) else list(state))
            ledger, _ = refresh(self.sweep_dir, metric)
        return [asdict(t) for t in ledger.trials if not states or t.state in states]

    def wait(self, timeout: Optional[float] = None, poll_s: float = POLL_S) -> list[dict[str, Any]]:
        """Until no trial is queued or running; then status(). Failed trials do not raise:
        their state says so, and rerun_failed() resubmits them."""
        from hpcdl.launch.monitor import is_active

        return _poll(
            self.status,
            lambda trials: not any(is_active(t["state"]) for t in trials),
            timeout,
            poll_s,
            f"sweep {self.sweep_dir}",
        )

    def summary(
        self,
        metric: Optional[str] = None,
        mode: Optional[str] = None,
        over: Sequence[str] = (),
        at: str = "last",
    ) -> list[dict[str, Any]]:
        """`hpcdl sweep summary` as data, best first: rank, overrides, trials, n, mean, std
        (across the folds of a k-fold sweep, and the keys of `over`), the metric's name and
        `mode` ('min': lowest first). `mode` is `--mode`: 'min' or 'max' to choose the
        direction, else as the command decides it; `over` is `--over`: swept keys to average
        over (['trainer.seed']); `at` is `--at`: 'best' for each trial's value at its best
        epoch (its best.pt's) instead of its last. Also writes summary.md, summary.csv and
        summary_<metric>.png into the sweep dir, as the command does."""
        from hpcdl.sweep.best_epoch import AT_CHOICES
        from hpcdl.sweep.direction import direction
        from hpcdl.sweep.report import (
            averaged_keys,
            refresh,
            summarize,
            trial_notes,
            write_summary,
        )

        over = [over] if isinstance(over, str) else list(over)
        if at not in AT_CHOICES:
            raise HpcdlError(f"at={at!r}: choose 'last' (the last epoch's value) or 'best'")
        with _in_api_words():
            ledger, metric = refresh(self.sweep_dir, metric, at)
            ranking = direction(ledger, metric, mode)
            averaged_keys(ledger, over)
        write_summary(ledger, metric, ranking, over, at)
        notes = trial_notes(ledger)  # the lines the command prints below its table
        return [
            {
                "rank": rank,
                **entry,
                "metric": metric,
                "mode": ranking.mode.value,
                "notes": [line for i in entry["trials"] for line in notes.get(i, [])],
            }
            for rank, entry in enumerate(summarize(ledger, metric, ranking, over, at), 1)
        ]

    def cancel(self) -> None:
        """`hpcdl cancel SWEEP_DIR`: every trial queued or running on Slurm, with one
        scancel (each running one saves a checkpoint; rerun_failed() continues them)."""
        from hpcdl.cli.cancel import cancel_sweep

        cancel_sweep(self.sweep_dir)

    def rerun_failed(self, overrides: Sequence[str] = (), *, fresh_code: bool = False) -> list[int]:
        """`hpcdl sweep rerun --failed [KEY=VALUE ...]`: the failed, cancelled, timed-out
        and interrupted trials again, each from its newest checkpoint, with `overrides` in
        each one's config.yaml (["cluster.timeout_min=240"]; not a swept key). The indices
        of the trials rerun. `fresh_code` (`--fresh-code`, Slurm): the sweep's code frozen
        anew first, refused while a trial is queued or running."""
        from hpcdl.cli.sweep_cmd import rerun_failed
        from hpcdl.sweep.ledger import load

        if load(self.sweep_dir).launcher != "slurm":
            _check_main_thread("Sweep.rerun_failed", "a sweep on cluster=debug or cluster=local")
        given = _overrides(overrides)
        return rerun_failed(self.sweep_dir, fresh_code=fresh_code, overrides=given)[0]

    def rerun(
        self,
        trials: Sequence[int],
        overrides: Sequence[str] = (),
        *,
        fresh_code: bool = False,
        from_scratch: bool = False,
    ) -> list[int]:
        """`hpcdl sweep rerun --trials 3,4,10-12 [KEY=VALUE ...]`: these trials again,
        whatever their state (a completed one with a suspicious result), each from its
        newest checkpoint, as rerun_failed() reruns the failed ones, or from its first epoch
        with `from_scratch` (`--from-scratch`); refused while one of them is queued or
        running. The indices of the trials rerun."""
        from hpcdl.cli.sweep_cmd import rerun_failed
        from hpcdl.sweep.ledger import load

        if isinstance(trials, int) or not all(
            hasattr(i, "__index__") and not isinstance(i, bool) for i in trials
        ):
            raise HpcdlError(f"trials={trials!r}: give the trials' indices as a list of ints")
        if load(self.sweep_dir).launcher != "slurm":
            _check_main_thread("Sweep.rerun", "a sweep on cluster=debug or cluster=local")
        given = _overrides(overrides)
        chosen = [int(i) for i in trials]
        return rerun_failed(
            self.sweep_dir,
            fresh_code=fresh_code,
            overrides=given,
            trials=chosen,
            from_scratch=from_scratch,
        )[0]

    def trial(self, index: int) -> Job:
        """One trial's run, as a Job (logs, result, status of that trial alone)."""
        from hpcdl.sweep.ledger import load

        indices = [t.index for t in load(self.sweep_dir).trials]
        if isinstance(index, bool) or not hasattr(index, "__index__"):  # "0", 1.0: never found
            raise HpcdlError(
                f"trial {index!r}: give the trial's index as an int, one of "
                f"{min(indices, default=0)} to {max(indices, default=0)}"
            )
        index = int(index)  # numpy's integers too
        if index not in indices:
            raise HpcdlError(
                f"trial {index}: {self.sweep_dir} has no such trial; give one of its "
                f"{len(indices)} trials, {min(indices, default=0)} to {max(indices, default=0)}"
            )
        return Job.from_run_dir(self.sweep_dir / str(index))
