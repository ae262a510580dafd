"""`hpcdl` command line: compose -> validate -> run dir -> launch.

Bad input ends here as one line on stderr and exit status 2, before anything is written.
Imports of torch happen only for runs that train on this machine (cluster=debug or local:
the launchers, and hpcdl.probe, which runs user code once before the run dir exists).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Optional

from hpcdl.cli.resume_cmd import cmd_resume
from hpcdl.cli.sweep_cmd import cmd_sweep, submitted_line
from hpcdl.errors import ConfigError, HpcdlError, HpcdlWarning, plural, warnings_as_lines
from hpcdl.exit_codes import (
    EXIT_BAD_INPUT,
    EXIT_BROKEN_PIPE,
    EXIT_CTRL_C,
    EXIT_INTERRUPTED,
    EXIT_OK,
)

if TYPE_CHECKING:
    from hpcdl.config.schema import Config
    from hpcdl.rundir import JobDir, RunDir
    from hpcdl.sweep.plan import SweepPlan


def _group_listing(config_dirs: Optional[list[str]] = None) -> str:
    from hpcdl.cli.compose import conf_dir, user_conf_dirs
    from hpcdl.config.convert import GROUPS, PRESET_GROUPS

    dirs = [conf_dir(), *user_conf_dirs(config_dirs)]
    lines = ["config groups (choose with group=option; see docs/configuration.md):"]
    for group in (*GROUPS, *PRESET_GROUPS):
        options = sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml")})
        lines.append(f"  {group}: {', '.join(options)}")
    lines.append("override any key with key=value, e.g. trainer.max_epochs=5 optim.lr=0.03")
    return "\n".join(lines) + "\n"


class OneLineParser(argparse.ArgumentParser):
    """argparse's own errors (a missing argument, an invalid choice) as one line naming the
    command, a close choice and its --help, exit status 2; not its usage block first. The
    subcommands' parsers are of this class too (add_subparsers makes them so)."""

    def error(self, message: str) -> NoReturn:
        import difflib

        for action in self._actions:  # `hpcdl` or `hpcdl sweep` alone: name the commands
            if isinstance(action, argparse._SubParsersAction) and message.endswith(
                f"required: {action.dest}"
            ):
                message = f"give a command: {', '.join(action.choices)}"
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if choice is not None:
            given, listed = choice.group(1), re.findall(r"'([^']*)'", choice.group(2))
            close = difflib.get_close_matches(given, listed, n=1, cutoff=0.6)
            if close:
                message = f"{message}; did you mean {close[0]}?"
        self.exit(EXIT_BAD_INPUT, f"error: {self.prog}: {message} ({self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from hpcdl.cli.other_data import SPLITS

    parser = OneLineParser(
        prog="hpcdl",
        description="Train PyTorch models in-process, on local ranks, or on Slurm, from Hydra configs.",
    )
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser(
        "train",
        help="compose a config and train (or submit)",
        epilog=_group_listing(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("overrides", nargs="*", help="Hydra overrides: group=option, key=value")
    train.add_argument("--cfg", "-c", choices=["job", "all"], help="print the config, run nothing")
    train.add_argument("--resolve", action="store_true", help="with --cfg: resolve interpolations")
    train.add_argument("--info", action="store_true", help="print config search path and choices")
    train.add_argument("--config-dir", "-cd", action="append", default=[], help="extra config dir")
    train.add_argument(
        "--multirun", "-m", action="store_true", help="a sweep over comma lists/ranges"
    )
    train.add_argument(
        "--dry-run", action="store_true", help="Slurm: print the sbatch script, submit nothing"
    )
    train.add_argument(
        "--no-launch", action="store_true", help="only create the run dir (for slurm/train.sbatch)"
    )
    train.add_argument(
        "--no-preflight", action="store_true", help="Slurm: skip the sinfo/scontrol checks"
    )
    train.add_argument(
        "--probe",
        action="store_true",
        help="Slurm: run your model, data and task on one batch here (CPU) before submitting, "
        "as local runs always do (imports torch and your code on this node)",
    )

    run = sub.add_parser(
        "run",
        help="your own script or function as a (Slurm) job: hpcdl run [overrides] -- COMMAND...",
        description="Run an existing program with hpcdl's run dir, profiles, dry-run, "
        "preflight, requeue and sweeps: hpcdl run [overrides] -- python train.py --lr 0.1, or "
        "hpcdl run entry=package.module:function entry.kwargs.lr=0.1. Overrides: cluster "
        "settings, launcher=srun|torchrun, metrics_file=PATH, stall_timeout_s=SECONDS, "
        "run_dir=PATH.",
    )
    run.add_argument("overrides", nargs="*", help="cluster=..., launcher=..., entry=...")
    run.add_argument("--config-dir", "-cd", action="append", default=[], help="extra config dir")
    run.add_argument("--multirun", "-m", action="store_true", help="expand {a,b} in the command")
    run.add_argument(
        "--dry-run", action="store_true", help="print the sbatch script, submit nothing"
    )
    run.add_argument("--no-preflight", action="store_true", help="skip the sinfo/scontrol checks")

    resume = sub.add_parser(
        "resume",
        help="continue a run from its newest valid checkpoint, or one you choose (--from)",
        usage="hpcdl resume [-h] [options] RUN_DIR [overrides ...] [-- COMMAND ...]",
        description="Continue a run where it stopped, from any folder, from its newest valid "
        "checkpoint or from one you choose with --from: in place (the checkpoints saved after "
        "it move to RUN_DIR/checkpoints.set-aside-N), or in a new run dir (--new-run-dir: "
        "RUN_DIR is left as it is). Overrides change its config.yaml first, e.g. "
        "optim.lr=0.01. `-- COMMAND...` replaces an `hpcdl run` run's program (its script "
        "path is the run's workdir's).",
    )
    resume.add_argument("run_dir")
    resume.add_argument(
        "overrides", nargs="*", default=[], help="e.g. trainer.max_epochs=50 cluster=local"
    )
    resume.add_argument("--config-dir", "-cd", action="append", default=[])
    resume.add_argument(
        "--no-preflight", action="store_true", help="Slurm: skip the sinfo/scontrol checks"
    )
    resume.add_argument(
        "--dry-run",
        action="store_true",
        help="say where it would go on from, which config keys change, and (Slurm) print the "
        "job; write and submit nothing",
    )
    resume.add_argument(
        "--from-scratch",
        action="store_true",
        help="retrain from epoch 1: clears its metrics and summary, and moves any checkpoints "
        "left to checkpoints.set-aside-N",
    )
    resume.add_argument(
        "--fresh-code",
        action="store_true",
        help="Slurm: freeze your code (model, data, task modules, the script's folder, hpcdl) "
        "anew for this job instead of running the copy frozen at the first submission; the "
        "old copy moves to code.N (a sweep trial's: the whole sweep's copy, refused while "
        "another trial is queued or running)",
    )
    resume.add_argument(
        "--from",
        dest="from_checkpoint",
        metavar="CHECKPOINT",
        help="continue from this checkpoint of the run instead of the newest: step_000000875.pt "
        "(or its path, or 875, its global step) or best; the ones saved after it move to "
        "checkpoints.set-aside-N with the records of their epochs",
    )
    resume.add_argument(
        "--new-run-dir",
        metavar="NEW_DIR",
        help="with --from: continue in NEW_DIR (made with the run's config, the checkpoint "
        "and the metrics up to it), leaving RUN_DIR as it is; NEW_DIR must not exist",
    )

    status = sub.add_parser("status", help="Slurm job state, attempts, last metrics")
    status.add_argument("ref", metavar="RUN_DIR|JOB_ID")
    status.add_argument(
        "--watch", type=float, metavar="SECONDS", help="refresh (at least 10 s apart)"
    )
    logs = sub.add_parser("logs", help="a rank's log file")
    logs.add_argument("ref", metavar="RUN_DIR")
    logs.add_argument("--rank", type=int, default=0)
    logs.add_argument("-f", "--follow", action="store_true")
    logs.add_argument(
        "--job", metavar="JOB_ID", help="an earlier Slurm job of the run (default: the newest)"
    )
    sweep = sub.add_parser("sweep", help="status, summary and rerun of a `train -m` sweep")
    sweep_sub = sweep.add_subparsers(dest="sweep_command", required=True)
    sweep_status = sweep_sub.add_parser("status", help="table: trial, overrides, job id, state")
    sweep_status.add_argument("sweep_dir")
    sweep_status.add_argument("--metric", help=STATUS_METRIC_HELP)
    sweep_status.add_argument(
        "--state",
        action="append",
        default=[],
        metavar="STATE",
        help="only the trials in this state (failed, timeout or timed-out, cancelled, "
        "running, pending, completed, not_started, ...; any case); a comma list, or repeat it",
    )
    sweep_summary = sweep_sub.add_parser("summary", help="ranked table + plot per swept key")
    sweep_summary.add_argument("sweep_dir")
    sweep_summary.add_argument("--metric", help=METRIC_HELP)
    sweep_summary.add_argument("--format", choices=["markdown", "csv"], default="markdown")
    sweep_summary.add_argument(
        "--at",
        choices=["last", "best"],
        default="last",
        help="each trial's value at its last epoch (default), or at its best epoch: the one "
        "its best.pt was kept for, by its trainer.early_stopping.monitor",
    )
    sweep_summary.add_argument(
        "--over",
        action="append",
        default=[],
        metavar="KEY",
        help="average over this swept key too (mean, std, n), as over data.fold: "
        "--over trainer.seed, or a script's --over seed; repeatable",
    )
    sweep_summary.add_argument(
        "--mode",
        choices=["min", "max"],
        help="rank lowest (min) or highest (max) first; default: the trials' "
        "trainer.early_stopping.mode for their monitor (auto: its direction), else the metric's own (built-in "
        "metrics; else guessed from the name: loss, error, mae, time, ... lowest first)",
    )
    sweep_rerun = sweep_sub.add_parser(
        "rerun",
        help="resubmit failed/cancelled/timed-out trials (--failed), or chosen ones (--trials)",
    )
    sweep_rerun.add_argument("sweep_dir")
    sweep_rerun.add_argument(
        "overrides",
        nargs="*",
        help="KEY=VALUE for each rerun trial's config.yaml, as hpcdl resume takes them "
        "(cluster.timeout_min=240, trainer.max_epochs=50); not a swept key",
    )
    # Checked in cmd_sweep, so that a typo of it (--faild) is named as an unknown option.
    sweep_rerun.add_argument(
        "--failed",
        action="store_true",
        help="rerun the failed, cancelled and timed-out trials (this or --trials is required)",
    )
    sweep_rerun.add_argument(
        "--trials",
        metavar="LIST",
        help="rerun these trials whatever their state, e.g. 3,4,10-12 (a completed one with "
        "a suspicious result); refused while one of them is queued or running",
    )
    sweep_rerun.add_argument(
        "--from-scratch",
        action="store_true",
        help="train them again from their first epoch: each one's checkpoints/ moves to "
        "checkpoints.set-aside-N, its metrics and summary are cleared (as hpcdl resume "
        "--from-scratch)",
    )
    sweep_rerun.add_argument(
        "--dry-run", action="store_true", help="name the trials and print the sbatch script only"
    )
    sweep_rerun.add_argument(
        "--fresh-code",
        action="store_true",
        help="Slurm: freeze your code anew for the rerun (the sweep's old copy moves to "
        "code.N); refused while a trial is queued or running",
    )

    from hpcdl.cli.bench import add_parser as add_bench_parser

    add_bench_parser(sub)

    cancel = sub.add_parser(
        "cancel", help="scancel a run's job, or every queued or running trial of a sweep"
    )
    cancel.add_argument("ref", metavar="RUN_DIR|JOB_ID")

    completion = sub.add_parser(
        "completion",
        help='print a shell completion script: eval "$(hpcdl completion bash)"',
    )
    completion.add_argument("shell", choices=["bash"])
    # What the script itself calls on TAB: the candidates for the line up to the cursor.
    completion.add_argument("--line", help=argparse.SUPPRESS)
    completion.add_argument("--wordbreaks", help=argparse.SUPPRESS)

    evaluate = sub.add_parser("evaluate", help="test metrics + confusion matrix of a checkpoint")
    evaluate.add_argument("run_dir")
    evaluate.add_argument(
        "overrides",
        nargs="*",
        help="other data, for this command only: data.path=..., data.kwargs.KEY=...",
    )
    evaluate.add_argument("--checkpoint", default="best", help="best | last | PATH (default best)")
    evaluate.add_argument(
        "--split", choices=SPLITS, default="test", help="the split evaluated (default test)"
    )

    predict = sub.add_parser("predict", help="predictions for new rows or for a split")
    predict.add_argument("run_dir")
    predict.add_argument(
        "overrides",
        nargs="*",
        help="with --split, other data: data.path=..., data.kwargs.KEY=...; "
        "task=custom runs: task.predict=package.module:function",
    )
    source = predict.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--input",
        help="rows as .csv, .npy or .npz; for a data=imagefolder run, a folder of images or one",
    )
    source.add_argument(
        "--split", choices=SPLITS, help="every sample of a split of the data (all: every one)"
    )
    predict.add_argument("--checkpoint", default="best", help="best | last | PATH (default best)")
    predict.add_argument("--output", help="write CSV here instead of stdout")
    predict.add_argument(
        "--id-column",
        metavar="NAME",
        help="with --input of a CSV: copy its column NAME (a sample ID) into the output, after row",
    )
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    code = run_command(argv)
    if argv is None:  # this process's own command line (the `hpcdl` script, python -m)
        from hpcdl.cli.process_exit import ignore_ctrl_c_while_exiting, leave_now

        ignore_ctrl_c_while_exiting()
        leave_now(code)
    return code


# hpcdl's flags that change what `run`/`resume` do (submit nothing, ...): after `--` they
# reach the program instead, and the job is submitted.
HPCDL_ONLY_FLAGS = ("--dry-run", "--no-launch", "--no-preflight", "--fresh-code", "--multirun")


def run_command(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    # `hpcdl run [overrides] -- COMMAND...`, `hpcdl resume RUN_DIR [overrides] -- COMMAND...`
    if argv[:1] in (["run"], ["resume"]) and "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
        own = [a for a in command if a in HPCDL_ONLY_FLAGS and a not in argv]
        if own:  # a program may take them too: said, not refused
            print(
                f"hpcdl: warning: {own[0]} is after --, so it goes to your program, not to "
                f"hpcdl; for hpcdl's {own[0]}, put it before --",
                file=sys.stderr,
                flush=True,
            )
    elif argv[:1] == ["run"]:
        values = {i + 1 for i, a in enumerate(argv) if a in ("--config-dir", "-cd")}
        words = [
            a
            for i, a in enumerate(argv[1:], 1)
            if i not in values and not a.startswith(("-", "~")) and "=" not in a
        ]
        if words:  # `hpcdl run python train.py`: the program without its --
            print(
                f"error: hpcdl run: {words[0]!r} is not an override (key=value); put your "
                f"program after --: hpcdl run [overrides] -- {shlex.join(argv[argv.index(words[0]) :])}",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
    try:
        args = parse_anywhere(build_parser(), argv)
        args.program = command
        handler = {
            "train": cmd_train,
            "run": cmd_run,
            "resume": cmd_resume,
            "evaluate": cmd_evaluate,
            "predict": cmd_predict,
            "status": cmd_status,
            "logs": cmd_logs,
            "cancel": cmd_cancel,
            "sweep": cmd_sweep,
            "bench": cmd_bench,
            "completion": cmd_completion,
        }[args.command]
        with warnings_as_lines():
            return handler(args)
    except HpcdlError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        # Ctrl-C before a command set its own handler (a training run catches it from its
        # start and saves): one line instead of a traceback, the shell's status for SIGINT.
        print("\ninterrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_CTRL_C
    except BrokenPipeError:
        # The reader went away (`hpcdl train | head`): stop quietly, as Unix tools do on
        # SIGPIPE. A training run stops where it was and continues with `hpcdl resume`.
        from hpcdl.progress import silence_stdout

        silence_stdout()
        return EXIT_BROKEN_PIPE


def version_line() -> str:
    """`hpcdl --version`: hpcdl's and Python's versions (torch's would cost its import)."""
    import platform

    from hpcdl import __version__

    return f"hpcdl {__version__} (Python {platform.python_version()})"


def cmd_completion(args: argparse.Namespace) -> int:
    from hpcdl.cli.completion import bash_script, candidates

    if args.line is None:
        print(bash_script(), end="")
    else:  # nothing at all when there is no candidate: bash then completes file names
        print("".join(f"{c}\n" for c in candidates(args.line, args.wordbreaks)), end="")
    return EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    from hpcdl.cli.bench import cmd_bench as run_bench

    return run_bench(args)


def parse_anywhere(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Overrides (key=value) anywhere among the flags, as Hydra takes them:
    `hpcdl train cluster=x --dry-run run_dir=y`. argparse ends a positional list at the
    first flag; the key=value words it leaves over join the command's overrides."""
    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    options = [w for w in extra if w.startswith("-") and len(w) > 1]
    if options:
        raise HpcdlError(_unknown_option(parser, args, argv, options[0]))
    overrides = [w for w in extra if "=" in w]
    if len(overrides) != len(extra) or not hasattr(args, "overrides"):
        return parser.parse_args(argv)  # the usual usage error for anything else
    args.overrides = [*args.overrides, *overrides]
    return args


def _unknown_option(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str], option: str
) -> str:
    """`hpcdl resume: unknown option --form; did you mean --from? (hpcdl resume --help)`,
    for the (sub)command whose name comes before the option, in place of argparse's usage of
    the whole of hpcdl and `unrecognized arguments`."""
    import difflib

    before = argv[: argv.index(option)]
    while True:  # down to the innermost command named before the option: hpcdl sweep summary
        commands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, commands[0].dest, None) if commands else None
        if name is None or name not in before:
            break
        parser = commands[0].choices[name]
    name = option.split("=", 1)[0]
    known = [s for a in parser._actions for s in a.option_strings]
    # 0.75: --form finds --from (0.83), --nope finds no --info (0.67).
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    hint = f"; did you mean {close[0]}?" if close else ""
    if not close and parser.prog == "hpcdl run":
        hint = "; a program's own options go after --: hpcdl run [overrides] -- COMMAND ..."
    return f"{parser.prog}: unknown option {name}{hint} ({parser.prog} --help)"


def plain_sbatch_script() -> str:
    """hpcdl's own sbatch script for a run dir made with --no-launch: by its path in the
    checkout hpcdl runs from (a relative slurm/... is only found from there)."""
    import hpcdl

    script = Path(hpcdl.__file__).resolve().parents[1] / "slurm" / "train.sbatch"
    return str(script) if script.is_file() else "slurm/train.sbatch (in hpcdl's source tree)"


def cmd_train(args: argparse.Namespace) -> int:
    from hpcdl.cli.compose import compose, compose_config, conf_dir, user_conf_dirs
    from hpcdl.config.schema import Launcher

    if args.multirun and not (args.cfg or args.info):
        return run_sweep(args)
    if args.cfg or args.info:
        from omegaconf import OmegaConf

        composed = compose(args.overrides, args.config_dir)
        if args.info:
            dirs = [conf_dir(), *user_conf_dirs(args.config_dir)]
            print("config search path:\n" + "\n".join(f"  {d}" for d in dirs))
            print(_group_listing(args.config_dir))
            return EXIT_OK
        print(OmegaConf.to_yaml(composed, resolve=args.resolve), end="", flush=True)
        # Printed as composed (what to fix is in it); a config `train` would refuse is
        # refused here too, in one line after it, with train's exit status.
        compose_config(args.overrides, args.config_dir)
        return EXIT_OK
    cfg = compose_config(args.overrides, args.config_dir)
    probed = None
    if args.probe:  # on a Slurm login node too, as it was asked for
        from hpcdl.probe import probe_user_code

        probed = probe_user_code(cfg, here=True)
    if args.dry_run:
        return dry_run(cfg, args.no_preflight, probed)
    cfg, run_dir = start_run(cfg, args.no_preflight)
    warn_regression_dropout(cfg, args.overrides)  # once it starts: a refusal stays one line
    if args.no_launch:
        if cfg.cluster.launcher == Launcher.slurm:
            from hpcdl.launch.slurm import freeze_code

            freeze_code(run_dir, cfg)
        print(f"not launched; e.g. sbatch {plain_sbatch_script()} {run_dir.path}")
        return EXIT_OK
    return launch_new(cfg, run_dir)


def launch_new(cfg: Config, run_dir: RunDir) -> int:
    """`hpcdl train` (and hpcdl.submit): launch a run dir just created. One that sbatch
    refused is removed again: it holds only its config and code, and a retry makes a new one."""
    import shutil

    from hpcdl.launch.slurm import SubmitError
    from hpcdl.runlock import hold

    try:
        with hold(run_dir):
            return launch(cfg, run_dir)
    except SubmitError as err:
        shutil.rmtree(run_dir.path, ignore_errors=True)
        raise SubmitError(f"{err}; nothing submitted (run dir {run_dir.path} removed)") from None


def start_run(cfg: Config, skip_preflight: bool) -> tuple[Config, RunDir]:
    """A composed config up to its launch (`hpcdl train`, hpcdl.submit): preflight, the
    user's code probed, the run dir created."""
    from hpcdl.probe import probe_user_code
    from hpcdl.rundir import create_run_dir

    preflight(cfg, skip_preflight)
    probe_user_code(cfg)
    cfg, run_dir = create_run_dir(cfg)
    print(f"run dir: {run_dir.path}", flush=True)
    return cfg, run_dir


def run_sweep(args: argparse.Namespace) -> int:
    from hpcdl.cli.expand import plan_sweep

    return launch_sweep(plan_sweep(args.overrides, args.config_dir), args)


def launch_sweep(plan: SweepPlan, args: argparse.Namespace) -> int:
    """A planned sweep (`train -m`, `run -m`): dry run, or start_sweep."""
    from hpcdl.config.schema import Launcher

    probed = None
    if getattr(args, "probe", False):  # train -m --probe: the first trial's, here
        probed = probe_first_trial(plan, here=True)
    if args.dry_run:
        print(f"{plural(len(plan.trials), 'trial')}:")
        for t in plan.trials:
            print(f"  {t.index}: {' '.join(t.overrides)}")
        if plan.trials[0].config.cluster.launcher != Launcher.slurm:
            if plan.sweep_dir is not None:  # the refusal the sweep would meet
                from hpcdl.sweep.launch import check_new_sweep_dir

                check_new_sweep_dir(Path(plan.sweep_dir).expanduser().resolve())
            return EXIT_OK
        return dry_run_sweep(plan, args.no_preflight, probed)
    return start_sweep(plan, args.no_preflight)[1]


def start_sweep(plan: SweepPlan, skip_preflight: bool) -> tuple[Path, int]:
    """Preflight, the sweep dir with one run dir per trial, and one job array (or a local
    pool, in the foreground): the sweep dir and the exit status (`train -m`, hpcdl.submit_sweep)."""
    from hpcdl.config.schema import Launcher
    from hpcdl.sweep import ledger as ledger_mod
    from hpcdl.sweep.launch import create_sweep, run_local_pool, submit_arrays

    checked: set[str] = set()
    for trial in plan.trials:
        if repr(trial.config.cluster) not in checked:
            try:
                preflight(trial.config, skip_preflight)
            except HpcdlError as err:  # named as plan_sweep names a trial's config error
                err.args = (f"trial {trial.index} ({' '.join(trial.overrides)}): {err}",)
                raise
            checked.add(repr(trial.config.cluster))
    probe_first_trial(plan)
    ledger = create_sweep(plan)
    sweep_dir = Path(ledger.sweep_dir)
    print(f"sweep dir: {sweep_dir} ({plural(len(ledger.trials), 'trial')})", flush=True)
    indices = [t.index for t in ledger.trials]
    if ledger.launcher == Launcher.slurm.value:
        with ledger_mod.locked(sweep_dir) as led:
            # The configs just planned: not read back from the 100 run dirs just written.
            arrays = submit_arrays(led, indices, {t.index: t.config for t in plan.trials})
        print(submitted_line(arrays, len(indices)))
        print(f"  status:  hpcdl sweep status {sweep_dir}")
        print(f"  summary: hpcdl sweep summary {sweep_dir}")
        return sweep_dir, EXIT_OK
    return sweep_dir, run_local_pool(ledger, indices)


def probe_first_trial(plan: SweepPlan, here: bool = False) -> bool:
    """The first trial's code and data run on one batch before the sweep dir exists, as `hpcdl
    train` runs a run's (debug and local; a Slurm login node runs none): a model, dataset or
    file every trial shares is refused in one line, not once per trial as it fails. Trials
    that differ in them are checked by their own runs (a failed trial is rerun once fixed).
    False where its code stopped at its own use of CUDA (probe_user_code)."""
    from hpcdl.probe import probe_user_code

    trial = plan.trials[0]
    try:
        return probe_user_code(trial.config, here)
    except HpcdlError as err:  # named as preflight names a trial's
        err.args = (f"trial {trial.index} ({' '.join(trial.overrides)}): {err}",)
        raise


def cmd_run(args: argparse.Namespace) -> int:
    from hpcdl.cli.run import run_program

    return run_program(args)


METRIC_DEFAULT = (
    "default: val_accuracy for classification, else the early-stopping monitor; for "
    "`hpcdl run` sweeps the first number in the programs' metrics"
)
METRIC_HELP = f"the metric to show and rank by; {METRIC_DEFAULT}"
STATUS_METRIC_HELP = (
    f"the metric to show in each trial's row (in trial order: `sweep summary` ranks); "
    f"{METRIC_DEFAULT}"
)


def preflight(cfg: Config, skip: bool) -> None:
    from hpcdl.config.schema import Launcher

    if cfg.cluster.launcher == Launcher.local:  # the GPUs this shell shows (no query)
        from hpcdl.launch.local import local_gpus

        local_gpus(cfg, os.environ)
    if cfg.cluster.launcher == Launcher.slurm:
        refuse_missing_modules(cfg)
        warn_short_time_limit(cfg)
    if cfg.cluster.launcher == Launcher.slurm and not skip:
        from hpcdl.config.schema import slurm_tasks_per_node
        from hpcdl.launch.preflight import check

        check(cfg.cluster, slurm_tasks_per_node(cfg))


def warn_regression_dropout(cfg: Config, overrides: list[str]) -> None:
    """task=regression with the MLP's or CNN's dropout left at its default (0.5, 0.25): the
    dropout biases a regressor's outputs (on an exactly linear target, 10 epochs: val_r2
    0.83 with the MLP's 0.5, 0.9997 with 0). Said once; giving model.dropout silences it."""
    dropout = getattr(cfg.model, "dropout", 0.0)
    default = getattr(type(cfg.model)(), "dropout", None) if dropout else None
    if cfg.task.name != "regression" or not dropout or dropout != default:
        return  # an experiment file or a user config chose it
    if any(o.lstrip("+").split("=", 1)[0] == "model.dropout" for o in overrides):
        return
    warnings.warn(
        HpcdlWarning(
            f"task=regression with model.dropout={dropout}, model={cfg.model.name}'s default: "
            "dropout biases a regressor's outputs (on a linear target, val_r2 0.83 against "
            "0.9997 without it); set model.dropout=0, or give the dropout you mean"
        ),
        stacklevel=1,
    )


def warn_short_time_limit(cfg: Config) -> None:
    """One warning line where an allocation may end before it trains, and one where the job's
    program is found on a PATH this shell does not pass on (no query: also with
    --no-preflight and in a dry run)."""
    from hpcdl.launch.preflight import export_none_note, short_time_limit_note

    note = short_time_limit_note(cfg.cluster)
    if note is not None:
        warnings.warn(HpcdlWarning(note), stacklevel=1)
    exported = export_none_note(cfg.cluster, cfg.script.command if cfg.script else None)
    if exported is not None:
        warnings.warn(HpcdlWarning(exported), stacklevel=1)


def refuse_missing_modules(cfg: Config, dry: bool = False) -> None:
    """A Slurm login node imports none of the user's code: a module missing from the user's
    package, which would be frozen without it, is found by looking at its files instead.
    A target whose package is not importable here at all is refused where the job runs
    this same interpreter with nothing set up first (so it would not find it either); with
    cluster.setup, cluster.python, a container or a PYTHONPATH in cluster.env the job's own
    environment decides, and a `dry` run warns as the submission does."""
    from hpcdl.launch.slurm import named_targets
    from hpcdl.launch.snapshot import find_top_level, missing_submodule
    from hpcdl.launch.static_kwargs import refuse_unknown_kwargs, unbound_name

    cluster = cfg.cluster
    own_env = bool(cluster.setup or cluster.python or cluster.container.image) or (
        "PYTHONPATH" in cluster.env
    )
    for key, target in named_targets(cfg):
        top = target.partition(":")[0].split(".")[0]
        if top and find_top_level(top) is None:
            if not own_env:
                here = Path.cwd()
                fix = (
                    f"it is in this folder ({here / top}), which is not on PYTHONPATH: run "
                    "PYTHONPATH=. hpcdl ..."
                    if (here / top / "__init__.py").is_file() or (here / f"{top}.py").is_file()
                    else "put its folder on PYTHONPATH (PYTHONPATH=/path/to/project hpcdl ...) "
                    "or install it"
                )
                raise ConfigError(
                    f"{key}={target!r}: module {top!r} is not importable here, and the job runs "
                    "this Python with nothing set up first (your shell's PYTHONPATH does not go "
                    f"with it: hpcdl freezes your code into the run instead); {fix}, or set up "
                    "the job's own environment with cluster.setup"
                )
            if dry:
                print(
                    f"# warning: {key}={target!r}: module {top!r} is not importable here, so it "
                    "is not frozen with the run's code; the job imports whatever its "
                    "environment (cluster.setup) finds",
                )
            continue
        why = missing_submodule(target)
        if why:
            raise ConfigError(f"{key}={target!r}: {why}; check the module path")
        unbound = unbound_name(target)
        if unbound:  # the job would find it only after its queue wait (a sweep: every trial)
            raise ConfigError(f"{key}={target!r}: {unbound}")
    groups = {"model": cfg.model, "data": cfg.data, "task": cfg.task}
    for key, group in groups.items():  # kwargs keys the callable's source rules out
        called, kwargs = getattr(group, "target", None), getattr(group, "kwargs", None)
        if group.name == "custom" and isinstance(called, str) and kwargs:
            refuse_unknown_kwargs(key, called, kwargs)


def dry_run(cfg: Config, skip_preflight: bool = False, probed: Optional[bool] = None) -> int:
    """The sbatch script, the program and each rank's environment; then the preflight's
    verdict: a request the cluster would refuse is refused here too, in one line after them
    (not checked where no Slurm answers, as on a laptop)."""
    from hpcdl.config.schema import Launcher
    from hpcdl.rundir import RunDir, check_new_run_dir, default_run_dir, with_workdir

    if cfg.cluster.launcher != Launcher.slurm:
        raise HpcdlError(
            f"--dry-run: cluster={cfg.cluster.name} is not a Slurm profile; nothing to print"
        )
    run_dir = RunDir(Path(cfg.run_dir or default_run_dir()).expanduser().resolve())
    print(f"# run dir (not created): {run_dir.path}")
    cfg = with_workdir(cfg)  # as the run would record it
    script = print_job(cfg, run_dir)
    refusal = preflight_verdict(cfg, skip_preflight, script)
    if cfg.script is None:  # hpcdl run's program is checked as a command (hpcdl.cli.run)
        print(probe_line(cfg, probed))
    print("# dry run: nothing submitted", flush=True)
    if cfg.run_dir is not None:  # the refusal `hpcdl train` would meet first
        check_new_run_dir(cfg.run_dir)
    if refusal is not None:
        raise refusal
    return EXIT_OK


def probe_line(cfg: Config, probed: Optional[bool]) -> str:
    """Whether the user's code ran here on one batch: a Slurm login node runs none unless
    asked (`--probe`), and the job then finds its errors after its queue wait. `probed`:
    None not asked, True ran, False stopped where it asked for CUDA (the probe's CPU)."""
    from hpcdl.probe import uses_user_code

    if not uses_user_code(cfg):
        return "# your code: none (built-in model, data and task)"
    if probed:
        return "# your code: ran on one batch here (--probe)"
    if probed is False:
        return (
            "# your code: ran here (--probe) until it asked for CUDA itself; the rest is "
            "checked on the job's GPUs"
        )
    return (
        "# your code: not run here (a login node imports no torch); --probe runs your "
        "model, data and task on one batch here first, as local runs do"
    )


def print_job(cfg: Config, run_dir: JobDir) -> str:
    """A dry run's Slurm job: the sbatch script, the program and each rank's environment;
    returns the script."""
    from hpcdl.launch.slurm import python_note, rank_environment, sbatch_text

    script = sbatch_text(cfg, run_dir)
    print(script)
    note = python_note(cfg.cluster)
    if note is not None:
        print(note)
    if cfg.script is not None:
        print("# program (what each Slurm task runs, its script from the frozen copy)")
        print("  " + program_line(cfg, run_dir))
    print("# per-rank environment")
    for row in rank_environment(cfg):
        print("  " + " ".join(f"{k}={v}" for k, v in row.items()))
    return script


def preflight_verdict(
    cfg: Config, skip_preflight: bool, script: Optional[str] = None
) -> Optional[ConfigError]:
    """A dry run's preflight line; the refusal a submission would meet, to raise once the
    script is printed (None: the cluster can run it, or no Slurm answers here). Where the
    preflight passes, `script` (the job's sbatch script) goes to `sbatch --test-only`."""
    from hpcdl.config.schema import slurm_tasks_per_node
    from hpcdl.launch import container
    from hpcdl.launch.preflight import SlurmUnreachable, check_request

    warn_short_time_limit(cfg)
    try:  # the user's code, looked at (not run) as a submission does, also without Slurm
        refuse_missing_modules(cfg, dry=True)
    except ConfigError as err:
        return err
    if skip_preflight:
        print("# preflight: skipped (--no-preflight)")
        return None
    try:
        # first: where no Slurm answers, nothing is checked
        check_request(cfg.cluster, slurm_tasks_per_node(cfg))
        container.check(cfg.cluster)
    except SlurmUnreachable:
        print("# preflight: not checked (no Slurm controller answers here)")
        return None
    except ConfigError as err:
        return err
    print("# preflight: the cluster can run this request")
    if script is not None:
        from hpcdl.launch.slurm import sbatch_test

        try:
            print(f"# sbatch --test-only: {sbatch_test(script, cfg.cluster)}")
        except ConfigError as err:
            return err
    return None


def dry_run_sweep(
    plan: SweepPlan, skip_preflight: bool = False, probed: Optional[bool] = None
) -> int:
    """`train -m --dry-run`: the job array's sbatch script, one per distinct cluster config
    (trials that differ in `cluster.*` cannot share an array's header), then the
    preflight's verdict on each, as the submission would meet it."""
    from hpcdl.cli.array_scripts import print_array_scripts
    from hpcdl.launch.slurm import sbatch_text
    from hpcdl.rundir import SweepDir, with_workdir
    from hpcdl.sweep.launch import check_new_sweep_dir, default_sweep_dir

    sweep_dir = Path(plan.sweep_dir or default_sweep_dir()).expanduser().resolve()
    print(f"# sweep dir (not created): {sweep_dir}")
    print_array_scripts([(trial.index, trial.config) for trial in plan.trials], sweep_dir)
    first = plan.trials[0]
    if first.config.script is not None:  # an `hpcdl run -m` sweep: as its single run shows it
        print(f"# program (trial {first.index}'s; each trial its own arguments)")
        print("  " + program_line(with_workdir(first.config), SweepDir(sweep_dir)))
    refusal, checked = None, set()
    for trial in plan.trials:
        if repr(trial.config.cluster) in checked:
            continue
        checked.add(repr(trial.config.cluster))
        # sbatch --test-only gets the group's job as a lone trial's: the array's own size
        # and throttle are hpcdl's to check (MaxArraySize)
        script = sbatch_text(with_workdir(trial.config), SweepDir(sweep_dir))
        refusal = preflight_verdict(trial.config, skip_preflight, script)
        if refusal is not None:  # named as start_sweep names it
            refusal.args = (f"trial {trial.index} ({' '.join(trial.overrides)}): {refusal}",)
            break
    if first.config.script is None:
        print(probe_line(first.config, probed).replace("# your code:", "# your code (trial 0):"))
    print("# dry run: nothing submitted", flush=True)
    if plan.sweep_dir is not None:  # the refusal `train -m` would meet first
        check_new_sweep_dir(sweep_dir)
    if refusal is not None:
        raise refusal
    return EXIT_OK


def program_line(cfg: Config, run_dir: JobDir) -> str:
    """`hpcdl run --dry-run`: the user's command as the job will start it."""
    import shlex
    from dataclasses import replace

    from hpcdl.env import RankEnv
    from hpcdl.launch.snapshot import frozen_script
    from hpcdl.script_job import program_command

    assert cfg.script is not None
    command, _ = frozen_script(run_dir.code_dir, cfg.script.command, cfg.workdir)
    tokens = program_command(replace(cfg.script, command=command), cfg, RankEnv())
    if cfg.cluster.python is not None and tokens[:1] == [sys.executable]:
        tokens[0] = cfg.cluster.python  # the job's own interpreter (hpcdl.entry)
    known_in_the_job = {  # torchrun's per-node options, decided once the job runs
        "--node-rank=": "<SLURM_NODEID>",
        "--rdzv-endpoint=": "<first host of SLURM_JOB_NODELIST>:<15000 + SLURM_JOB_ID % 15000>",
        "--rdzv-id=": "<SLURM_JOB_ID>",
    }
    for i, token in enumerate(tokens):
        for option, shown in known_in_the_job.items():
            if token.startswith(option):
                tokens[i] = option + shown
    return shlex.join(tokens)


def launch(cfg: Config, run_dir: RunDir) -> int:
    from hpcdl.config.schema import Launcher

    if cfg.cluster.launcher == Launcher.slurm:
        from hpcdl.launch.slurm import submit

        print(submit(cfg, run_dir).describe(), flush=True)
        return EXIT_OK
    if cfg.cluster.launcher == Launcher.local:
        from hpcdl.launch.local import run_local

        code = run_local(cfg, run_dir)
    else:
        from hpcdl.launch.debug import run_in_process

        code = run_in_process(run_dir)
    if code == EXIT_OK:
        print(f"done: {run_dir.summary_file}", flush=True)
    elif code == EXIT_INTERRUPTED:
        # A program under `hpcdl run` saves its own checkpoints (it says so with status 3).
        saved = "" if cfg.script is not None else "; checkpoint saved"
        print(f"interrupted{saved}. Continue with: hpcdl resume {run_dir.path}", flush=True)
    return code


def refuse_script_run(cfg: Config, run_dir: RunDir, command: str) -> None:
    """evaluate and predict rebuild the model and data from config.yaml: an `hpcdl run`
    run's program keeps its own, which hpcdl does not know."""
    if cfg.script is not None:
        raise ConfigError(
            f"hpcdl {command}: {run_dir.path} is an `hpcdl run` run; its program keeps its "
            f"own model and checkpoints, which hpcdl cannot rebuild: {command} them with "
            f"your program (hpcdl {command} works on `hpcdl train` runs)"
        )


def given_here(checkpoint: str, run_dir: RunDir, workdir: Optional[str]) -> str:
    """--checkpoint best|last|newest, or the name of a file in the run's checkpoints/, as
    given; a path given here is read from here, not from the run's workdir."""
    from hpcdl.workdir import from_here

    if checkpoint in ("best", "last", "newest"):
        return checkpoint
    if (
        not Path(checkpoint).expanduser().exists()
        and (run_dir.checkpoint_dir / checkpoint).is_file()
    ):
        return checkpoint  # a name in the run's checkpoints/ (step_000000390.pt)
    return from_here(checkpoint, workdir)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from hpcdl.inference import evaluate_checkpoint
    from hpcdl.workdir import reading_from

    cfg, run_dir, checkpoint, applied = inference_run(
        args.run_dir, args.checkpoint, args.overrides, "evaluate"
    )

    def show(report: dict[str, Any]) -> None:  # before they are written: see them anyway
        print(f"checkpoint: {report['checkpoint']}")
        if applied:
            print(f"data: {' '.join(applied)} ({args.split} split)")
        split = report["split"]
        metrics = "  ".join(
            f"{key} {value:.4f}"
            for key, value in report.items()
            if key.startswith(f"{split}_") and isinstance(value, float)
        )
        print(f"{metrics}  ({report[f'num_{split}_samples']} samples)")
        if "confusion_matrix" in report:
            print("confusion matrix [true x predicted]:")
            for name, row in zip(report["class_names"], report["confusion_matrix"], strict=True):
                print(f"  {name:>12}: {' '.join(f'{v:5d}' for v in row)}")
        sys.stdout.flush()

    with reading_from(cfg.workdir):  # the run's relative paths are its folder's
        report = evaluate_checkpoint(cfg, run_dir, checkpoint, args.split, applied, show)
    print(f"written: {report['output_dir']}")
    return EXIT_OK


def cmd_predict(args: argparse.Namespace) -> int:
    from hpcdl.inference import predict_rows
    from hpcdl.workdir import from_here, reading_from

    cfg, run_dir, checkpoint, applied = inference_run(
        args.run_dir, args.checkpoint, args.overrides, "predict"
    )
    if args.input is not None and applied:
        given = next(o for o in args.overrides if o.startswith("data."))
        raise HpcdlError(
            f"{given}: data keys choose the data that --split reads; "
            "--input gives its rows itself (drop the data keys, or use --split)"
        )
    rows, out = args.input, args.output
    rows, out = (None if p is None else from_here(p, cfg.workdir) for p in (rows, out))
    with reading_from(cfg.workdir):  # the run's relative paths are its folder's
        count = predict_rows(cfg, run_dir, rows, checkpoint, out, args.split, args.id_column)
    if args.output:
        print(json.dumps({"rows": count, "output": args.output}))
    return EXIT_OK


def inference_run(
    path: str, checkpoint: str, overrides: list[str], command: str
) -> tuple[Config, RunDir, str, list[str]]:
    """What evaluate and predict (the commands, and Job's methods) read: the run's config
    with the command line's keys applied for this command only (config.yaml unchanged),
    the run dir, --checkpoint as a path of the current folder or a name of the run's, and
    the data overrides as they resolved. An `hpcdl run` run is refused."""
    from hpcdl.cli.other_data import inference_config
    from hpcdl.rundir import open_run_dir

    cfg, run_dir = open_run_dir(path)
    refuse_script_run(cfg, run_dir, command)
    cfg, applied = inference_config(cfg, overrides, command)
    refuse_unimportable_frozen(cfg, run_dir, command)
    return cfg, run_dir, given_here(checkpoint, run_dir, cfg.workdir), applied


def refuse_unimportable_frozen(cfg: Config, run_dir: RunDir, command: str) -> None:
    """evaluate/predict import the run's own modules here: one that is not importable here
    but frozen with a Slurm run (RUN_DIR/code, a sweep's SWEEP_DIR/code) is named with the
    PYTHONPATH that finds the copy, instead of a bare 'cannot import'."""
    from hpcdl.launch.slurm import named_targets
    from hpcdl.launch.snapshot import find_top_level

    code = run_dir.job_base().code_dir
    for key, target in named_targets(cfg):
        top = target.partition(":")[0].split(".")[0]
        frozen = (code / top).is_dir() or (code / f"{top}.py").is_file()
        if frozen and find_top_level(top) is None:
            raise ConfigError(
                f"{key}={target!r}: cannot import {top!r} here; the run's frozen copy is in "
                f"{code}: PYTHONPATH={code} hpcdl {command} {run_dir.path} ... (or your own "
                "checkout's folder)"
            )


# Ctrl-C on `status --watch` or `logs -f`: the user is done watching; quiet, as `tail -f`.
EXIT_WATCH_STOPPED = 128 + 2  # SIGINT


def cmd_status(args: argparse.Namespace) -> int:
    from hpcdl.launch.monitor import status

    try:
        return status(args.ref, args.watch)
    except KeyboardInterrupt:
        return EXIT_WATCH_STOPPED


def cmd_logs(args: argparse.Namespace) -> int:
    from hpcdl.launch.monitor import logs

    try:
        return logs(args.ref, args.rank, args.follow, args.job)
    except KeyboardInterrupt:
        return EXIT_WATCH_STOPPED


def cmd_cancel(args: argparse.Namespace) -> int:
    from hpcdl.cli.cancel import cmd_cancel as cancel

    return cancel(args)


if __name__ == "__main__":
    sys.exit(main())
