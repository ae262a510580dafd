"""`hpcdl resume RUN_DIR [overrides] --dry-run`: what the resume would do (where it goes
on from, which keys of config.yaml change, the Slurm job it would submit), after the
refusals a resume meets; nothing is written, locked or submitted.

Never imports torch.
"""

from __future__ import annotations

from dataclasses import asdict
from enum import Enum
from typing import TYPE_CHECKING, Any, Optional

from hpcdl.errors import HpcdlError, plural
from hpcdl.exit_codes import EXIT_OK

if TYPE_CHECKING:
    from hpcdl.config.schema import Config
    from hpcdl.resume_from import ChosenCheckpoint
    from hpcdl.rundir import RunDir


def dry_run_resume(
    stored: Config,
    cfg: Config,
    run_dir: RunDir,
    chosen: Optional[ChosenCheckpoint],
    *,
    from_scratch: bool,
    skip_preflight: bool,
    fresh_code: bool = False,
) -> int:
    """Print the resume's plan; then raise the first refusal the resume itself would meet
    (a writer holding the run dir, lost checkpoints, the cluster's preflight)."""
    from hpcdl.cli.main import preflight, preflight_verdict, print_job
    from hpcdl.cli.resume_cmd import refuse_lost_checkpoints
    from hpcdl.config.schema import Launcher
    from hpcdl.rundir import RunDir
    from hpcdl.runlock import refuse_if_held

    target = run_dir
    if chosen is not None and chosen.new_run_dir is not None:
        target = RunDir(chosen.new_run_dir)
        print(f"# new run dir (not created): {target.path}, from {run_dir.path}")
    else:
        print(f"# run dir: {run_dir.path}")
    print(f"# goes on from: {starting_point(run_dir, chosen, from_scratch)}")
    changes = config_changes(stored, cfg)
    print(f"# config.yaml: {'these keys change' if changes else 'unchanged'}")
    for line in changes:
        print(f"  {line}")
    refusal: Optional[HpcdlError] = None
    if cfg.cluster.launcher == Launcher.slurm:
        if fresh_code:
            from hpcdl.cli.fresh import dry_run_line

            print(dry_run_line(run_dir, cfg))
        else:
            warn_edited(run_dir, target)  # a branch's job freezes the code anew
        script = print_job(cfg, target.job_base())  # a sweep trial's job: its sweep's code, logs
        refusal = preflight_verdict(cfg, skip_preflight, script)
    else:
        ranks = plural(cfg.world_size, "rank")
        print(f"# trains here, in the foreground: cluster={cfg.cluster.name}, {ranks}")
        try:
            preflight(cfg, skip_preflight)  # the GPUs this shell shows
        except HpcdlError as err:
            refusal = err
    print("# dry run: nothing submitted, nothing written", flush=True)
    refuse_if_held(run_dir)
    if not from_scratch:
        refuse_lost_checkpoints(run_dir)
    if refusal is not None:
        raise refusal
    return EXIT_OK


def warn_edited(run_dir: RunDir, launched: RunDir) -> None:
    """A Slurm resume whose frozen modules were edited since: its job runs the copy."""
    from hpcdl.launch.slurm import warn_edited_code

    fix = f"to run your edits: hpcdl resume {run_dir.path} --fresh-code"
    warn_edited_code(launched.job_base(), "its job", fix)


def starting_point(run_dir: RunDir, chosen: Optional[ChosenCheckpoint], from_scratch: bool) -> str:
    """The checkpoint the job would load first, as the records describe it (the job
    verifies it, and falls back to an older one if it does not load)."""
    if from_scratch:
        moved = " (its checkpoints would move aside)" if run_dir.step_files() else ""
        return f"epoch 1, --from-scratch{moved}"
    if chosen is not None:
        later = [p.name for step, p in run_dir.step_files() if step > chosen.step]
        later = later if chosen.new_run_dir is None else []  # a branch leaves them be
        aside = f"; {plural(len(later), 'later checkpoint')} would move aside" if later else ""
        return f"{chosen.where}, --from{aside}"
    newest = run_dir.newest_checkpoint()
    if newest is None:
        return "epoch 1 (no checkpoint yet)"
    record = run_dir.read_checkpoint_record() or {}
    progress = record.get("progress")
    if isinstance(progress, dict):
        from hpcdl.state import Progress

        return f"{newest.name} ({Progress.from_dict(progress).position()})"
    return f"{newest.name} (the newest; the job reads where it stands)"


def config_changes(before: Config, after: Config) -> list[str]:
    """`key: old -> new` for each leaf of the config that differs, dotted as on the
    command line, in the config's order."""
    old, new = dict(_leaves(asdict(before))), dict(_leaves(asdict(after)))
    keys = [*old, *(k for k in new if k not in old)]
    unset = "(unset)"
    return [
        f"{key}: {_text(old.get(key, unset))} -> {_text(new.get(key, unset))}"
        for key in keys
        if key not in old or key not in new or old[key] != new[key]
    ]


def _leaves(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in tree.items():
        if isinstance(value, dict):  # a mapping's entries (cluster.env.X); {} has none
            out += _leaves(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def _text(value: Any) -> str:
    """As on the command line: [30,60], null, the enum's value."""
    if isinstance(value, Enum):
        value = value.value
    if value is None:
        return "null"
    return str(value).replace(", ", ",") if isinstance(value, (list, dict)) else str(value)
