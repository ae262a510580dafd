"""A sweep's dry run on Slurm: the sbatch script of each job array its trials would go in,
split as the submission splits them (hpcdl.sweep.launch.array_parts). Never imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from hpcdl.config.schema import Config
from hpcdl.number_ranges import number_ranges

# Where the previous array's id goes in a later array's --dependency, unknown before it is
# submitted (submitit would quote a `<...>` in the script; put in after).
_PREVIOUS = "PREVIOUS_ARRAY_ID"


def print_array_scripts(trials: list[tuple[int, Config]], sweep_dir: Path) -> None:
    """The sbatch script of each job array these (index, config) trials go in: one per
    distinct cluster config (an array's tasks share its header), a lone trial a plain job.
    A group larger than MaxArraySize allows: a line saying how it is split, its first
    array's script, and each later one as the #SBATCH lines it changes (in full where more
    differs: a lone trial's plain job)."""
    from hpcdl.launch.slurm import python_note
    from hpcdl.sweep.launch import array_parts, max_array_size, waits_for_previous

    limit = max_array_size()
    groups = array_parts(trials, limit)
    for number, parts in enumerate(groups):
        if len(groups) > 1:  # which trials went where: the scripts alone do not say
            print(group_line(parts, number, len(groups)))
        note = python_note(parts[0][0][1].cluster)  # a cluster.python this machine lacks
        if len(parts) == 1:  # as before splits were shown
            print(part_script(parts[0], None, sweep_dir))
            if note is not None:
                print(note)
            continue
        print(split_line(parts, limit))
        names = [f"{'job array' if len(p) > 1 else 'job'} {k + 1}" for k, p in enumerate(parts)]
        first = part_script(parts[0], None, sweep_dir)
        for number, part in enumerate(parts):
            which = f"trial{'s' if len(part) > 1 else ''} {number_ranges([i for i, _ in part])}"
            header = f"# {names[number]} of {len(parts)}: {which}"
            if number == 0:
                print(header)
                print(first)
                continue
            after = names[number - 1] if waits_for_previous(part[0][1], number) else None
            text = part_script(part, after, sweep_dir)
            changed = changed_options(first, text)
            if changed is None:
                print(header)
                print(text)
            else:
                print(f"{header}: the script of {names[0]}, with")
                print("\n".join(changed))
        if note is not None:
            print(note)


def group_line(parts: list[list[tuple[int, Config]]], number: int, num_groups: int) -> str:
    """`# cluster config 1 of 2: trials 0-1, one job array (its tasks 0-1)`: the trials of
    one distinct cluster config, and what they are submitted as."""
    indices = [i for part in parts for i, _ in part]
    which = f"trial{'s' if len(indices) > 1 else ''} {number_ranges(indices)}"
    if len(parts) > 1:
        what = f"{len(parts)} job arrays"
    elif len(indices) > 1:
        what = f"one job array (its tasks 0-{len(indices) - 1}, in this order)"
    else:
        what = "one plain job"
    return f"# cluster config {number + 1} of {num_groups}: {which}, {what}"


def part_script(part: list[tuple[int, Config]], after: Optional[str], sweep_dir: Path) -> str:
    """One array's script, as its submission writes it; waiting for the array named `after`
    (`job array 1`) to end, if given."""
    from hpcdl.launch.slurm import sbatch_text
    from hpcdl.rundir import SweepDir, with_workdir

    text = sbatch_text(
        with_workdir(part[0][1]),  # as the trials' run dirs record it (a rerun's have it)
        SweepDir(sweep_dir),
        array_size=len(part) if len(part) > 1 else None,
        dependency=None if after is None else f"afterany:{_PREVIOUS}",
    )
    return text.replace(_PREVIOUS, f"<{after}>")


def split_line(parts: list[list[tuple[int, Config]]], limit: int) -> str:
    """Why a group's trials go in several arrays, and how the arrays run."""
    num_trials = sum(len(part) for part in parts)
    parallelism = parts[0][0][1].cluster.array_parallelism
    how = (
        "each waits for the one before it to end (--dependency=afterany), so that at most "
        f"cluster.array_parallelism={parallelism} of the {num_trials} trials run at once"
        if parallelism
        else "they run side by side (no cluster.array_parallelism)"
    )
    return (
        f"# {num_trials} trials in {len(parts)} job arrays: MaxArraySize={limit}, so at "
        f"most {limit - 1} trials in one; {how}"
    )


def changed_options(first: str, other: str) -> Optional[list[str]]:
    """The #SBATCH lines of `other` that `first` lacks or has otherwise, when the two
    scripts differ in nothing else; None when they do (a plain job's script)."""
    first_lines, other_lines = first.splitlines(), other.splitlines()
    if [ln for ln in first_lines if not ln.startswith("#SBATCH")] != [
        ln for ln in other_lines if not ln.startswith("#SBATCH")
    ]:
        return None
    options = {_option(ln) for ln in other_lines if ln.startswith("#SBATCH")}
    if any(_option(ln) not in options for ln in first_lines if ln.startswith("#SBATCH")):
        return None  # one it drops
    return [ln for ln in other_lines if ln.startswith("#SBATCH") and ln not in first_lines]


def _option(line: str) -> str:
    """`#SBATCH --array=0-9%2` -> `--array`."""
    return line.split()[1].partition("=")[0]
