"""`hpcdl resume` of a run from any folder, and of an `hpcdl run` run: the parts of
cmd_resume (hpcdl.cli.resume_cmd) that are about where the run's paths resolve and what its
program is.

    hpcdl resume RUN_DIR [overrides] [-- COMMAND...]

- Paths typed on the resume's command line (data.path=, init_from=, workdir=) are the
  current folder's: made absolute here. The run's own relative ones are its workdir's.
- `-- COMMAND...` replaces an `hpcdl run` run's program (refused for `hpcdl train` runs).
- The program is checked as `hpcdl run` checks it, from the run's workdir, where the job
  starts it; a workdir that is gone is refused with the fix.
- A run whose program completed is not run again unless the command changes.

Never imports torch.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

from hpcdl.config.paths import path_keys, with_absolute_paths
from hpcdl.config.schema import Config, Launcher
from hpcdl.errors import ConfigError
from hpcdl.rundir import RunDir
from hpcdl.workdir import from_here, missing_workdir


def resumed_config(stored: Config, cfg: Config, program: list[str], run_dir: RunDir) -> Config:
    """`cfg` (the stored config with the overrides) with `-- COMMAND...` as its program,
    and the paths the overrides gave made absolute from here."""
    if program:
        if cfg.script is None:
            raise ConfigError(
                f"-- {program[0]} ...: {run_dir.path} is an `hpcdl train` run, whose job is "
                "hpcdl's trainer; a command after -- replaces an `hpcdl run` run's program. "
                "Change the trainer's keys as overrides (trainer.max_epochs=50)"
            )
        script = replace(cfg.script, command=list(program), entry=None, entry_kwargs={})
        cfg = replace(cfg, script=script)
    before = path_keys(stored)
    given = frozenset(k for k, v in path_keys(cfg).items() if before.get(k) != v)
    cfg = with_absolute_paths(cfg, Path.cwd(), only=given)
    if cfg.workdir is not None and cfg.workdir != stored.workdir:  # workdir=NEW_FOLDER
        cfg = replace(cfg, workdir=str(Path(from_here(cfg.workdir, None)).resolve()))
    return cfg


def refuse_edited_values(cfg: Config, run_dir: RunDir, who: str = "") -> None:
    """A config.yaml edited by hand (sweeps.md's fix for a failed trial) is checked as
    `hpcdl train` checks its overrides, before anything is submitted: its job would fail
    on its node after the queue wait. Relative paths are the run's workdir's, as the job
    reads them (a workdir that is gone is refuse_unrunnable's to say). `who`: "trial N: "."""
    from hpcdl.config.validate import validate
    from hpcdl.errors import DataError
    from hpcdl.workdir import in_workdir

    if missing_workdir(cfg.workdir) is not None:
        return
    try:
        with in_workdir(cfg.workdir):
            validate(cfg, resuming=True)
    except (ConfigError, DataError) as err:
        raise ConfigError(f"{who}{run_dir.config_file}: {err}; fix it there") from None


def refuse_trainer_keys(stored: Config, overrides: list[str], run_dir: RunDir) -> None:
    """An `hpcdl run` run resumed with `hpcdl train`'s keys (optim.lr=0.5,
    trainer.max_epochs=99): its program reads its own arguments, so they would be written
    to config.yaml and change nothing; refused as `hpcdl run` refuses them."""
    from hpcdl.config.convert import GROUPS, PRESET_GROUPS, TOP_LEVEL_KEYS

    if stored.script is None:
        return
    for text in overrides:
        key = text.partition("=")[0].lstrip("+~")
        top = key.split(".", 1)[0]
        if top != "cluster" and top in (*GROUPS, *PRESET_GROUPS, *TOP_LEVEL_KEYS):
            raise ConfigError(
                f"{key}: hpcdl train's key, unused by {run_dir.path}, an `hpcdl run` run (its "
                "program reads its own arguments): give its command again after --, e.g. "
                f"hpcdl resume {run_dir.path} -- python train.py --lr 0.5"
            )


def refuse_unrunnable(
    stored: Config, cfg: Config, run_dir: RunDir, fresh_code: bool = False
) -> None:
    """A workdir that is gone, or a program its job could not start there, refused on the
    login node: the job would fail (and the run show FAILED), or start another folder's
    script of the same name. A run without a recorded workdir is checked only for a new
    command, from here, as before."""
    from hpcdl.config.validate import check_script

    why = missing_workdir(cfg.workdir)
    if why is not None:
        raise ConfigError(why)
    if cfg.script is None:
        return
    if cfg.workdir is not None:
        check_script(cfg.script, cfg.cluster, cfg.workdir)
    elif cfg.script != stored.script:
        check_script(cfg.script, cfg.cluster)
    new_command = stored.script is None or cfg.script.command != stored.script.command
    if cfg.cluster.launcher == Launcher.slurm and new_command and not fresh_code:
        refuse_unfrozen_script(cfg, run_dir)  # --fresh-code copies the script's folder anew


def refuse_unfrozen_script(cfg: Config, run_dir: RunDir) -> None:
    """A new command on Slurm runs its script from the run's frozen copy (code/script/, made
    once, at the first submission): one that is not there would fail in the job."""
    from hpcdl.launch.snapshot import SCRIPT_DIR, frozen_script

    assert cfg.script is not None
    code = run_dir.job_base().code_dir
    if not (code / SCRIPT_DIR).is_dir():
        return  # frozen at this submission
    command, source = frozen_script(code, cfg.script.command, cfg.workdir)
    missing = [t for t in command if t.startswith(str(code)) and not Path(t).is_file()]
    if source is not None and missing:
        raise ConfigError(
            f"{Path(missing[0]).name}: not in {code / SCRIPT_DIR}, the copy of the script's "
            "folder made when the run was first submitted, which its jobs run; start a new "
            "run for it (hpcdl run ... -- COMMAND)"
        )


def changes_program(stored: Config, cfg: Config) -> bool:
    """Whether the resume starts another program than the run's (its command, its entry
    function or that function's arguments)."""
    assert stored.script is not None and cfg.script is not None
    before, after = stored.script, cfg.script
    return (before.command, before.entry, before.entry_kwargs) != (
        after.command,
        after.entry,
        after.entry_kwargs,
    )


def completed_line(stored: Config, cfg: Config, run_dir: RunDir) -> Optional[str]:
    """For an `hpcdl run` run whose last attempt completed (its program exited 0), resumed
    with the same program: the line that says so and how to run it again; None otherwise."""
    if cfg.script is None or stored.script is None or changes_program(stored, cfg):
        return None
    if not run_dir.last_attempt_completed():
        return None
    return (
        f"{run_dir.path}: its program completed (exit status 0): nothing to resume; to run "
        f"it again from the start, `hpcdl resume {run_dir.path} --from-scratch` (moves its "
        "checkpoints/ aside, clears summary.json), or give another command: "
        f"hpcdl resume {run_dir.path} -- COMMAND..."
    )
