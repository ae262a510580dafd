"""`hpcdl run`'s summary.json: wall_s_total, the program's wall time over the run's
attempts, as each attempt's wrapper measured it (a `program_end` record in attempts.jsonl);
an attempt killed before its program exited recorded none and is not counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# Attempt 1 runs a second and stops itself (exit 3: hpcdl resume continues it), attempt 2
# kills the wrapper (SIGKILL: nothing recorded), attempt 3 and later complete.
PROGRAM = """\
import os, signal, sys, time
run_dir = os.environ["HPCDL_RUN_DIR"]
done = sorted(n for n in os.listdir(run_dir) if n.startswith("attempt-"))
open(os.path.join(run_dir, f"attempt-{len(done) + 1}"), "w").close()
if len(done) == 0:
    time.sleep(1.0)
    sys.exit(3)
if len(done) == 1:
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(1.0)
sys.exit(0)
"""


def program_ends(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "attempts.jsonl").open()]
    return [r["wall_s"] for r in records if r.get("event") == "program_end"]


def test_wall_s_total_adds_the_attempts_whose_program_exited(hpcdl, tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(PROGRAM)
    run_dir = tmp_path / "r"
    first = hpcdl("run", "run_dir=r", "--", "python", "job.py")
    assert first.returncode == 3, first.stdout + first.stderr
    killed = hpcdl("resume", "r")
    assert killed.returncode == -9, killed.stdout + killed.stderr
    completed = hpcdl("resume", "r")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    first_s, last_s = program_ends(run_dir)  # none for the killed attempt
    assert first_s >= 1.0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["wall_s"] == last_s
    assert summary["wall_s_total"] == pytest.approx(first_s + last_s)
    assert list(summary)[:5] == ["outcome", "exit_code", "world_size", "wall_s", "wall_s_total"]

    # Started over: the attempts before count no more (as a trainer run's checkpoints).
    again = hpcdl("resume", "r", "--from-scratch")
    assert again.returncode == 0, again.stdout + again.stderr
    # The program's own files stay, said so: a program resuming from them would not start
    # over (persona, FSDP: its DCP folder outside checkpoints/).
    assert (
        f"--from-scratch: warning: attempt-1, attempt-2, attempt-3 in {run_dir} stay where they "
        "are (only checkpoints/ is set aside)"
    ) in again.stdout, again.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["wall_s_total"] == summary["wall_s"] == program_ends(run_dir)[-1]


def test_a_script_sweep_without_metrics_is_still_ranked_by_wall_s(tmp_path: Path) -> None:
    from hpcdl.cli.compose import compose_config
    from hpcdl.cli.run import plan_program_sweep, script_from
    from hpcdl.rundir import RunDir
    from hpcdl.sweep import launch, report

    command = ["python", "fit.py", "--lr={0.1,0.3}"]
    script, overrides = script_from([f"hydra.sweep.dir={tmp_path / 'sw'}"], command)
    plan = plan_program_sweep(
        compose_config(overrides, script=script, multirun=True), overrides
    )
    ledger = launch.create_sweep(plan)
    for t in ledger.trials:  # as hpcdl.script_job writes it for a program without metrics_file
        summary = {"outcome": "completed", "exit_code": 0, "world_size": 1, "wall_s": 1.0}
        RunDir(Path(t.run_dir)).write_summary({**summary, "wall_s_total": 2.0})
    assert report.default_metric(ledger) == "wall_s"  # not wall_s_total, hpcdl's own too
