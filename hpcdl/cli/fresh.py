"""`--fresh-code` for `hpcdl resume` and `hpcdl sweep rerun --failed`: whose code the
frozen copy is (a run's, or every trial's of its sweep), refused while a trial that shares
it is queued or running (its requeue would load the other code). The freezing itself:
hpcdl.launch.fresh_code. Stdlib only (login node).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from hpcdl.errors import HpcdlError

if TYPE_CHECKING:
    from hpcdl.config.schema import Config
    from hpcdl.launch.fresh_code import FreshCode
    from hpcdl.rundir import JobDir, RunDir
    from hpcdl.sweep.ledger import Ledger


def refuse_busy_trials(ledger: Ledger, but: Optional[int] = None) -> None:
    """A sweep's code is every trial's: not frozen anew while one (other than `but`) is
    queued or running."""
    from hpcdl.launch.slurm_state import is_active

    busy = [t for t in ledger.trials if t.index != but and is_active(t.state)]
    if not busy:
        return
    states = "/".join(sorted({t.state for t in busy}))
    raise HpcdlError(
        f"--fresh-code: trials {[t.index for t in busy]} of {ledger.sweep_dir} are {states} "
        "and would load the new code when requeued (one trial trained by two codes); wait "
        f"until they end (hpcdl sweep status {ledger.sweep_dir}) or cancel them (hpcdl "
        f"cancel {ledger.sweep_dir}), then freeze it anew"
    )


def trial_configs(ledger: Ledger, resumed: Optional[tuple[int, Config]] = None) -> list[Config]:
    """Every trial's config (the sweep's frozen copy serves them all); `resumed`: a
    trial's config as its resume will save it."""
    from hpcdl.rundir import open_run_dir

    configs = []
    for trial in ledger.trials:
        if resumed is not None and trial.index == resumed[0]:
            configs.append(resumed[1])
        else:
            configs.append(open_run_dir(trial.run_dir)[0])
    return configs


def code_configs(run_dir: RunDir, cfg: Config) -> list[Config]:
    """The configs `run_dir`'s frozen copy is for: the run's own (as resumed), or, for a
    sweep trial, every trial's (refused while another trial is queued or running)."""
    from hpcdl.sweep.report import refresh

    base = run_dir.job_base()
    if base.path == run_dir.path:
        return [cfg]
    ledger, _ = refresh(base.path)
    index = int(run_dir.path.name)
    refuse_busy_trials(ledger, but=index)
    return trial_configs(ledger, (index, cfg))


def refreeze_for_resume(run_dir: RunDir, cfg: Config) -> Optional[FreshCode]:
    """Freeze the code of `run_dir`'s jobs anew and say so (None: nothing frozen yet)."""
    from hpcdl.launch.fresh_code import refreeze

    base = run_dir.job_base()
    fresh = refreeze(base, code_configs(run_dir, cfg))
    if fresh is None:
        return None
    if base.path == run_dir.path:
        print(fresh.line("the copy its jobs ran"), flush=True)
        return fresh
    print(fresh.line("the copy the sweep's trials ran") + "; for every trial", flush=True)
    return fresh


def record_trial_refreeze(run_dir: RunDir, fresh: FreshCode) -> None:
    """A sweep trial's resume with --fresh-code, submitted: the sweep's ledger records which
    trials ran the old copy (sweep status and summary name them)."""
    from hpcdl.sweep import ledger as ledger_mod

    base = run_dir.job_base()
    if base.path != run_dir.path:
        with ledger_mod.locked(base.path) as led:
            ledger_mod.record_refreeze(led, fresh.aside)


def dry_run_line(run_dir: RunDir, cfg: Config) -> str:
    """`resume --dry-run --fresh-code`: what would be frozen anew (the checks of the real
    one, nothing moved)."""
    base = run_dir.job_base()
    if not base.code_dir.is_dir():
        return f"# code: frozen at this submission into {base.code_dir}"
    return dry_line(base, code_configs(run_dir, cfg))


def dry_line(base: JobDir, configs: list[Config]) -> str:
    from hpcdl.launch.fresh_code import hpcdl_changed, refuse_lost_modules, unfrozen_commands
    from hpcdl.launch.snapshot import changed_since_frozen

    code = base.code_dir
    unfrozen_commands(code, configs)  # refused as the real one would be
    refuse_lost_modules(code)
    changed = [*changed_since_frozen(code), *(["hpcdl"] if hpcdl_changed(code) else [])]
    if not changed:
        return f"# code: your code is the same as the copy in {code}; nothing frozen anew"
    return (
        f"# code: frozen anew into {code}, the old copy moved to {base.code_aside()}; "
        f"changed since: {', '.join(changed)}"
    )


def fresh_sweep_code(ledger: Ledger) -> bool:
    """`sweep rerun --fresh-code` where it changes what the jobs run: a Slurm sweep, whose
    other trials are all done (theirs is the same copy)."""
    if ledger.launcher != "slurm":
        print(
            f"--fresh-code: cluster={ledger.cluster} trains here, with your code as it is now; "
            "nothing is frozen",
            flush=True,
        )
        return False
    refuse_busy_trials(ledger)
    return True


def refreeze_sweep(ledger: Ledger) -> Optional[FreshCode]:
    """The sweep's code frozen anew, checked again under the ledger's lock."""
    from hpcdl.launch.fresh_code import refreeze
    from hpcdl.rundir import SweepDir
    from hpcdl.sweep.ledger import record_refreeze

    refuse_busy_trials(ledger)
    fresh = refreeze(SweepDir(Path(ledger.sweep_dir)), trial_configs(ledger))
    if fresh is not None:
        record_refreeze(ledger, fresh.aside)  # saved with the ledger by the caller's lock
        print(fresh.line("the copy its trials ran"), flush=True)
    return fresh


def fresh_sweep_dry_line(ledger: Ledger) -> str:
    from hpcdl.rundir import SweepDir

    return dry_line(SweepDir(Path(ledger.sweep_dir)), trial_configs(ledger))
