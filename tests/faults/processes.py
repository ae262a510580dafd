"""R2 (SIGKILL inside checkpoint saving), R4 (a failing rank in a 2-rank local job) and R6
(two multi-rank jobs started at once): scenarios that kill or race real processes.
Seeded: the same kill moments every time."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tests.faults.cases import Case
from tests.faults.runner import REPO, Result

# A checkpoint writer that reports each completed save on stdout; killed at a seeded moment.
SAVER = """\
import sys, torch
from hpcdl.checkpoint import CheckpointStore
store = CheckpointStore(sys.argv[1], keep_last=2)
mode = sys.argv[2]
weights = {f"w{i}": torch.full((256, 1024), 0.0) for i in range(8)}  # ~8 MB a file
for step in range(1, 1000):
    for t in weights.values():
        t.fill_(float(step))
    state = {"model": weights, "step": step}
    if mode == "async":
        store.save_async(state, step, is_best=step % 3 == 0)
    else:
        store.save(state, step, is_best=step % 3 == 0)
    print(step, flush=True)
"""

CHECK = """\
import sys, warnings
from hpcdl.checkpoint import CheckpointStore
with warnings.catch_warnings(record=True):
    warnings.simplefilter("always")
    found = CheckpointStore(sys.argv[1]).load_latest()
if found is None:
    print("none"); sys.exit(0)
path, state = found
ok = all(float(t[0, 0]) == state["step"] for t in state["model"].values())
print(state["step"], "consistent" if ok else "MIXED")
"""

# A step hook that raises on one rank, for R4.
RAISER = """\
import os

def after_step(event):
    if event.global_step == 5 and event.rank == 1:
        raise RuntimeError("rank 1 failed on purpose at step 5")
"""


def _python(args: Sequence[str], cwd: Path, **kw: object) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(cwd)]),
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,  # type: ignore[arg-type]
    )


def r2_kill_during_save(work: Path, index: int, mode: str) -> Result:
    """Kill the writer after a seeded delay (into its first few saves); the store must then
    load the newest complete checkpoint, whole and consistent."""
    case = Case(f"kill-in-save-{mode}-{index}", "R2", (), "")
    folder = work / case.id
    folder.mkdir()
    (folder / "saver.py").write_text(SAVER)
    (folder / "check.py").write_text(CHECK)
    delay = random.Random(index * 7919 + (mode == "async")).uniform(1.5, 4.0)
    proc = _python(["saver.py", str(folder / "ckpt"), mode], folder)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate()
    done = [int(x) for x in out.split()]
    check = _python(["check.py", str(folder / "ckpt")], folder)
    verdict, err = check.communicate(timeout=120)
    problems = []
    if check.returncode != 0:
        problems.append(f"loading failed: {err.strip().splitlines()[-1:]}")
    words = verdict.split()
    # A printed step is a save that returned: with save_async, its write may still be in
    # flight at the kill; it is complete once the next save_async has returned (at most
    # one in flight), so async guarantees a checkpoint from the second printed step on.
    complete = done if mode != "async" else done[:-1]
    if complete and (not words or words[0] == "none"):
        problems.append(f"no loadable checkpoint after {len(complete)} completed saves")
    elif words and words[0] != "none":
        step = int(words[0])
        if words[1] != "consistent":
            problems.append(f"checkpoint of step {step} holds tensors of other steps")
        if done and step < done[-1] - (1 if mode == "async" else 0):
            problems.append(f"loaded step {step}, but step {done[-1]} had completed")
    return Result(case, proc.returncode, f"killed after {delay:.2f}s, {len(done)} saves", problems)


def _orphans(marker: str) -> str:
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    return out.stdout.strip()


def r4_failing_rank(work: Path, how: str, ranks: int = 2) -> Result:
    """A 2- or 4-rank local job whose rank 1 raises, is SIGKILLed, hangs in a step, or
    hangs in a collective the others never join: the job must end non-zero, in time,
    saying which rank, with no process left behind."""
    case = Case(f"rank1-{how}-{ranks}ranks", "R4", (), "")
    folder = work / case.id
    folder.mkdir()
    (folder / "raiser.py").write_text(RAISER)
    (folder / "hang.py").write_text(
        "import time\n\ndef after_step(event):\n    while event.rank == 1 and event.global_step == 5:\n"
        "        time.sleep(1)\n"
    )
    (folder / "collective.py").write_text(
        "import torch.distributed as dist\n\ndef after_step(event):\n"
        "    if event.global_step == 5 and event.rank == 1:\n        dist.barrier()\n"
    )
    hooks = {
        "raises": "[raiser:after_step]",
        "sigkill": "[tests.fault_hook:after_step]",
        "hangs": "[hang:after_step]",
        "collective": "[collective:after_step]",
    }[how]
    run = folder / "run"
    env_extra = {"HPCDL_TEST_FAULT": "SIGKILL@5:rank1"} if how == "sigkill" else {}
    os.environ.update(env_extra)
    try:
        started = time.monotonic()
        proc = _python(
            [
                "-m",
                "hpcdl.cli.main",
                "train",
                f"run_dir={run}",
                "cluster=local",
                f"cluster.tasks_per_node={ranks}",
                "trainer.max_epochs=3",
                "trainer.stall_timeout_s=5",
                "cluster.rendezvous_timeout_s=20",
                f"trainer.step_hooks={hooks}",
            ],
            folder,
        )
        out, err = proc.communicate(timeout=240)
        took = time.monotonic() - started
    finally:
        for key in env_extra:
            os.environ.pop(key, None)
    problems = []
    if proc.returncode == 0:
        problems.append("the job reported success")
    if took > 120:
        problems.append(f"took {took:.0f}s to end")
    logs = (
        "".join(p.read_text() for p in (run / "logs").glob("*_log.*"))
        if (run / "logs").exists()
        else ""
    )
    said = err + out
    expected = {
        "raises": "rank 1 failed: RuntimeError: rank 1 failed on purpose",
        "sigkill": "rank 1 failed: ended without an error of its own",
        "hangs": "rank 1 failed: stalled: rank 1 made no progress",
        "collective": "rank 1 failed: hung in a collective until its timeout",
    }[how]
    if expected not in said:
        problems.append(f"the error does not say {expected!r}")
    if "rank 1" not in said + logs and "rank1" not in said + logs:
        problems.append("the failing rank is not named")
    if "Traceback (most recent call last)" in out:  # rank 0 only lost rank 1: one line
        problems.append("the terminal shows the traceback of a rank that lost its peer")
    time.sleep(1)
    left = _orphans(str(run))
    if left:
        problems.append(f"processes left behind: {left.split()}")
    last = [ln for ln in err.strip().splitlines() if ln.strip()][-1:]
    return Result(case, proc.returncode, (last or [""])[0][:160], problems)


def r6_two_jobs_at_once(work: Path) -> Result:
    """Two 2-rank local jobs started at the same moment: no rendezvous port collision."""
    case = Case("two-local-jobs-at-once", "R6", (), "")
    folder = work / case.id
    folder.mkdir()
    procs = [
        _python(
            [
                "-m",
                "hpcdl.cli.main",
                "train",
                f"run_dir={folder / f'run{i}'}",
                "cluster=local",
                "cluster.tasks_per_node=2",
                "trainer.max_epochs=1",
            ],
            folder,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    problems = [
        f"job {i} failed: {err.strip().splitlines()[-1:]}"
        for i, (p, (_, err)) in enumerate(zip(procs, outs, strict=True))
        if p.returncode != 0
    ]
    return Result(case, max(p.returncode for p in procs), "", problems)


def process_scenarios(work: Path, quick: bool) -> list[tuple[str, object]]:
    """(name, thunk) for each scenario run; the quick set is a few of each."""
    kills = 2 if quick else 25
    runs: list[tuple[str, object]] = []
    for mode in ("sync", "async"):
        for i in range(kills):
            runs.append(
                (f"R2 {mode} {i}", lambda i=i, mode=mode: r2_kill_during_save(work, i, mode))
            )
    for how in ("raises",) if quick else ("raises", "sigkill", "hangs", "collective"):
        for ranks in (2,) if quick else (2, 4):
            runs.append(
                (f"R4 {how} {ranks}", lambda how=how, r=ranks: r4_failing_rank(work, how, r))
            )
    if not quick:
        runs.append(("R6", lambda: r6_two_jobs_at_once(work)))
    return runs


def run_process_scenarios(quick: bool = False, progress=None) -> list[Result]:  # type: ignore[no-untyped-def]
    import tempfile

    results = []
    with tempfile.TemporaryDirectory(prefix="hpcdl-faults-") as tmp:
        for name, thunk in process_scenarios(Path(tmp), quick):
            result = thunk()  # type: ignore[operator]
            if progress is not None:
                mark = "ok  " if not result.problems else "FAIL"
                print(f"{mark} {name}: {result.error_line}", file=progress, flush=True)
            results.append(result)
    return results
