"""`hpcdl sweep status|summary|rerun`: a sweep's table, its ranked summary, and its
failed (or chosen) trials run again as a new job array or local pool. The sweep's ledger
and records are read and written through hpcdl.sweep and hpcdl.rundir."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from hpcdl.errors import ConfigError, HpcdlError, plural
from hpcdl.exit_codes import EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from hpcdl.config.schema import Config


def cmd_sweep(args: argparse.Namespace) -> int:
    from hpcdl.sweep.direction import direction
    from hpcdl.sweep.report import (
        averaged_keys,
        chosen_states,
        edit_notes,
        no_metric_hint,
        refresh_states,
        status_table,
        write_summary,
    )

    sweep_dir = Path(args.sweep_dir).expanduser().resolve()
    if args.sweep_command == "rerun":
        if args.failed == (args.trials is not None):
            raise HpcdlError(
                f"hpcdl sweep rerun {args.sweep_dir}: give --failed (it reruns the trials in a "
                "failed state: FAILED, CANCELLED, TIMEOUT, ...) or --trials 3,4,10-12"
                + (", not both" if args.failed else "")
            )
        trials = None
        if args.trials is not None:
            from hpcdl.number_ranges import parse_number_ranges

            try:
                trials = parse_number_ranges(args.trials)
            except ValueError as err:
                raise HpcdlError(f"--trials {args.trials}: {err}") from None
        return rerun_failed(
            sweep_dir,
            dry_run=args.dry_run,
            fresh_code=args.fresh_code,
            overrides=args.overrides,
            trials=trials,
            from_scratch=args.from_scratch,
        )[1]
    states = chosen_states(getattr(args, "state", []))  # refused before the ledger is read
    at = getattr(args, "at", "last")  # summary's --at
    ledger, metric, silent = refresh_states(sweep_dir, getattr(args, "metric", None), at)
    if silent is not None:
        from hpcdl.launch.monitor import unanswered

        print(f"warning: {unanswered(silent, 'the trial states shown are the last ones seen')}",
              file=sys.stderr)  # fmt: skip
    if args.sweep_command == "status":
        from hpcdl.launch.slurm_state import ENDED_UNFINISHED

        print(status_table(ledger, metric, states), end="")
        # A script polling the sweep: 1 once a trial has ended without completing, or when
        # the states are not the scheduler's.
        failed = any(t.state in ENDED_UNFINISHED for t in ledger.trials)
        return EXIT_FAILED if failed or silent is not None else EXIT_OK
    if args.sweep_command == "summary":
        ranking = direction(ledger, metric, args.mode)  # refused before anything is written
        averaged_keys(ledger, args.over)  # so is an --over that is no swept key
        text, notes, files = write_summary(ledger, metric, ranking, args.over, at)
        # --format csv: stdout holds the CSV alone (`> out.csv`, pandas.read_csv), the rest
        # goes to stderr.
        said = sys.stderr if args.format == "csv" else sys.stdout
        if args.format == "csv":
            print(files[1].read_text(), end="")
            print(text.splitlines()[0], file=said)  # the direction's line
            print(notes + edit_notes(ledger), end="", file=said)
        else:
            print(text)
            print(edit_notes(ledger), end="")
        print("written: " + ", ".join(str(f) for f in files), file=said)
        hint = no_metric_hint(ledger, metric)
        if hint:
            print(hint, file=sys.stderr)
        if metric == "wall_s" and getattr(args, "metric", None) is None:
            # An lr sweep ranked by run time reads as if the fastest trial were the best.
            print(
                "hpcdl: note: the programs report no metric of their own (no metrics_file, or "
                "no number in it), so the trials are ranked by wall_s, their run time; have "
                "the program write its metrics (metrics_file=result.json, docs/scripts.md"
                "#sweeps) or rank by another key with --metric",
                file=sys.stderr,
            )
    return EXIT_OK


def submitted_line(arrays: list[str], num_trials: int) -> str:
    # submitit submits a lone trial as a plain job, not an array of one
    what = "job" if num_trials == 1 else "job arrays" if len(arrays) > 1 else "job array"
    return f"submitted {what} {', '.join(arrays)}"


def rerun_line(trials: list[int]) -> str:
    """'3 trials: 3-5, 9': a 2000-trial sweep's rerun is one short line, as its cancel is."""
    from hpcdl.number_ranges import number_ranges

    return f"{plural(len(trials), 'trial')}: {number_ranges(trials)}"


def rerun_failed(
    sweep_dir: Path,
    dry_run: bool = False,
    fresh_code: bool = False,
    overrides: Sequence[str] = (),
    trials: Optional[Sequence[int]] = None,
    from_scratch: bool = False,
) -> tuple[list[int], int]:
    """`sweep rerun --failed` (and Sweep.rerun_failed): the failed trials, as states are
    now, as a new job array, or a local pool in the foreground. The trials rerun and the
    exit status. `dry_run`: the trials and the array's sbatch script, nothing submitted.
    `fresh_code`: the sweep's code frozen anew first (Slurm; refused while a trial is
    queued or running). `overrides`: KEY=VALUE settings for each rerun trial's config.yaml
    (a longer cluster.timeout_min for trials that timed out), checked for every trial
    before any is written; not the swept keys, which make the trials what they are.
    `trials` (`--trials 3,4,10-12`, Sweep.rerun): these trials instead, whatever their
    state, each from its newest checkpoint; refused while one is queued or running.
    `from_scratch`: each from its first epoch instead (start_over)."""
    from hpcdl.cli.resume_run import refuse_edited_values
    from hpcdl.launch.slurm_state import is_active
    from hpcdl.rundir import open_run_dir
    from hpcdl.sweep import ledger as ledger_mod
    from hpcdl.sweep.ledger import RERUNNABLE
    from hpcdl.sweep.report import refresh

    def rerunnable(state: str) -> bool:
        return not is_active(state) if trials is not None else state in RERUNNABLE

    ledger, _ = refresh(sweep_dir)
    if trials is None:
        failed = [t.index for t in ledger.trials if rerunnable(t.state)]
        selection = ["--failed"]
    else:
        failed = chosen_trials(ledger, trials)
        selection = ["--trials", ",".join(map(str, failed))]
    selection += ["--from-scratch"] if from_scratch else []
    if not failed:
        print("no failed trials to rerun")
        return failed, EXIT_OK
    chosen = [(i, open_run_dir(ledger.trial(i).run_dir)) for i in failed]
    for i, (cfg, run_dir) in chosen:  # a config.yaml fixed by hand, checked before sbatch
        refuse_edited_values(cfg, run_dir, f"trial {i}: ")
    if overrides:
        chosen = rerun_settings(ledger, chosen, list(overrides))
    if trials is not None and not from_scratch:
        refuse_nothing_to_train(chosen, sweep_dir, ledger.swept_keys)
    if fresh_code:
        from hpcdl.cli.fresh import fresh_sweep_code, fresh_sweep_dry_line, refreeze_sweep

        fresh_code = fresh_sweep_code(ledger)
    again = " ".join(selection)
    if ledger.launcher == "slurm" and not fresh_code:
        from hpcdl.launch.slurm import warn_edited_code
        from hpcdl.rundir import SweepDir

        fix = f"to run your edits: hpcdl sweep rerun {sweep_dir} {again} --fresh-code"
        warn_edited_code(SweepDir(Path(ledger.sweep_dir)), "the rerun", fix)
    if dry_run:
        print(f"would rerun {rerun_line(failed)}")
        if overrides:
            print(f"# each with {shlex.join(overrides)} in its config.yaml (nothing written)")
        if from_scratch:
            print("# each from its first epoch: its checkpoints/ set aside (nothing moved)")
        if ledger.launcher == "slurm":
            if fresh_code:
                print(fresh_sweep_dry_line(ledger))
            from hpcdl.cli.array_scripts import print_array_scripts

            print_array_scripts([(i, cfg) for i, (cfg, _) in chosen], sweep_dir)
        print("# dry run: nothing submitted")
        return failed, EXIT_OK
    if ledger.launcher == "slurm":
        from hpcdl.sweep.launch import submit_arrays

        with ledger_mod.locked(sweep_dir) as led:
            # As the ledger is now: a rerun beside this one may have submitted some of them.
            failed = [i for i in failed if rerunnable(led.trial(i).state)]
            if not failed:
                print("no failed trials to rerun (a rerun beside this one submitted them)")
                return failed, EXIT_OK
            fresh = refreeze_sweep(led) if fresh_code else None
            write_rerun_settings(sweep_dir, chosen, failed, overrides, selection)
            if from_scratch:
                start_over(chosen, failed)
            print(f"rerunning {rerun_line(failed)}", flush=True)
            try:
                arrays = submit_arrays(led, failed)
            except HpcdlError:
                if fresh is not None:
                    fresh.put_back()
                raise
        print(submitted_line(arrays, len(failed)))
        return failed, EXIT_OK
    write_rerun_settings(sweep_dir, chosen, failed, overrides, selection)
    if from_scratch:
        start_over(chosen, failed)
    print(f"rerunning {rerun_line(failed)}", flush=True)
    from hpcdl.sweep.launch import run_local_pool

    return failed, run_local_pool(ledger, failed)


def chosen_trials(ledger: Any, trials: Sequence[int]) -> list[int]:
    """`--trials`: the indices, each a trial of the sweep and none queued or running (its
    job would train beside the rerun's), else a one-line error naming them."""
    from hpcdl.launch.slurm_state import is_active
    from hpcdl.number_ranges import number_ranges

    unknown = [i for i in trials if not 0 <= i < len(ledger.trials)]
    if unknown:
        raise HpcdlError(
            f"--trials {number_ranges(unknown)}: no such trial in {ledger.sweep_dir}; its "
            f"trials are 0-{len(ledger.trials) - 1}"
        )
    busy = [i for i in trials if is_active(ledger.trial(i).state)]
    if busy:
        states = ", ".join(sorted({ledger.trial(i).state for i in busy}))
        raise HpcdlError(
            f"--trials: {rerun_line(busy)} still queued or running ({states}); leave them "
            f"out, or wait for them, or `hpcdl cancel {ledger.sweep_dir}/<trial>` first"
        )
    return sorted(trials)


def start_over(trials: list[tuple[int, tuple[Config, Any]]], indices: list[int]) -> None:
    """`--from-scratch`: each trial of `indices` set to train from its first epoch, as
    `hpcdl resume --from-scratch` sets a run (its checkpoints/ and the program's records
    moved aside, deleting nothing; its metrics and summary cleared)."""
    from hpcdl.rundir import program_records

    for i, (cfg, run_dir) in trials:
        if i in indices:
            aside = run_dir.set_aside_checkpoints(program_records(cfg, run_dir))
            run_dir.clear_history()
            if aside is not None:
                print(f"trial {i}: --from-scratch: its checkpoints moved to {aside}", flush=True)


def refuse_nothing_to_train(
    trials: list[tuple[int, tuple[Config, Any]]], sweep_dir: Path, swept: Sequence[str] = ()
) -> None:
    """A trial rerun from its newest checkpoint that has trained all it is set to (a
    completed one, rerun as it is) would end at once: refused, with the ways to train it
    (`hpcdl resume` of the trial where trainer.max_epochs is swept: a rerun may not set it)."""
    from hpcdl.nothing_to_train import nothing_to_train

    for i, (cfg, run_dir) in trials:
        line = nothing_to_train(cfg, run_dir)
        if line is not None:
            longer = (
                f"hpcdl resume {run_dir.path} trainer.max_epochs=N (trainer.max_epochs is "
                "swept, so a sweep rerun may not set it)"
                if "trainer.max_epochs" in swept or "trainer" in swept
                else f"hpcdl sweep rerun {sweep_dir} --trials {i} trainer.max_epochs=N"
            )
            raise HpcdlError(
                f"trial {i}: {line}: {longer}; or train it again from its first epoch: hpcdl "
                f"sweep rerun {sweep_dir} --trials {i} --from-scratch"
            )


def rerun_settings(
    ledger: Any, trials: list[tuple[int, tuple[Config, Any]]], overrides: list[str]
) -> list[tuple[int, tuple[Config, Any]]]:
    """Each trial's config with `overrides` applied and checked (as `hpcdl resume RUN_DIR
    KEY=VALUE` checks them); a swept key is refused: it is what makes the trial itself."""
    from hpcdl.cli.compose import apply_overrides
    from hpcdl.cli.resume_run import refuse_trainer_keys

    for text in overrides:
        key = text.partition("=")[0].lstrip("+~")
        if key in ledger.swept_keys or key.split(".", 1)[0] in ledger.swept_keys:
            examples = [
                e
                for e in ("cluster.timeout_min=240", "trainer.max_epochs=50")
                if e.split("=")[0] not in ledger.swept_keys
            ]
            other = f"settings ({', '.join(examples)})" if examples else "settings"
            raise ConfigError(
                f"{key}: a swept key, whose value makes each trial what it is; rerun with other "
                f"{other}, or sweep other values as a new sweep; `hpcdl resume SWEEP_DIR/N "
                f"{key}=...` changes it for trial N alone"
            )
    changed = []
    for i, (cfg, run_dir) in trials:
        refuse_trainer_keys(cfg, overrides, run_dir)
        try:
            changed.append((i, (apply_overrides(cfg, overrides), run_dir)))
        except ConfigError as err:
            raise ConfigError(f"trial {i}: {err}") from None
    return changed


def write_rerun_settings(
    sweep_dir: Path,
    trials: list[tuple[int, tuple[Config, Any]]],
    indices: list[int],
    overrides: Sequence[str],
    selection: Sequence[str] = ("--failed",),
) -> None:
    """The checked configs of the trials rerun now into their config.yaml, and a `rerun:`
    line in their commands.log (the sweep summary notes it under the table; so it does
    `--from-scratch`)."""
    if not overrides and "--from-scratch" not in selection:
        return
    for i, (cfg, run_dir) in trials:
        if i in indices:
            if overrides:
                run_dir.save_config(cfg)
            run_dir.record_rerun(sweep_dir, overrides, selection)
