"""`hpcdl resume RUN_DIR [overrides] [--from CHECKPOINT] [--from-scratch] [--fresh-code]
[-- COMMAND...]`:
the resume command and what it refuses before anything is written (a job still queued, a
changed optimizer or data split, lost checkpoints). Where the run's paths resolve and
what its program is: hpcdl.cli.resume_run; launching: hpcdl.cli.main.

Never imports torch unless the run trains on this machine.
"""

from __future__ import annotations

import argparse
import re
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from hpcdl.errors import HpcdlError, plural
from hpcdl.exit_codes import EXIT_BAD_INPUT, EXIT_OK

if TYPE_CHECKING:
    from hpcdl.config.schema import Config
    from hpcdl.resume_from import ChosenCheckpoint
    from hpcdl.rundir import RunDir


def cmd_resume(args: argparse.Namespace) -> int:
    from hpcdl.cli.compose import apply_overrides
    from hpcdl.cli.main import launch, preflight
    from hpcdl.cli.resume_run import (
        completed_line,
        refuse_edited_values,
        refuse_trainer_keys,
        refuse_unrunnable,
        resumed_config,
    )
    from hpcdl.nothing_to_train import nothing_to_train
    from hpcdl.probe import probe_user_code
    from hpcdl.rundir import open_run_dir, program_records
    from hpcdl.runlock import hold, is_held
    from hpcdl.workdir import in_workdir

    cfg, run_dir = open_run_dir(args.run_dir)
    refuse_if_still_queued(run_dir)
    submitted = run_dir.read_submission()
    chosen = choose_checkpoint(cfg, run_dir, args)  # --from: None without it
    stored = cfg
    if args.overrides:
        refuse_trainer_keys(stored, args.overrides, run_dir)
        cfg = apply_overrides(cfg, args.overrides, args.config_dir)  # validated there
    else:
        refuse_edited_values(cfg, run_dir)
    cfg = resumed_config(stored, cfg, args.program, run_dir)  # -- COMMAND; paths from here
    # its workdir gone, or its script not there
    refuse_unrunnable(stored, cfg, run_dir, getattr(args, "fresh_code", False))
    if cfg != stored:
        if (cfg.model, cfg.data, cfg.task) != (stored.model, stored.data, stored.task):
            with in_workdir(cfg.workdir):  # data.kwargs paths are the run's folder's
                probe_user_code(cfg)  # before the changed config is saved
        refuse_another_optimizer(stored, cfg, run_dir)
        if not args.from_scratch and cfg.cluster.launcher.value == "slurm":
            # Here, the job says it at once, naming the first weight that does not fit.
            refuse_another_model(stored, cfg, run_dir)
    refuse_another_split(trained_data(stored, run_dir), stored, cfg, run_dir)
    if not args.from_scratch and not is_held(run_dir):  # a holder is refused below
        if chosen is None:
            line = nothing_to_train(cfg, run_dir) or completed_line(stored, cfg, run_dir)
        else:
            line = chosen.nothing_to_train(cfg)
        if line is not None:  # what the job would say once it had waited in the queue
            print(line, flush=True)
            return EXIT_OK
    fresh_code = wants_fresh_code(args, cfg, chosen)
    if args.dry_run:
        from hpcdl.cli.resume_dry import dry_run_resume

        return dry_run_resume(
            stored,
            cfg,
            run_dir,
            chosen,
            from_scratch=args.from_scratch,
            skip_preflight=args.no_preflight,
            fresh_code=fresh_code,
        )
    preflight(cfg, args.no_preflight)
    if not args.from_scratch:
        refuse_lost_checkpoints(run_dir)
    origin = run_dir
    if chosen is not None and chosen.new_run_dir is not None:
        run_dir = chosen.branch(stored)  # RUN_DIR is only read; NEW_DIR is launched below
    if cfg.cluster.launcher.value == "slurm" and not fresh_code:
        from hpcdl.cli.resume_dry import warn_edited

        warn_edited(origin, run_dir)
    with hold(run_dir):  # before anything is written: a second resume changes nothing
        if run_dir.read_submission() != submitted:  # a resume beside this one submitted
            refuse_if_still_queued(run_dir)
        if chosen is not None and chosen.new_run_dir is None:
            chosen.continue_in_place(program_records(cfg, run_dir))
        if args.from_scratch:
            records = program_records(cfg, run_dir)
            aside = run_dir.set_aside_checkpoints(records)
            run_dir.clear_history()
            if aside is not None:
                also = "".join(f" and {path.name}" for path in records)
                print(f"--from-scratch: its checkpoints{also} moved to {aside}", flush=True)
            foreign = run_dir.foreign_entries(records) if cfg.script is not None else []
            if foreign:  # a program's own checkpoints there: it would resume from them
                print(
                    f"--from-scratch: warning: {', '.join(foreign)} in {run_dir.path} stay "
                    "where they are (only checkpoints/ is set aside); a program that resumes "
                    "from them does not start from scratch: move them, or keep your "
                    "checkpoints under $HPCDL_RUN_DIR/checkpoints/",
                    flush=True,
                )
        stored_config = run_dir.config_file.read_bytes()
        cfg = run_dir.save_config(cfg)
        run_dir.record_command("resume")
        # A sweep trial's first attempt goes through resume too: it starts.
        verb = "resuming" if run_dir.has_started() else "starting"
        fresh, launched = None, time.time()
        try:
            if fresh_code:  # refused (a trial of its sweep running): before the line below
                from hpcdl.cli.fresh import refreeze_for_resume

                fresh = refreeze_for_resume(run_dir, cfg)
            print(f"{verb} run dir: {run_dir.path}", flush=True)
            code = launch(cfg, run_dir)
            if fresh is not None:
                from hpcdl.cli.fresh import record_trial_refreeze

                record_trial_refreeze(run_dir, fresh)
        except HpcdlError:  # refused at submission (sbatch, the cluster), or in-process
            if run_dir.wrote_since(launched):  # after training (cluster=debug): keep it all
                raise
            if fresh is not None:
                fresh.put_back()
            keep_config(run_dir, stored_config, args.overrides, chosen)
            raise
        # Refused by the job that ran here (its checkpoint does not fit), before it trained:
        # a run that trained, then stopped on bad input (non-finite losses), keeps it all.
        if code == EXIT_BAD_INPUT and not run_dir.wrote_since(launched):
            keep_config(run_dir, stored_config, args.overrides, chosen)
        return code


def wants_fresh_code(
    args: argparse.Namespace, cfg: Config, chosen: Optional[ChosenCheckpoint]
) -> bool:
    """`--fresh-code` where it changes what the job runs: a Slurm resume in place (a
    branch's job freezes the code anew anyway; a local run runs the code as it is now)."""
    if not getattr(args, "fresh_code", False):
        return False
    if cfg.cluster.launcher.value != "slurm":
        print(
            f"--fresh-code: cluster={cfg.cluster.name} trains here, with your code as it is "
            "now; nothing is frozen",
            flush=True,
        )
        return False
    return chosen is None or chosen.new_run_dir is None


def choose_checkpoint(
    cfg: Config, run_dir: RunDir, args: argparse.Namespace
) -> Optional[ChosenCheckpoint]:
    """`resume --from`: the chosen checkpoint, verified (refusals change nothing)."""
    from hpcdl.resume_from import choose

    if args.from_checkpoint is None:
        if args.new_run_dir is not None:
            raise HpcdlError("--new-run-dir: give the checkpoint to continue from with --from")
        return None
    return choose(
        cfg,
        run_dir,
        args.from_checkpoint,
        from_scratch=args.from_scratch,
        new_run_dir=args.new_run_dir,
    )


def keep_config(
    run_dir: RunDir, stored: bytes, overrides: list[str], chosen: Optional[ChosenCheckpoint]
) -> None:
    """A resume refused once launched leaves config.yaml as it was, so that a plain
    `hpcdl resume` still works, and commands.log without the resume's line; a refused
    --new-run-dir branch is removed."""
    from hpcdl.atomic import write_atomic

    if chosen is not None and chosen.new_run_dir is not None:
        chosen.discard_branch()
        return
    run_dir.withdraw_command("resume")
    if overrides:
        write_atomic(run_dir.config_file, stored)
        print(f"{run_dir.config_file}: left as it was, without these overrides", flush=True)


def refuse_another_optimizer(stored: Config, cfg: Config, run_dir: RunDir) -> None:
    """A run's checkpoints hold its optimizer's state (momentum buffers, Adam's moments),
    which another optimizer cannot continue from: refused before config.yaml changes (the
    job refuses it too). Adam and AdamW keep the same state."""
    family = {"adamw": "adam"}
    before, after = stored.optim.name, cfg.optim.name
    if family.get(before, before) == family.get(after, after):
        return
    if any(run_dir.checkpoint_dir.glob("step_*")):
        raise HpcdlError(
            f"optim={after}: {run_dir.path}'s checkpoints hold optim={before} state, which "
            f"{after} cannot continue from; resume with optim={before}, or start a new run "
            f"from its weights: hpcdl train init_from={run_dir.path} optim={after}"
        )


# Built-in models' keys that change no weight's shape: the others make weights a checkpoint
# of the run cannot fill.
SHAPELESS_MODEL_KEYS = ("dropout",)


def refuse_another_model(stored: Config, cfg: Config, run_dir: RunDir) -> None:
    """A built-in model whose weights the run's checkpoints cannot fill (another model, or
    other layer sizes), resumed on Slurm: refused on the login node, before config.yaml
    changes or a job waits in the queue to find it out. A custom model's fit is the job's to check (its
    code may take the same weights under another target)."""
    from dataclasses import asdict

    if cfg.model == stored.model or "custom" in (cfg.model.name, stored.model.name):
        return
    if not any(run_dir.checkpoint_dir.glob("step_*")):
        return
    if cfg.model.name != stored.model.name:
        changed, was = f"model={cfg.model.name}", f"model={stored.model.name}"
    else:
        before, after = asdict(stored.model), asdict(cfg.model)
        keys = [k for k in after if after[k] != before[k] and k not in SHAPELESS_MODEL_KEYS]
        if not keys:
            return
        changed = " ".join(f"model.{k}={_value(after[k])}" for k in keys)
        was = " ".join(f"model.{k}={_value(before[k])}" for k in keys)
    raise HpcdlError(
        f"{changed}: {run_dir.path}'s checkpoints hold the weights of {was}, which this "
        f"model cannot take; resume with {was}, or train a new run (hpcdl train {changed} "
        "...)"
    )


def _value(value: Any) -> str:
    """A value as it is written on the command line: [30,60], not [30, 60]."""
    return str(value).replace(" ", "")


# What decides which samples are training, validation and test rows, and what the model's
# inputs are: the dataset, its split, its preprocessing (fitted on the training rows).
SPLIT_KEYS = (
    "name",
    "split_seed",
    "val_fraction",
    "test_fraction",
    "num_folds",
    "fold",
    "standardize",
    "stratify",  # data=imagefolder
)
# Per data kind, the keys whose value makes another dataset (schema.DATA_SCHEMAS): other
# samples, labels or classes. Where the data is read from (data.path, data.labels_path,
# after moving the files) and how (the loader's keys) stay free.
DATASET_KEYS: dict[str, tuple[str, ...]] = {
    "synthetic": ("num_samples", "num_classes", "shape", "noise", "seed"),
    "custom": ("kwargs",),
    "files": ("label_column", "feature_columns"),  # the columns in order: weights per position
}


def refuse_another_split(
    trained: dict[str, Any], stored: Config, cfg: Config, run_dir: RunDir
) -> None:
    """A run's checkpoints were trained on its training rows of its dataset (`trained`: the
    data config of the newest checkpoint, or config.yaml's before the overrides where no
    checkpoint.json tells): continued on another split, rows it trained on would become
    validation and test rows (the val and test metrics silently wrong), and mid-run the
    old val and test rows would be trained on; on another dataset, it would silently be
    another run. Refused before config.yaml changes, like another optimizer, whether the
    overrides or an edit of config.yaml changed it; data.path, the loader's keys stay
    free to change."""
    from hpcdl.config.convert import to_plain

    after = to_plain(cfg)["data"]
    keys = (*SPLIT_KEYS, *DATASET_KEYS.get(str(after.get("name")), ()))
    # Keys a record of an older hpcdl lacks are not known: not compared.
    changed = [key for key in keys if key in trained and trained[key] != after.get(key)]
    if changed == ["kwargs"] and moved_paths_only(trained["kwargs"], after.get("kwargs")):
        return  # its files moved, as data.path may (the job warns of the change)
    if not changed or run_dir.newest_checkpoint() is None:
        return
    if "name" in changed:  # another dataset: its other keys are another dataset's
        changed = ["name"]
    edited = all(to_plain(stored)["data"].get(key) == after.get(key) for key in changed)

    def setting(data: dict[str, Any], key: str) -> str:
        if key == "name":
            return f"data={data.get(key)}"
        if key == "kwargs" and isinstance(trained[key], dict) and isinstance(after[key], dict):
            return kwargs_settings(data[key], trained[key], after[key])
        return shell_word(f"data.{key}={override_value(data.get(key))}")

    old = " ".join(setting(trained, key) for key in changed)
    new = " ".join(setting(after, key) for key in changed)
    dataset_keys = DATASET_KEYS.get(str(after.get("name")), ())
    if changed == ["name"] or any(key in dataset_keys for key in changed):
        trained_on = f"on {old}, another dataset"
    elif changed == ["standardize"]:
        trained_on = f"on inputs preprocessed with {old}, unlike {new}'s"
    else:
        trained_on = f"on the training rows of {old}, some of which would be validation "
        trained_on += f"and test rows with {new}"
    where = f" in {run_dir.config_file}" if edited else ""
    raise HpcdlError(
        f"{new}{where}: {run_dir.path}'s checkpoints were trained {trained_on}; resume with "
        f"{old}, or start a new run: the command that made this one "
        f"({run_dir.path / run_dir.COMMANDS}) with {new} (init_from={run_dir.path} for its "
        "weights only)"
    )


def kwargs_settings(data: dict[str, Any], trained: dict[str, Any], after: dict[str, Any]) -> str:
    """The data.kwargs keys whose values differ between `trained` and `after`, as `data`
    (one of them) has them: `data.kwargs.seed=3`, or `data.kwargs.seed unset`."""
    keys = [k for k in {**trained, **after} if trained.get(k, ...) != after.get(k, ...)]
    return " ".join(
        shell_word(f"data.kwargs.{k}={override_value(data[k])}")
        if k in data
        else f"data.kwargs.{k} unset"
        for k in keys
    )


def moved_paths_only(before: Any, after: Any) -> bool:
    """data.kwargs that differ only in paths (a value with a '/' on both sides) to folders or
    files that exist: the dataset moved (to scratch, another mount), not another dataset."""
    if not isinstance(before, dict) or not isinstance(after, dict) or before.keys() != after.keys():
        return False
    differ = [key for key in after if after[key] != before[key]]

    def path_like(value: Any) -> bool:
        return isinstance(value, str) and "/" in value

    return bool(differ) and all(
        path_like(before[key]) and path_like(after[key]) and Path(after[key]).exists()
        for key in differ
    )


def shell_word(text: str) -> str:
    """`text` as one shell word to paste: as is when safe, else in single quotes, or in
    double quotes when it holds single quotes (Hydra's quoted strings: [rooms,'area sqft'])
    and nothing a shell expands there."""
    quoted = shlex.quote(text)
    if quoted == text or "'" not in text or any(c in text for c in '"$`\\!'):
        return quoted
    return f'"{text}"'


def trained_data(stored: Config, run_dir: RunDir) -> dict[str, Any]:
    """The data config the newest checkpoint was saved with (checkpoint.json), else
    config.yaml's as it was before this resume."""
    from hpcdl.config.convert import to_plain

    record = run_dir.read_checkpoint_record()
    if record is not None and isinstance(record.get("data_config"), dict):
        return dict(record["data_config"])
    return dict(to_plain(stored)["data"])


def override_value(value: Any) -> str:
    """A value as an override writes it (Hydra's grammar): true, null, [16], {root:/data}."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{override_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(override_value(v) for v in value) + "]"
    text = str(value)
    plain = re.fullmatch(r"[A-Za-z_/][\w./-]*", text) and text.lower() not in KEYWORDS
    if isinstance(value, str) and not plain:  # else read as another type, or not at all
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return text


# Words Hydra's override grammar reads as other types than strings.
KEYWORDS = ("true", "false", "null", "nan", "inf")


def refuse_lost_checkpoints(run_dir: RunDir) -> None:
    """A run with epochs on record but no checkpoint left would silently retrain from
    epoch 1 into the same history: only with --from-scratch, which clears that history."""
    from hpcdl.rundir import EPOCHS_NEEDING_A_CHECKPOINT

    epochs = len(run_dir.metrics.read())
    if epochs < EPOCHS_NEEDING_A_CHECKPOINT:
        return
    fix = (
        f"retrain from epoch 1 with `hpcdl resume {run_dir.path} --from-scratch` (clears its "
        "metrics and summary; damaged checkpoints are set aside, not deleted)"
    )
    files = sorted(run_dir.checkpoint_dir.glob("step_*"))
    if not files:
        raise HpcdlError(
            f"{run_dir.path}: metrics.csv records {plural(epochs, 'epoch')} but "
            f"{run_dir.checkpoint_dir} holds no checkpoint to continue from; {fix}"
        )
    damage = [framing_damage(path) for path in files]
    if all(damage):  # each cut short or not hpcdl's, seen from its ends: no job to queue for it
        raise HpcdlError(
            f"{run_dir.path}: none of its {plural(len(files), 'checkpoint')} is whole "
            f"({damage[-1]}); {run_dir.checkpoint_dir} holds no valid checkpoint to continue "
            f"from; {fix}"
        )


def framing_damage(path: Path) -> Optional[str]:
    """Why a checkpoint file is damaged as seen from its two ends (truncated, a frame that
    does not match its size, not hpcdl's): read in microseconds, without its payload, so a
    login node checks even large ones; None for one whose frame holds (a checksum mismatch
    inside it is the job's to find)."""
    from hpcdl.checkpoint_file import stored_checksum
    from hpcdl.errors import CheckpointError

    try:
        stored_checksum(path)
    except CheckpointError as err:
        return str(err)
    return None


def refuse_if_still_queued(run_dir: RunDir) -> None:
    """Two jobs training one run dir would corrupt it: resume only once the last is gone."""
    from hpcdl.launch.monitor import is_active, job_state

    record = run_dir.read_submission()
    if record is None:
        return
    job_id = str(record["job_id"])
    state = job_state(job_id)["state"]
    if not is_active(state):
        return
    # A job cancelled (`hpcdl cancel`: it recorded its stop) or ending leaves the queue in
    # seconds; one that requeued itself comes back.
    ends = [a for a in run_dir.read_attempts() if a.get("event") == "end"]
    last = ends[-1] if ends else {}
    stopped = str(last.get("job_id")) == job_id and last.get("reason") != "requeued"
    stopped = stopped and not str(last.get("action", "")).startswith(("requeue", "chained"))
    if state == "COMPLETING" or stopped:
        raise HpcdlError(
            f"{run_dir.path}: its job {job_id} is ending ({state}); wait a few seconds for "
            f"it to leave the queue (`hpcdl status {run_dir.path}`), then resume"
        )
    raise HpcdlError(
        f"{run_dir.path}: its job {job_id} is still {state}; it resumes by itself when "
        f"requeued, or stop it first with `hpcdl cancel {run_dir.path}`"
    )
