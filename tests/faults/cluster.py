"""R1, and the dev-cluster halves of R4 and R6: real Slurm jobs on slurm/devcluster (started
here if it is not up, and stopped again afterwards).

R1: runs interrupted at seeded random moments (a delay after the first checkpoint) by
`scontrol requeue`, by preemption from the urgent partition, or by a too-short time limit,
on one node and on two; each must finish with the final weights of the same run trained
without interruption (CPU, deterministic, one thread). R4: a rank of a 2- or 4-rank job
raises, is SIGKILLed or hangs: the job ends non-zero in time, `hpcdl status` names the
rank, nothing is left running. R6: two 2-node jobs submitted at the same moment.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.faults.cases import Case
from tests.faults.runner import REPO, Result, hpcdl

DEVCLUSTER = REPO / "slurm" / "devcluster"
SEED = 20261123
ONE_THREAD = {"OMP_NUM_THREADS": "1"}

# ~1000 steps an epoch at one rank, a few seconds each: long enough to interrupt on purpose.
INTERRUPTIBLE = (
    "data=synthetic",
    "data.num_samples=4000",
    "trainer.batch_size=4",
    "trainer.max_epochs=4",
    "trainer.checkpoint_every_steps=300",
    "trainer.log_every_steps=1000",
)
# Every trial's steps are held back by a step hook (the pause changes nothing computed, so
# the reference is the same), so that its length does not depend on the machine: 15 ms a
# step (~40 s of training) leaves room for two interruptions; 50 ms (~150 s) outlasts a
# 2-minute limit at least once.
PACED = ("trainer.step_hooks=[pace:after_step]",)
PACE_S = {"requeue": 0.015, "preempt": 0.015, "timelimit": 0.05}
TIME_LIMITED = ("cluster.timeout_min=2", "cluster.max_requeues=12")
HOW = ("requeue", "preempt", "timelimit")
# The references train next to the trials on a 2-core machine: allow them time.
REFERENCE_TIMEOUT_S = 1800
NODES = {1: ("cluster.nodes=1",), 2: ("cluster.nodes=2",)}
# Both whole nodes for an urgent job: every job of the other partitions must give way.
URGENT = ("sbatch", "--parsable", "-p", "urgent", "-N", "2", "--exclusive", "-o", "/dev/null")
TRAIN_ON_CLUSTER = (sys.executable, "-m", "hpcdl.cli.main", "train", "cluster=devcluster")
CPU_PARTITION = (
    "cluster.partition=cpu",
    "cluster.gpus_per_node=0",
    "cluster.gpu_type=null",
    "cluster.constraint=null",
)


@contextlib.contextmanager
def devcluster() -> Iterator[None]:
    """The dev cluster, up for the duration; SLURM_CONF set for the commands run here."""
    was_up = subprocess.run([DEVCLUSTER, "status"], capture_output=True).returncode == 0
    if not was_up:
        subprocess.run([DEVCLUSTER, "up"], check=True, capture_output=True, timeout=600)
    conf = subprocess.run([DEVCLUSTER, "env"], capture_output=True, text=True, check=True)
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf.stdout.strip().split("=", 1)[1]
    try:
        yield
    finally:
        os.environ.pop("SLURM_CONF", None)
        if previous is not None:
            os.environ["SLURM_CONF"] = previous
        if not was_up:
            subprocess.run([DEVCLUSTER, "down"], capture_output=True, timeout=600)


def _wait(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def _sacct_state(job_id: str) -> str:
    out = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State"], capture_output=True, text=True
    )
    lines = out.stdout.strip().splitlines()
    return lines[-1].split()[0] if lines and lines[-1].strip() else ""


def _records(run: Path) -> list[dict]:
    path = run / "attempts.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _completed(run: Path) -> bool:
    ends = [a for a in _records(run) if a.get("event") == "end"]
    return (run / "summary.json").exists() and bool(ends) and ends[-1]["reason"] == "completed"


def _submit(folder: Path, run: Path, overrides: Sequence[str]) -> str:
    out = hpcdl(["train", "cluster=devcluster", f"run_dir={run}", *overrides], folder)
    if out.returncode != 0:
        raise RuntimeError(f"submission failed: {out.stderr.strip()[-300:]}")
    return str(json.loads((run / "slurm.json").read_text())["job_id"])


def _weights(run: Path) -> str:
    return str(json.loads((run / "summary.json").read_text())["weights_sha256"])


@dataclass(frozen=True)
class Trial:
    index: int
    how: str  # "requeue" | "preempt" | "timelimit"
    nodes: int
    delays_s: tuple[float, ...]  # after the first checkpoint of each attempt interrupted
    signal_delay_s: int = 30  # time limits: the warning's lead

    @property
    def case(self) -> Case:
        name = f"r1-{self.index:02d}-{self.how}-{self.nodes}node"
        return Case(name, "R1", (), "")

    @property
    def moments(self) -> str:
        if self.how == "timelimit":
            return f"warning {self.signal_delay_s}s before the limit"
        return "interrupted " + ", ".join(f"{d}s" for d in self.delays_s) + " after a checkpoint"

    def overrides(self) -> tuple[str, ...]:
        if self.how == "timelimit":
            lead = f"cluster.signal_delay_s={self.signal_delay_s}"
            return (*NODES[self.nodes], *TIME_LIMITED, lead, *INTERRUPTIBLE, *PACED)
        base = (*NODES[self.nodes], *INTERRUPTIBLE, *PACED)
        return (*CPU_PARTITION, *base) if self.how == "preempt" else base


def plan_r1(count: int = 20) -> list[Trial]:
    """Seeded: the same trials, nodes and moments every time. Per 10: 4 requeues, 3
    preemptions, 3 time limits, on one node and on two alternately."""
    rng = random.Random(SEED)
    kinds = ["requeue"] * 4 + ["preempt"] * 3 + ["timelimit"] * 3
    trials = []
    for i in range(count):
        how = kinds[i % len(kinds)]
        nodes = 1 + (i // len(kinds) + i) % 2
        if how == "timelimit":
            trials.append(Trial(i, how, nodes, (), rng.choice((20, 30, 40))))
            continue
        times = rng.choice((1, 1, 2))
        delays = tuple(round(rng.uniform(0.0, 6.0), 2) for _ in range(times))
        trials.append(Trial(i, how, nodes, delays))
    return trials


class References:
    """The uninterrupted run for each rank count, trained locally with one
    thread (a 2-node job has 2 ranks, the same as 2 local ranks); all started at once, in the
    background, while the trials run."""

    def __init__(self, work: Path, trials: Sequence[Trial]) -> None:
        self.runs: dict[int, tuple[Path, subprocess.Popen]] = {}
        for nodes in sorted({t.nodes for t in trials}):
            run = work / f"reference-{nodes}node"
            ranks = ("cluster=local", "cluster.tasks_per_node=2") if nodes == 2 else ()
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "hpcdl.cli.main",
                    "train",
                    f"run_dir={run}",
                    *ranks,
                    *INTERRUPTIBLE,
                ],
                cwd=work,
                env={**os.environ, "PYTHONPATH": str(REPO)},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            self.runs[nodes] = (run, proc)

    def weights(self, trial: Trial) -> str:
        run, proc = self.runs[trial.nodes]
        _, err = proc.communicate(timeout=REFERENCE_TIMEOUT_S)
        if proc.returncode != 0:
            raise RuntimeError(f"the reference run {run} failed: {err.strip()[-300:]}")
        return _weights(run)


def _interrupt(trial: Trial, job_id: str, run: Path, attempt: int, delay_s: float) -> str:
    """Once `attempt` has started and checkpointed, wait delay_s, then interrupt it."""

    def checkpointed() -> bool:
        starts = [a for a in _records(run) if a.get("event") == "start"]
        return len(starts) >= attempt and any((run / "checkpoints").glob("step_*.pt"))

    if not _wait(checkpointed, 300):
        return "no checkpoint to interrupt after"
    time.sleep(delay_s)
    if _completed(run):
        return "finished before the interruption"
    if trial.how == "requeue":
        subprocess.run(["scontrol", "requeue", job_id], check=True, capture_output=True)
    else:
        urgent = subprocess.run(
            [*URGENT, "--wrap", "sleep 3"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if not _wait(lambda: _sacct_state(urgent) == "COMPLETED", 240):
            return f"the urgent job {urgent} did not run"
    return ""


def r1_start(trial: Trial, work: Path) -> tuple[str, Path, list[str]]:
    """Submit the trial's job and interrupt it as planned: (job id, run dir, problems)."""
    folder = work / trial.case.id
    folder.mkdir()
    pause = PACE_S[trial.how]
    (folder / "pace.py").write_text(
        f"import time\n\ndef after_step(event):\n    time.sleep({pause})\n"
    )
    run = folder / "run"
    job_id = _submit(folder, run, trial.overrides())
    problems: list[str] = []
    for attempt, delay in enumerate(trial.delays_s, start=1):
        problem = _interrupt(trial, job_id, run, attempt, delay)
        if problem:
            problems.append(problem)
            break
    return job_id, run, problems


def r1_finish(trial: Trial, job_id: str, run: Path, problems: list[str], reference: str) -> Result:
    if not _wait(lambda: _completed(run), 900, poll_s=2):
        problems.append(f"did not finish (job {job_id}: {_sacct_state(job_id)})")
        subprocess.run(["scancel", job_id], capture_output=True)
        return Result(trial.case, 1, "", problems)
    ends = [a for a in _records(run) if a.get("event") == "end"]
    stops = [a["reason"] for a in ends if a["reason"] != "completed"]
    starts = [a for a in _records(run) if a.get("event") == "start"]
    # Each stop names itself: an outside `scontrol requeue` (a plain SIGTERM, told from a
    # scancel by Slurm's restart count), a preemption, a time limit.
    expected = {"requeue": "requeued", "preempt": "preempted", "timelimit": "timeout"}[trial.how]
    if len(starts) < 2 and not problems:
        problems.append("never interrupted: one attempt")
    elif expected and expected not in stops and not problems:
        problems.append(f"no {expected} stop recorded: {stops}")
    if _weights(run) != reference:
        problems.append("final weights differ from the uninterrupted run's")
    epochs = [
        line.split(",")[0] for line in (run / "metrics.csv").read_text().splitlines()[1:] if line
    ]
    if len(epochs) != len(set(epochs)):
        problems.append(f"metrics.csv repeats epochs: {epochs}")
    line = f"{len(starts)} attempts (ends: {', '.join(stops)}), {trial.moments}"
    return Result(trial.case, 0, line, problems)


def run_r1(work: Path, quick: bool, progress=None) -> list[Result]:  # type: ignore[no-untyped-def]
    """The requeues and preemptions one at a time (a preemption takes both nodes); then
    the time-limited trials all at once: each needs several 2-minute attempts."""
    trials = plan_r1()
    if quick:  # one of each kind
        trials = [next(t for t in trials if t.how == how) for how in HOW]
    references = References(work, trials)
    results = []
    for trial in [t for t in trials if t.how != "timelimit"]:
        result = r1_finish(trial, *r1_start(trial, work), references.weights(trial))
        _report(progress, trial.case.id, result)
        results.append(result)
    limited = [(t, r1_start(t, work)) for t in trials if t.how == "timelimit"]
    for trial, started in limited:
        result = r1_finish(trial, *started, references.weights(trial))
        _report(progress, trial.case.id, result)
        results.append(result)
    return results


# R4 on the cluster: the hooks of the local R4 (tests/faults/processes.py), frozen with the
# job's code like any step hook.
FAILING_RANK_HOOKS = {
    "raises": (
        "def after_step(event):\n"
        "    if event.global_step == 5 and event.rank == 1:\n"
        "        raise RuntimeError('rank 1 failed on purpose at step 5')\n"
    ),
    "sigkill": (
        "import os, signal\n\ndef after_step(event):\n"
        "    if event.global_step == 5 and event.rank == 1:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
    ),
    "hangs": (
        "import time\n\ndef after_step(event):\n"
        "    while event.global_step == 5 and event.rank == 1:\n"
        "        time.sleep(1)\n"
    ),
    "collective": (
        "import torch.distributed as dist\n\ndef after_step(event):\n"
        "    if event.global_step == 5 and event.rank == 1:\n"
        "        dist.barrier()\n"
    ),
}
FAILING_RUN = (
    "trainer.max_epochs=3",
    "trainer.step_hooks=[failing:after_step]",
    "trainer.stall_timeout_s=20",
)
EXPECTED_CAUSE = {
    "raises": "rank 1: RuntimeError: rank 1 failed on purpose",
    "sigkill": "rank 1: died of Killed on n",
    "hangs": "rank 1: stalled: rank 1 made no progress",
    "collective": "rank 1: hung in a collective until its timeout",
}


def r4_cluster(work: Path, how: str, ranks: int) -> Result:
    case = Case(f"cluster-rank1-{how}-{ranks}ranks", "R4", (), "")
    folder = work / case.id
    folder.mkdir()
    (folder / "failing.py").write_text(FAILING_RANK_HOOKS[how])
    run = folder / "run"
    geometry = ["cluster.nodes=2", f"cluster.gpus_per_node={ranks // 2}"]
    started = time.monotonic()
    job_id = _submit(
        folder,
        run,
        [*geometry, *FAILING_RUN],
    )
    problems = []
    if not _wait(lambda: _sacct_state(job_id) not in ("", "PENDING", "RUNNING"), 240):
        problems.append("the job did not end within 240 s")
        subprocess.run(["scancel", job_id], capture_output=True)
    took = time.monotonic() - started
    state = _sacct_state(job_id)
    if state == "COMPLETED":
        problems.append("the job reported success")
    status = hpcdl(["status", str(run)], folder)
    said = [ln.split(":", 1) for ln in status.stdout.splitlines() if ":" in ln]
    cause = next((v.strip() for k, v in said if k.strip() == "cause"), "")
    if not cause.startswith(EXPECTED_CAUSE[how]):
        problems.append(f"hpcdl status gives cause {cause!r}, not {EXPECTED_CAUSE[how]!r}")
    time.sleep(2)
    left = subprocess.run(["pgrep", "-f", str(run)], capture_output=True, text=True).stdout
    if left.strip():
        problems.append(f"processes left behind: {left.split()}")
    return Result(case, 0, f"{state} after {took:.0f}s; cause: {cause[:100]}", problems)


def r6_cluster(work: Path) -> Result:
    """Two 2-node, 2-rank jobs submitted at the same moment, sharing both nodes."""
    case = Case("cluster-two-2node-jobs-at-once", "R6", (), "")
    folder = work / case.id
    folder.mkdir()
    overrides = ["cluster.nodes=2", "trainer.max_epochs=2"]
    with_runs = [folder / "run0", folder / "run1"]
    procs = [
        subprocess.Popen(
            [*TRAIN_ON_CLUSTER, f"run_dir={run}", *overrides],
            cwd=folder,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for run in with_runs
    ]
    problems = [f"submission failed: {p.communicate()[1][-200:]}" for p in procs if p.wait()]
    for run in with_runs:
        if not problems and not _wait(lambda run=run: _completed(run), 300):
            problems.append(f"{run.name} did not complete")
    return Result(case, 0, "", problems)


def run_cluster_scenarios(
    quick: bool,
    wanted: set[str],
    progress=None,  # type: ignore[no-untyped-def]
) -> list[Result]:
    import tempfile

    results: list[Result] = []
    os.environ.update(ONE_THREAD)  # the references train here with one thread, as the jobs do
    with devcluster(), tempfile.TemporaryDirectory(prefix="hpcdl-faults-cluster-") as tmp:
        work = Path(tmp)
        if "R4" in wanted:
            for how in ("raises",) if quick else tuple(FAILING_RANK_HOOKS):
                for ranks in (2,) if quick else (2, 4):
                    result = r4_cluster(work, how, ranks)
                    _report(progress, result.case.id, result)
                    results.append(result)
        if "R6" in wanted:
            result = r6_cluster(work)
            _report(progress, result.case.id, result)
            results.append(result)
        if "R1" in wanted:
            results += run_r1(work, quick, progress)
    return results


def _report(progress, name: str, result: Result) -> None:  # type: ignore[no-untyped-def]
    if progress is not None:
        mark = "ok  " if not result.problems else "FAIL"
        detail = "; ".join(result.problems) or result.error_line
        print(f"{mark} {result.case.scenario} {name}: {detail}", file=progress, flush=True)
