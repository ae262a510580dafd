"""`hpcdl run`: a user's own script or function, on this machine (the dev-cluster tests are
in tests/slurm/test_scripts_slurm.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdl.cli.run import expand_token
from hpcdl.errors import ConfigError
from tests.conftest import REPO, run_without_torch

DDP_SCRIPT = """\
import json, os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
if dist.get_rank() == 0:
    with open(os.path.join(os.environ["HPCDL_RUN_DIR"], "out.json"), "w") as f:
        json.dump({"sum": total.item(), "argv": sys.argv[1:], "world": dist.get_world_size(),
                   "local_world": int(os.environ["LOCAL_WORLD_SIZE"])}, f)
dist.destroy_process_group()
"""


def test_expand_token() -> None:
    assert expand_token("--lr={0.1,0.03}") == ["--lr=0.1", "--lr=0.03"]
    assert expand_token("{range(0,3)}") == ["0", "1", "2"]
    assert expand_token("run{1,2}-{a,b}") == ["run1-a", "run1-b", "run2-a", "run2-b"]
    assert expand_token("optimizer.lr=0.1,0.01") == ["optimizer.lr=0.1", "optimizer.lr=0.01"]
    assert expand_token("--layers=1,2") == ["--layers=1,2"]  # a flag's own comma list stays
    assert expand_token("plain") == ["plain"] and expand_token("{single}") == ["{single}"]


def test_expand_token_ranges_of_any_numbers() -> None:
    """range() in a program sweep as in Python, with floats too: rounded to the decimals
    given, the stop left out. A float range was split at its commas into three trials
    (`--lr=range(0.7`, `--lr=1.0`, `--lr=0.1)`), range(3) was left as it was."""
    assert expand_token("--lr={range(0.7,1.0,0.1)}") == ["--lr=0.7", "--lr=0.8", "--lr=0.9"]
    assert expand_token("{range(0.1, 0.5, 0.1)}") == ["0.1", "0.2", "0.3", "0.4"]
    assert expand_token("{range(3)}") == ["0", "1", "2"]
    assert expand_token("{range(6,0,-2)}") == ["6", "4", "2"]
    assert expand_token("{range(1e-4,3e-4,1e-4)}") == ["0.0001", "0.0002"]
    for token, message in (
        ("--lr={range(a,3)}", "'a' is not a number; write range(stop), range(start, stop)"),
        ("{range(3,3)}", "range(3,3) is empty; give at least one value"),
        ("{range(0,1,0)}", "the step of range() must not be 0"),
        ("{range(1,2,3,4)}", "range() takes 1 to 3 numbers, not 4"),
    ):
        with pytest.raises(ConfigError, match=re.escape(f"{token}: {message}")):
            expand_token(token)


SHOW_GPUS = """\
import os
path = os.path.join(os.environ["HPCDL_RUN_DIR"], "gpus-" + os.environ["RANK"])
with open(path, "w") as f:
    f.write(os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
"""


@pytest.mark.parametrize(
    ("shell", "gpus", "ranks_see"),
    [
        ("2,3", 2, "2,3"),  # an interactive allocation's, or a shared machine's choice
        ("GPU-aa11,GPU-bb22,GPU-cc33", 1, "GPU-aa11"),  # UUIDs (MIG- ones alike)
        (None, 2, "0,1"),  # none set: the machine's first, as submitit gives them
    ],
)
def test_local_ranks_get_the_gpus_the_shell_shows(hpcdl, tmp_path: Path, shell, gpus, ranks_see):
    """cluster=local hands the ranks the first cluster.gpus_per_node of the launching
    shell's CUDA_VISIBLE_DEVICES (submitit's local executor would give them GPUs 0..n-1
    of the machine, someone else's on a shared one). Seen by a script on each rank."""
    (tmp_path / "show.py").write_text(SHOW_GPUS)
    args = ["cluster=local", f"cluster.gpus_per_node={gpus}", "run_dir=run", "--"]
    out = hpcdl("run", *args, "python", "show.py", env={"CUDA_VISIBLE_DEVICES": shell})
    assert out.returncode == 0, out.stderr + out.stdout
    seen = [(tmp_path / "run" / f"gpus-{rank}").read_text() for rank in (0, 1)]
    assert seen == [ranks_see, ranks_see]


def test_more_ranks_than_gpus_on_a_node_is_said_at_launch(hpcdl, tmp_path: Path) -> None:
    """2 ranks on a node with cluster.gpus_per_node=1 both get HPCDL_DEVICE=cuda:0 (as
    cluster=local's 2 ranks with a GPU asked for do), which NCCL refuses at the first collective (seen on an H100: 'Duplicate GPU detected'):
    a warning naming the fix, once, also for a sweep; a gloo program still runs."""
    (tmp_path / "train.py").write_text("print('ran')\n")
    said = (
        "warning: cluster.tasks_per_node=2 ranks share cluster.gpus_per_node=1 GPU on each "
        "node (HPCDL_DEVICE=cuda:0 for ranks 0 and 1): NCCL refuses two ranks on one GPU "
        "('Duplicate GPU detected'); set cluster.tasks_per_node=1, or cluster.gpus_per_node=2"
    )
    one = ["cluster=rivanna_a100", "cluster.tasks_per_node=2", "--dry-run"]
    out = hpcdl("run", *one, "--", "python", "train.py")
    assert out.returncode == 0, out.stderr + out.stdout
    assert out.stderr.splitlines().count(said) == 1, out.stderr
    out = hpcdl("run", "-m", *one, "--", "python", "train.py", "--seed", "{1,2}")
    assert out.returncode == 0, out.stderr + out.stdout
    assert out.stderr.splitlines().count(said) == 1, out.stderr
    for fine in (["cluster.tasks_per_node=1"], ["cluster.gpus_per_node=2"], ["launcher=torchrun"]):
        out = hpcdl("run", *one, *fine, "--", "python", "train.py")
        assert out.returncode == 0 and "share" not in out.stderr, (fine, out.stderr)


def test_more_local_gpus_than_the_shell_shows_is_refused_before_anything(hpcdl, tmp_path):
    out = hpcdl(
        "train", "cluster=local", "cluster.gpus_per_node=2", "run_dir=run",
        env={"CUDA_VISIBLE_DEVICES": "3"},
    )  # fmt: skip
    assert out.returncode == 2, out.stderr + out.stdout
    assert out.stderr.strip().splitlines() == [
        "error: cluster.gpus_per_node=2: CUDA_VISIBLE_DEVICES='3' shows 1 GPU(s); ask for at "
        "most 1, or unset CUDA_VISIBLE_DEVICES to use the machine's first GPUs"
    ]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_plain_ddp_script_on_two_local_ranks(hpcdl, tmp_path: Path) -> None:
    (tmp_path / "ddp.py").write_text(DDP_SCRIPT)
    out = hpcdl(
        "run",
        "cluster=local",
        "cluster.tasks_per_node=2",
        "metrics_file=out.json",
        "run_dir=run",
        "--",
        "python",
        "ddp.py",
        "--lr",
        "0.1",
    )
    assert out.returncode == 0, out.stderr + out.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["outcome"] == "completed"
    assert (summary["sum"], summary["world"], summary["local_world"]) == (3.0, 2, 2)
    assert summary["argv"] == ["--lr", "0.1"]
    # Its config.yaml says which of its sections the job reads (model: mlp is not this job).
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert config.startswith("# hpcdl run: the job is the program in `script`"), config


def test_entry_function_with_kwargs_and_exit_statuses(hpcdl, tmp_path: Path) -> None:
    (tmp_path / "labjobs.py").write_text(
        "import json, os\n"
        "def main(lr, tag='x'):\n"
        "    path = os.path.join(os.environ['HPCDL_RUN_DIR'], 'seen.json')\n"
        "    json.dump({'lr': lr, 'tag': tag, 'rank': os.environ['RANK']}, open(path, 'w'))\n"
        "def fails():\n"
        "    return 5\n"
        "def wants_requeue():\n"
        "    return 3\n"
    )
    env = {"PYTHONPATH": str(tmp_path)}
    out = hpcdl(
        "run",
        "entry=labjobs:main",
        "entry.kwargs.lr=0.1",
        "entry.kwargs.tag=ab",
        "run_dir=a",
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "a" / "seen.json").read_text()) == {
        "lr": 0.1,
        "tag": "ab",
        "rank": "0",
    }
    failed = hpcdl("run", "entry=labjobs:fails", "run_dir=b", env=env)
    assert failed.returncode == 5 and not (tmp_path / "b" / "summary.json").exists()
    stopped = hpcdl("run", "entry=labjobs:wants_requeue", "run_dir=c", env=env)
    assert stopped.returncode == 3 and "Continue with: hpcdl resume" in stopped.stdout
    inline = hpcdl("run", "run_dir=d", "--", "python", "-X", "dev", "-c", "print('inline ok')")
    assert inline.returncode == 0 and "inline ok" in inline.stdout, inline.stderr
    # A program's run: hpcdl cannot rebuild its model, so evaluate/predict say so.
    for command, *how in (("evaluate",), ("predict", "--split", "test")):
        out = hpcdl(command, "a", *how)
        assert out.returncode == 2 and out.stderr.startswith(
            f"error: hpcdl {command}: {tmp_path / 'a'} is an `hpcdl run` run"
        ), out.stderr


def test_a_resumed_local_run_is_not_stopped_by_the_last_attempts_stop_file(hpcdl, tmp_path):
    (tmp_path / "job.py").write_text(
        "import os, sys\n"
        "import hpcdl.api as hp\n"
        "marker = os.path.join(os.environ['HPCDL_RUN_DIR'], 'first-done')\n"
        "if not os.path.exists(marker):\n"
        "    open(marker, 'w').close()\n"
        "    os.kill(os.getppid(), 15)  # as Ctrl-C or scancel would: a stop of this attempt\n"
        "    import time; time.sleep(5)\n"
        "sys.exit(3 if hp.stop_requested() else 0)\n"
    )
    first = hpcdl("run", "run_dir=r", "--", "python", "job.py")
    assert first.returncode == 3, first.stderr + first.stdout
    assert list((tmp_path / "r" / "stop").iterdir())
    again = hpcdl("resume", "r")
    assert again.returncode == 0, again.stderr + again.stdout
    assert (tmp_path / "r" / "summary.json").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--", "python", "missing.py"], "missing.py: no such script"),
        (["--", "python", "-u"], "python -u: no script to run; give it after the interpreter"),
        (["--", "./notexec.sh"], "./notexec.sh: not executable"),
        (["--", "no-such-program-xyz"], "no-such-program-xyz: command not found on PATH"),
        (["--", "pyhton", "t.py"], "pyhton: command not found on PATH; did you mean python?"),
        (["--", "python", "okk.py"], "; did you mean ok.py?); give its path relative to here"),
        (
            ["--", "srun", "python", "ok.py"],
            "srun: hpcdl starts each rank itself (with srun on Slurm, as processes here); give "
            "the program without it: -- python ok.py (and cluster.nodes / cluster.tasks_per_node",
        ),
        # Each rank would start its own torchrun: two jobs writing the same files (persona, FSDP).
        (
            ["cluster=local", "cluster.tasks_per_node=2", "--", "torchrun", "--nproc-per-node", "2", "ok.py"],
            "torchrun: hpcdl starts 2 ranks here (cluster.nodes=1, 2 per node), and each would "
            "start its own torchrun: separate jobs writing the same files; give the program "
            "without it, -- python ok.py, with the ranks as cluster.tasks_per_node",
        ),
        (
            ["cluster=local", "cluster.tasks_per_node=2", "--", "python", "-m", "torch.distributed.run", "ok.py"],
            "python -m torch.distributed.run: hpcdl starts 2 ranks here",
        ),
        (
            ["--", "OMP_NUM_THREADS=1", "python", "ok.py"],
            "OMP_NUM_THREADS=1: a variable, not a command (no shell reads the command); set it "
            "with cluster.env.OMP_NUM_THREADS=1, or start with env: -- env OMP_NUM_THREADS=1 "
            "python ok.py",
        ),
        (["entry=nosuchpkg_xyz.train:main"], "entry='nosuchpkg_xyz.train:main': module"),
        (["entry=no_colon"], "entry='no_colon': expected 'package.module:name'"),
        (["launcher=mpirun", "--", "python", "ok.py"], "launcher='mpirun': unknown"),
        (["launcher=torchrun", "--", "python", "ok.py"], "launcher=torchrun: starts one torchrun"),
        ([], "give a command after -- or entry=..., not neither"),
        # A typo of hpcdl run's own key is offered that key, not hpcdl train's keys.
        (
            ["metrics_fil=r.json", "--", "python", "ok.py"],
            "metrics_fil: unknown key of hpcdl run; did you mean metrics_file?",
        ),
        # hpcdl train's keys would be read by nothing: refused, not silently kept.
        (
            ["trainer.max_epochs=3", "--", "python", "ok.py"],
            "trainer.max_epochs: hpcdl train's key, unused by hpcdl run",
        ),
        (["model=cnn", "--", "python", "ok.py"], "model: hpcdl train's key, unused by hpcdl run"),
        (["--config-dir", "conf"], "/conf: no such folder"),  # a flag's value, not a program
        (
            ["python", "ok.py", "--lr", "1"],
            "'python' is not an override (key=value); put your program after --: "
            "hpcdl run [overrides] -- python ok.py --lr 1",
        ),
    ],
)
def test_bad_programs_are_refused_in_one_line_before_anything(
    hpcdl, tmp_path, args, message
) -> None:
    (tmp_path / "notexec.sh").write_text("echo hi\n")
    (tmp_path / "ok.py").write_text("print('ok')\n")
    out = hpcdl("run", "run_dir=run", *args)
    assert out.returncode == 2, out.stderr + out.stdout
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "run").exists()


def test_a_module_here_but_not_on_pythonpath_is_named_with_both_fixes(tmp_path: Path) -> None:
    # Before: "-m runme: no such module here", with runme.py right there. (The `hpcdl`
    # command has no current folder on sys.path; `python -m hpcdl.cli.main` would.)
    from hpcdl.config.validate import _check_command
    from hpcdl.errors import ConfigError

    (tmp_path / "runme.py").write_text("print('hi')\n")
    (tmp_path / "lab").mkdir()
    with pytest.raises(ConfigError) as info:
        _check_command([sys.executable, "-m", "runme"], tmp_path, "")
    assert str(info.value) == (
        f"-m runme: {tmp_path / 'runme.py'} is here, but hpcdl finds -m modules on PYTHONPATH "
        f"(to freeze them with the run), which does not hold {tmp_path}; run PYTHONPATH=. "
        "hpcdl run ..., or give the script: python runme.py"
    )
    with pytest.raises(ConfigError, match=r"lab is here, but .* PYTHONPATH=\. hpcdl run \.\.\.$"):
        _check_command([sys.executable, "-m", "lab.train"], tmp_path, "")
    with pytest.raises(ConfigError, match=r"^-m nothere_xyz: no such module here; check PYTHONPATH$"):
        _check_command([sys.executable, "-m", "nothere_xyz"], tmp_path, "")
    # Where no copy is frozen (cluster=debug, local), python -m finds it where it starts, as
    # plain python does: refused for a reason that holds only on Slurm (persona, FSDP).
    _check_command([sys.executable, "-m", "runme"], tmp_path, "", frozen=False)
    with pytest.raises(ConfigError, match=r"lab is here, but"):  # lab/train.py is not
        _check_command([sys.executable, "-m", "lab.train"], tmp_path, "", frozen=False)


def test_dry_run_and_the_login_path_never_import_torch(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    code = (
        "from hpcdl.cli.main import main\n"
        "assert main(['run', 'cluster=rivanna_a100', 'cluster.nodes=2', 'cluster.gpus_per_node=4', 'launcher=torchrun', "
        "'--dry-run', '--', 'python', 'train.py']) == 0\n"
    )
    out = run_without_torch(code, cwd=tmp_path)
    assert "#SBATCH --ntasks-per-node=1" in out.stdout  # one torchrun per node
    assert "TORCHRUN=--nnodes=2 --nproc-per-node=4 --node-rank=1" in out.stdout
    # The user's command as the job starts it: under torchrun, from the frozen copy.
    program = out.stdout.split("# program")[1].splitlines()[1]
    assert program.strip().startswith("torchrun --nnodes=2 --nproc-per-node=4")
    assert program.endswith("/code/script/train.py")
    assert "nothing submitted" in out.stdout and not list(tmp_path.glob("outputs"))
    # srun: a line per rank, without the backend and device hpcdl's trainer would pick.
    srun = subprocess.run(
        [sys.executable, "-m", "hpcdl.cli.main", "run", "cluster=rivanna_a100", "--dry-run",
         "--", "python", "train.py"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert "RANK(SLURM_PROCID)=0" in srun.stdout and "BACKEND" not in srun.stdout, srun.stdout


def test_program_env_names_the_rank_and_the_stop_file(tmp_path: Path, monkeypatch) -> None:
    from hpcdl import script_job
    from hpcdl.cli.compose import compose_config
    from hpcdl.config.schema import ScriptConfig
    from hpcdl.env import RankEnv
    from hpcdl.rundir import RunDir
    from hpcdl.script_job import program_env

    cfg = compose_config(["cluster=slurm", "cluster.gpus_per_node=4"])
    from dataclasses import replace

    cfg = replace(cfg, script=ScriptConfig(command=["python", "t.py"]))
    env = RankEnv(
        rank=5,
        local_rank=1,
        world_size=8,
        node_rank=1,
        num_nodes=2,
        master_addr="n1",
        master_port=15042,
        launcher="slurm",
        job_id="42",
        restart_count=2,
    )
    run = RunDir(tmp_path)
    monkeypatch.setattr(script_job, "cuda_on_node", lambda: False)  # the dev cluster's nodes
    assert program_env(cfg, env, run, run.stop_file("42", 2))["HPCDL_DEVICE"] == "cpu"
    monkeypatch.setattr(script_job, "cuda_on_node", lambda: True)
    values = program_env(cfg, env, run, run.stop_file("42", 2))
    assert {k: values[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")} == {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
    }
    assert (values["MASTER_ADDR"], values["MASTER_PORT"], values["HPCDL_DEVICE"]) == (
        "n1",
        "15042",
        "cuda:1",
    )
    assert values["HPCDL_STOP_FILE"].endswith("stop/42-2") and values["HPCDL_RESTART_COUNT"] == "2"
    os.environ.pop("HPCDL_STOP_FILE", None)


# A torchrun worker that saves when asked to stop: slowly, so a torchrun that died of the
# warning signal would be seen returning before the save is done.
TORCHRUN_WORKER = """\
import os, pathlib, time
import hpcdl.api as hp
hp.catch_stop_signals()
out = pathlib.Path(os.environ["HPCDL_RUN_DIR"])
rank = os.environ["RANK"]
(out / f"started-{rank}").touch()
while not hp.stop_requested():
    time.sleep(0.05)
time.sleep(2)
(out / f"saved-{rank}").touch()
raise SystemExit(hp.EXIT_REQUEUE)
"""

TORCHRUN_DRIVER = """\
import json, sys
from dataclasses import replace
from pathlib import Path
from hpcdl.cli.compose import compose_config
from hpcdl.config.schema import ScriptConfig, ScriptLauncher
from hpcdl.rundir import RunDir
from hpcdl.script_job import run_script
from hpcdl.signals import stop_on_signals

cfg = compose_config(["cluster=devcluster", "cluster.gpus_per_node=0", "cluster.tasks_per_node=2"])
script = ScriptConfig(command=["python", sys.argv[2]], launcher=ScriptLauncher.torchrun)
with stop_on_signals(("SIGTERM", "SIGINT", "SIGUSR2")) as flag:
    outcome = run_script(replace(cfg, script=script), RunDir(Path(sys.argv[1])), flag)
print(json.dumps({"signal": outcome.signal_name, "failed": outcome.failed_exit_code,
                  "saved": sorted(p.name for p in Path(sys.argv[1]).glob("saved-*"))}))
"""


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def start_driver(
    tmp_path: Path, run: Path, program: str, env: dict[str, str]
) -> subprocess.Popen[str]:
    """tmp_path/driver.py RUN PROGRAM as a process of its own, its output captured."""
    return subprocess.Popen(
        [sys.executable, str(tmp_path / "driver.py"), str(run), str(tmp_path / program)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_torchrun_survives_the_warning_signal_until_its_workers_have_saved(tmp_path) -> None:
    import contextlib
    import signal
    import socket
    import time

    (tmp_path / "worker.py").write_text(TORCHRUN_WORKER)
    (tmp_path / "driver.py").write_text(TORCHRUN_DRIVER)
    run = tmp_path / "run"
    run.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "SLURM_JOB_ID": "77",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
    }
    driver = start_driver(tmp_path, run, "worker.py", env)
    deadline = time.monotonic() + 120
    while len(list(run.glob("started-*"))) < 2:
        assert driver.poll() is None, driver.communicate()
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.1)
    # As Slurm does at the warning: the signal to every process of the step.
    for pid in [driver.pid, *descendants(driver.pid)]:
        with contextlib.suppress(ProcessLookupError):  # gone meanwhile
            os.kill(pid, signal.SIGUSR2)
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    # The stop was seen, and the program ended only once both workers had saved.
    assert result == {"signal": "SIGUSR2", "failed": None, "saved": ["saved-0", "saved-1"]}
    # torchrun's own status on hpcdl's SIGTERM is 1: said so, not "status 3 would confirm"
    assert "hpcdl: torchrun exited with status 1 on hpcdl's SIGTERM" in out, out
    assert "store got no checkpoint after the stop" in out and "status 3 would" not in out


def test_script_sweep_shows_and_ranks_by_the_programs_own_metric(hpcdl, tmp_path: Path) -> None:
    (tmp_path / "fit.py").write_text(
        "import json, os, sys\n"
        "lr = float(sys.argv[1].split('=')[1])\n"
        "with open(os.path.join(os.environ['HPCDL_RUN_DIR'], 'm.json'), 'w') as f:\n"
        "    json.dump({'val_score': 1 - abs(lr - 0.3)}, f)\n"
    )
    out = hpcdl(
        "run",
        "-m",
        "metrics_file=m.json",
        "hydra.sweep.dir=sw",
        "--",
        "python",
        "fit.py",
        "--lr={0.1,0.3,0.9}",
    )
    assert out.returncode == 0, out.stderr + out.stdout
    first_line = (tmp_path / "sw" / "0" / "trial.log").read_text().splitlines()[0]
    assert first_line.startswith("starting run dir: ")  # its first attempt, not a resume
    status = hpcdl("sweep", "status", "sw")
    assert status.returncode == 0, status.stderr
    assert "| val_score |" in status.stdout.replace("  ", " ").replace("  ", " ")
    assert "1.0000" in status.stdout and "0.4000" in status.stdout
    summary = hpcdl("sweep", "summary", "sw")
    assert summary.returncode == 0, summary.stderr
    ranked = [ln for ln in summary.stdout.splitlines() if ln.startswith("| 1 ")]
    assert ranked and "--lr=0.3" in ranked[0]  # the highest val_score first
    assert (tmp_path / "sw" / "summary_val_score.png").exists()
    # Trial 2 resumed with another value: its row and rank follow the command it ran.
    resumed = hpcdl("resume", "sw/2", "--", "python", "fit.py", "--lr=0.35")
    assert resumed.returncode == 0, resumed.stderr + resumed.stdout
    summary = hpcdl("sweep", "summary", "sw")
    ranked = [ln for ln in summary.stdout.splitlines() if ln.startswith("| 2 ")]
    assert ranked and "--lr=0.35" in ranked[0], summary.stdout  # 0.95, second to 0.3's 1.0
    assert "trial 2: its config.yaml has --lr=0.35 (the sweep planned --lr=0.9)" in summary.stdout


def test_a_list_in_the_scripts_name_sweeps_scripts_each_checked(hpcdl, tmp_path: Path) -> None:
    """`python 'p{a,b}.py'` (a list anywhere in any argument) is checked as each trial runs
    it, not as the unexpanded `p{a,b}.py`, which no folder has."""
    for name in "ab":
        (tmp_path / f"p{name}.py").write_text(f"print('script {name}')\n")
    missing = hpcdl("run", "-m", "hydra.sweep.dir=bad", "--", "python", "p{a,c}.py")
    assert missing.returncode == 2 and not (tmp_path / "bad").exists(), missing.stdout
    assert missing.stderr.strip() == (
        f"error: pc.py: no such script (from {tmp_path}); give its path relative to here"
    )
    out = hpcdl("run", "-m", "hydra.sweep.dir=sw", "--", "python", "p{a,b}.py")
    assert out.returncode == 0, out.stderr + out.stdout
    assert "script b" in (tmp_path / "sw" / "1" / "trial.log").read_text()
    status = hpcdl("sweep", "status", "sw")
    assert "| arg1=pa.py " in status.stdout and "2 COMPLETED" in status.stdout, status.stdout


def test_a_metrics_file_written_outside_the_run_dir_is_named_with_the_fix(
    hpcdl, tmp_path: Path
) -> None:
    """A program that writes its metrics file into its working directory (as most scripts
    do) completes, but each trial says where the file must go, the sweep's output repeats
    it, and a summary by that metric says no trial reported it. The trials running at once
    share the CPUs: each gets its part as OMP_NUM_THREADS."""
    from hpcdl.threads import usable_cpus

    (tmp_path / "fit.py").write_text(
        "import json, os, sys\n"
        "json.dump({'score': 1.0, 'omp': os.environ.get('OMP_NUM_THREADS')}, open('m.json', 'w'))\n"
        "print('omp', os.environ.get('OMP_NUM_THREADS'))\n"
    )
    out = hpcdl(
        "run", "-m", "metrics_file=m.json", "hydra.sweep.dir=sw", "--", "python", "fit.py",
        "--seed={1,2}",
        env={"OMP_NUM_THREADS": None},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr + out.stdout
    run_dir = tmp_path / "sw" / "0"
    expected = f"metrics_file=m.json: {run_dir / 'm.json'} was not written"
    assert f"trial 0: hpcdl: warning: {expected}" in out.stdout
    assert "write it to $HPCDL_RUN_DIR/m.json" in out.stdout
    assert (
        f"{tmp_path / 'm.json'} exists in the working directory, which trials running at once "
        "share)" in out.stdout
    )
    assert "score" not in json.loads((run_dir / "summary.json").read_text())
    # A run alone has no trials beside it: the line says no more than it knows.
    alone = hpcdl("run", "metrics_file=m.json", "run_dir=alone", "--", "python", "fit.py")
    assert alone.returncode == 0, alone.stderr
    assert f"{tmp_path / 'm.json'} exists in the working directory)" in alone.stdout
    at_once = min(2, usable_cpus())  # two 1-rank trials
    log = (run_dir / "trial.log").read_text()
    assert f"omp {max(1, usable_cpus() // at_once)}" in log
    summary = hpcdl("sweep", "summary", "sw", "--metric", "score")
    assert summary.returncode == 2, summary.stderr
    assert "error: --metric score: no trial reports it" in summary.stderr
    assert "$HPCDL_RUN_DIR" in summary.stderr
    assert not (tmp_path / "sw" / "summary.md").exists()  # refused: nothing written


# `hpcdl run` under Slurm as each rank's wrapper runs it: run_script in a process of its own.
SRUN_DRIVER = """\
import json, sys
from dataclasses import replace
from pathlib import Path
from hpcdl.cli.compose import compose_config
from hpcdl.config.schema import ScriptConfig
from hpcdl.rundir import RunDir
from hpcdl.script_job import run_script
from hpcdl.signals import stop_on_signals

cfg = compose_config(["cluster=devcluster", "cluster.gpus_per_node=0", "cluster.tasks_per_node=2",
                      "cluster.rendezvous_timeout_s=60"])
script = ScriptConfig(command=["python", sys.argv[2]])
with stop_on_signals(("SIGTERM", "SIGINT", "SIGUSR2")) as flag:
    outcome = run_script(replace(cfg, script=script), RunDir(Path(sys.argv[1])), flag)
print(json.dumps({"completed": outcome.completed, "failed": outcome.failed_exit_code}))
"""

PORT_SCRIPT = """\
import json, os
import torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
with open(os.path.join(os.environ["HPCDL_RUN_DIR"], f"port-{dist.get_rank()}.json"), "w") as f:
    json.dump({"sum": total.item(), "port": int(os.environ["MASTER_PORT"])}, f)
dist.destroy_process_group()
"""


def run_two_wrappers(tmp_path: Path, job_id: str) -> list[tuple[int, str, str]]:
    """Ranks 0 and 1 of Slurm job `job_id` on one node, no MASTER_PORT set: each wrapper runs
    PORT_SCRIPT; (exit status, stdout, stderr) of each."""
    (tmp_path / "driver.py").write_text(SRUN_DRIVER)
    (tmp_path / "program.py").write_text(PORT_SCRIPT)
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if k != "MASTER_PORT"}
    wrappers = []
    for rank in (1, 0):  # rank 1 first: it waits for rank 0's choice
        env = {
            **base,
            "SLURM_JOB_ID": job_id,
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank),
            "SLURM_NTASKS": "2",
            "SLURM_NODEID": "0",
            "SLURM_JOB_NUM_NODES": "1",
            "MASTER_ADDR": "127.0.0.1",
            "OMP_NUM_THREADS": "1",
        }
        wrappers.append(start_driver(tmp_path, run, "program.py", env))
    done = [w.communicate(timeout=120) for w in wrappers]
    return [(w.returncode, out, err) for w, (out, err) in zip(wrappers, done, strict=True)]


def test_a_programs_derived_port_taken_on_the_node_moves_the_job_to_the_next_candidate(
    tmp_path: Path,
) -> None:
    """As hpcdl's trainer does (tests/test_dist.py): another job's store on the first derived
    port, so the program's rank 0 listens on the second, and rank 1 connects there."""
    import torch.distributed as dist

    from hpcdl.env import RankEnv, master_port_candidates
    from tests.test_dist import free_job_id

    job_id = free_job_id()
    first, second = master_port_candidates(RankEnv(job_id=job_id, master_port_derived=True))[:2]
    other_job = dist.TCPStore("127.0.0.1", first, 2, is_master=True, wait_for_workers=False)
    try:
        results = run_two_wrappers(tmp_path, job_id)
    finally:
        del other_job
    for code, out, err in results:
        assert code == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == {"completed": True, "failed": None}
    for rank in (0, 1):
        got = json.loads((tmp_path / "run" / f"port-{rank}.json").read_text())
        assert got == {"sum": 3.0, "port": second}
    assert (tmp_path / "run" / "ports" / f"port-{job_id}-0").read_text() == str(second)


def test_every_derived_port_taken_fails_every_rank_in_one_line_naming_the_fix(
    tmp_path: Path,
) -> None:
    import socket

    from hpcdl.env import RankEnv, master_port_candidates
    from tests.test_dist import free_job_id

    job_id = free_job_id()
    ports = master_port_candidates(RankEnv(job_id=job_id, master_port_derived=True))
    taken = [socket.create_server(("127.0.0.1", port)) for port in ports]
    try:
        results = run_two_wrappers(tmp_path, job_id)
    finally:
        for server in taken:
            server.close()
    for rank, (code, out, _) in zip((1, 0), results, strict=True):
        assert code == 0  # the driver reports the outcome: the wrapper's own exit status
        lines = out.strip().splitlines()
        assert json.loads(lines[-1]) == {"completed": False, "failed": 2}
        assert lines[-2] == (
            f"hpcdl: rank {rank}: ports {ports} are all in use on the first node (127.0.0.1); "
            "set a free one with cluster.env.MASTER_PORT=<port>"
        )
    assert not list((tmp_path / "run").glob("port-*.json"))  # no program ran


def test_a_rank_that_never_sees_rank_0s_port_names_the_shared_file_system(tmp_path: Path) -> None:
    from hpcdl.env import RankEnv
    from hpcdl.script_port import PortError, agreed_port

    env = RankEnv(rank=1, world_size=2, job_id="4242", master_port_derived=True)
    with pytest.raises(
        PortError, match=r"^rank 1: rank 0 of job 4242 chose no port within 0.3s"
    ) as info:
        agreed_port(env, tmp_path / "ports", timeout_s=0.3)
    assert "file system every node sees" in str(info.value) and "\n" not in str(info.value)


def test_a_master_port_the_user_set_is_used_as_is(tmp_path: Path) -> None:
    import socket

    from hpcdl.env import RankEnv
    from hpcdl.script_port import agreed_port

    with socket.create_server(("127.0.0.1", 0)) as server:  # taken: still the user's choice
        port = server.getsockname()[1]
        env = RankEnv(rank=0, world_size=2, job_id="4242", master_port=port)
        assert agreed_port(env, tmp_path / "ports", timeout_s=1) == port
    assert not (tmp_path / "ports").exists()


def test_a_debug_runs_program_gets_a_free_port_or_the_shells(hpcdl, tmp_path: Path) -> None:
    """cluster=debug gave every program MASTER_PORT=29500: a second run beside it (a local
    sweep's trials run 2 at a time) failed in init_process_group with EADDRINUSE (persona,
    FSDP). Now a free port each, or the one the shell set."""
    import contextlib
    import socket

    (tmp_path / "port.py").write_text(
        "import os, pathlib\n"
        "(pathlib.Path(os.environ['HPCDL_RUN_DIR']) / 'port').write_text(os.environ['MASTER_PORT'])\n"
    )
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(OSError):  # taken already: as good for this test
            stack.enter_context(socket.create_server(("", 29500)))
        out = hpcdl("run", "-m", "hydra.sweep.dir=sw", "--", "python", "port.py", "--n={1,2}")
        assert out.returncode == 0, out.stdout + out.stderr
        ports = {int((tmp_path / "sw" / i / "port").read_text()) for i in "01"}
        assert 29500 not in ports and len(ports) == 2, ports
    out = hpcdl("run", "run_dir=r", "--", "python", "port.py", env={"MASTER_PORT": "23456"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "r" / "port").read_text() == "23456"


# A program that saves when asked to stop (hpcdl.api, as docs/scripts.md shows) and notes
# every SIGTERM and SIGINT it gets; SIGINT keeps Python's own action (KeyboardInterrupt).
CATCHING_PROGRAM = """\
import os, pathlib, signal, sys, time
import hpcdl.api as hp
hp.catch_stop_signals()
out = pathlib.Path(os.environ["HPCDL_RUN_DIR"])
rank = os.environ["RANK"]
caught = signal.getsignal(signal.SIGTERM)
def note(signum, frame):
    with open(out / f"signals-{rank}", "a") as f:
        f.write(signal.Signals(signum).name + "\\n")
    if signum != signal.SIGTERM:
        raise KeyboardInterrupt
    caught(signum, frame)
signal.signal(signal.SIGTERM, note)
signal.signal(signal.SIGINT, note)
(out / f"started-{rank}").write_text(str(os.getpid()))
while not hp.stop_requested():
    time.sleep(0.05)
time.sleep(1)  # the save takes a moment; a second signal would land here
if sys.argv[1:] == ["--never-exit"]:  # a save that hangs: only a forced stop ends it
    while True:
        time.sleep(0.05)
(out / f"saved-{rank}").touch()
raise SystemExit(hp.EXIT_REQUEUE)
"""

# A program that knows nothing of hpcdl: the signal's default action must end it.
PLAIN_PROGRAM = """\
import os, pathlib, time
out = pathlib.Path(os.environ["HPCDL_RUN_DIR"])
(out / f"started-{os.environ['RANK']}").write_text(str(os.getpid()))
time.sleep(600)
"""


def start_run_in_terminal(tmp_path: Path, ranks: int, *command: str) -> subprocess.Popen[str]:
    """`hpcdl run cluster=local` as a terminal runs it: in a process group of its own (which
    a terminal's Ctrl-C reaches as a whole), returned once every rank's program has started."""
    import time

    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpcdl.cli.main", "run", "cluster=local",
         f"cluster.tasks_per_node={ranks}", f"run_dir={run}", "--", *command],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while len(list(run.glob("started-*"))) < ranks:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the programs did not start"
        time.sleep(0.1)
    return proc


def end_programs(proc: subprocess.Popen[str], run: Path) -> None:
    """Whatever a failed test left running: the programs (in sessions of their own) and
    hpcdl's own processes."""
    import contextlib
    import signal

    for started in run.glob("started-*"):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(started.read_text()), signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


@pytest.mark.parametrize("program", ["catching", "plain"])
def test_a_terminals_ctrl_c_gives_each_local_rank_one_sigterm_and_time_to_save(
    tmp_path: Path, program: str
) -> None:
    """Ctrl-C at the terminal reaches the whole foreground group: hpcdl, and each rank's
    wrapper itself. The program gets one SIGTERM (the wrapper used to pass the terminal's
    SIGINT on, which killed a program using hpcdl.api before it saved); one that catches
    nothing still ends at once."""
    import signal

    text = CATCHING_PROGRAM if program == "catching" else PLAIN_PROGRAM
    (tmp_path / "prog.py").write_text(text)
    proc = start_run_in_terminal(tmp_path, 2, "python", "prog.py")
    run = tmp_path / "run"
    try:
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        end_programs(proc, run)
    assert proc.returncode == 3, output
    assert "SIGINT: asking the program to stop (SIGTERM to each rank; again to end" in output
    assert "stopping all ranks at the next step" not in output
    if program == "catching":
        for rank in ("0", "1"):
            assert (run / f"signals-{rank}").read_text() == "SIGTERM\n", output
            assert (run / f"saved-{rank}").exists(), output
        assert "when asked to stop" not in output  # status 3: it saved
    else:
        assert "the program exited with status 143 when asked to stop; hpcdl.api's checkpoint store got no checkpoint" in output
    end = json.loads((run / "attempts.jsonl").read_text().splitlines()[-1])
    assert end["reason"] == "interrupted", end


@pytest.mark.parametrize("to", ["terminal", "hpcdl"])
def test_a_second_stop_ends_a_program_that_does_not_stop(tmp_path: Path, to: str) -> None:
    """The first Ctrl-C asks (SIGTERM); a second one, while the program is still saving or
    hangs there, ends it at once (SIGKILL to its process group). The same for two signals
    to the `hpcdl` process alone (`kill PID` twice, no terminal): before, only a second
    SIGINT from the terminal forced it, so such a program ran on."""
    import signal
    import time

    def stop() -> None:
        if to == "terminal":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGTERM)

    (tmp_path / "prog.py").write_text(CATCHING_PROGRAM)
    proc = start_run_in_terminal(tmp_path, 1, "python", "prog.py", "--never-exit")
    run = tmp_path / "run"
    try:
        stop()
        deadline = time.monotonic() + 60
        while not (run / "signals-0").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(1)
        assert proc.poll() is None  # still "saving"
        stop()
        output, _ = proc.communicate(timeout=60)
    finally:
        end_programs(proc, run)
    assert "hpcdl: asked again: ending the program now (SIGKILL)" in output, output
    assert "the program exited with status 137 when asked to stop" in output
    assert proc.returncode == 3, output
    assert (run / "signals-0").read_text() == "SIGTERM\n"


# Rank 1 fails (with a message, as sys.exit("...") gives one), the others would wait for it
# forever: in init_process_group, or without any collective at all.
FAILING_RANK_PROGRAM = """\
import os, pathlib, sys, time
out = pathlib.Path(os.environ["HPCDL_RUN_DIR"])
(out / f"started-{os.environ['RANK']}").write_text(str(os.getpid()))
time.sleep(1)
if os.environ["RANK"] == "1":
    sys.exit("cannot read /data/shard-1.npz")
time.sleep(600)
"""


def test_a_rank_whose_program_fails_ends_the_others_and_is_named(tmp_path: Path) -> None:
    # Before: rank 0 slept its 600 s, the terminal showed nothing of rank 1, and the run
    # ended with rank 1's status but no word of why.
    import time

    (tmp_path / "prog.py").write_text(FAILING_RANK_PROGRAM)
    proc = start_run_in_terminal(tmp_path, 2, "python", "prog.py")
    run = tmp_path / "run"
    started = time.monotonic()
    try:
        output, _ = proc.communicate(timeout=60)
    finally:
        end_programs(proc, run)
    assert time.monotonic() - started < 30, output
    assert proc.returncode == 1, output
    assert "hpcdl: rank 1's program exited with status 1: ending this rank's program" in output
    assert (
        "error: rank 1: the program exited with status 1: cannot read /data/shard-1.npz"
        in output
    ), output
    end = json.loads((run / "attempts.jsonl").read_text().splitlines()[-1])
    assert end["reason"] == "failed", end


def test_processes_a_program_leaves_behind_are_ended(hpcdl, tmp_path: Path) -> None:
    # Before: the sleep outlived the run, one per rank.
    (tmp_path / "prog.py").write_text(
        "import os, pathlib, subprocess, sys\n"
        "child = subprocess.Popen(['sleep', '600'])\n"
        "pathlib.Path(os.environ['HPCDL_RUN_DIR'], 'child-' + os.environ['RANK'])"
        ".write_text(str(child.pid))\n"
        "sys.exit(5)\n"
    )
    result = hpcdl("run", "cluster=local", "cluster.tasks_per_node=2", "run_dir=run", "--",
                   "python", "prog.py")  # fmt: skip
    assert result.returncode == 5, result.stdout + result.stderr
    assert "the program left processes running: ending them" in result.stdout
    for rank in ("0", "1"):
        pid = int((tmp_path / "run" / f"child-{rank}").read_text())
        assert not running(pid), f"rank {rank}'s sleep {pid} outlived the run"


def running(pid: int) -> bool:
    """Alive and not a zombie (one its new parent has not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


# A script that resumes from its own checkpoint folder, relative by default (`--out out`, as
# most scripts have it), and reports what it trained.
RESUMING_SCRIPT = """\
import argparse, json, os, pathlib
parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float)
parser.add_argument("--epochs", type=int)
parser.add_argument("--out", default="out")
args = parser.parse_args()
ck = pathlib.Path(args.out) / "ck.json"
ck.parent.mkdir(parents=True, exist_ok=True)
start = json.loads(ck.read_text())["epoch"] if ck.exists() else 0
ck.write_text(json.dumps({"epoch": args.epochs, "lr": args.lr}))
metrics = {"trained_epochs": args.epochs - start, "lr": args.lr}
pathlib.Path(os.environ["HPCDL_RUN_DIR"], "m.json").write_text(json.dumps(metrics))
"""


def test_a_sweep_gives_each_trial_its_own_output_folder_through_hpcdl_run_dir(
    hpcdl, tmp_path: Path
) -> None:
    """Trials share the working directory: a relative output folder made each trial resume
    from the one before (COMPLETED, having trained nothing). `'$HPCDL_RUN_DIR'` in the
    command is the trial's run dir; a command without it gets one warning at submission."""
    (tmp_path / "fit.py").write_text(RESUMING_SCRIPT)
    sweep = ["run", "-m", "metrics_file=m.json", "--", "python", "fit.py", "--lr={0.1,0.3}"]
    own = hpcdl(*sweep[:2], "hydra.sweep.dir=own", *sweep[2:], "--epochs", "2",
                "--out", "$HPCDL_RUN_DIR/ck")  # fmt: skip
    assert own.returncode == 0, own.stderr + own.stdout
    assert "warning" not in own.stderr, own.stderr
    for trial, lr in (("0", 0.1), ("1", 0.3)):
        run_dir = tmp_path / "own" / trial
        summary = json.loads((run_dir / "summary.json").read_text())
        assert (summary["trained_epochs"], summary["lr"]) == (2, lr)
        assert json.loads((run_dir / "ck" / "ck.json").read_text())["lr"] == lr
    assert not (tmp_path / "out").exists() and not (tmp_path / "$HPCDL_RUN_DIR").exists()
    shared = hpcdl(*sweep[:2], "hydra.sweep.dir=shared", *sweep[2:], "--epochs", "2")
    assert shared.returncode == 0, shared.stderr + shared.stdout
    warning = (
        f"warning: the 2 trials all run in {tmp_path} (the working directory, not their run "
        "dirs): an output path relative to it, in the command or the script's defaults "
        "(--out out), is the same folder for every trial"
    )
    assert shared.stderr.count(warning) == 1, shared.stderr
    assert "--out '$HPCDL_RUN_DIR/out'" in shared.stderr


CTRL_C_PROGRAM = """\
import sys, time
import hpcdl.api as hp
hp.catch_stop_signals()
print("ready", flush=True)
try:
    while not hp.stop_requested():
        time.sleep(0.02)
    print("saving", flush=True)
    if sys.argv[1] == "slow-save":
        time.sleep(60)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
    raise SystemExit(130)
raise SystemExit(hp.EXIT_REQUEUE)
"""


@pytest.mark.parametrize("presses", [1, 2])
def test_catch_stop_signals_takes_a_first_ctrl_c_as_a_stop_and_a_second_as_an_interrupt(
    tmp_path: Path, presses: int
) -> None:
    """cluster=debug passes Ctrl-C on as SIGINT, and a program run by hand gets it: the
    first asks for a stop (the program saves), a second interrupts a save that hangs."""
    program = tmp_path / "prog.py"
    program.write_text(CTRL_C_PROGRAM)
    mode = "slow-save" if presses == 2 else "save"
    proc = subprocess.Popen(
        [sys.executable, str(program), mode], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    assert proc.stdout.readline() == "saving\n"
    if presses == 2:
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline() == "KeyboardInterrupt\n"
    assert proc.wait(timeout=30) == (130 if presses == 2 else 3)


LATE_SIGNAL_PROGRAM = """\
import os, signal, sys, time
import hpcdl.api as hp
hp.catch_stop_signals()
hp.catch_stop_signals()  # twice, as the Lightning example does: one exit hook
class LateSignal:
    # Its __del__ runs as Python tears __main__ down, after Python has put every signal
    # handler back to the default action: as a wrapper's SIGTERM that arrives while the
    # program is already leaving (another rank asked it to stop) lands.
    def __del__(self, kill=os.kill, pid=os.getpid(), sleep=time.sleep, sig=signal.%s):
        kill(pid, sig)
        sleep(0.2)
late = LateSignal()
sys.exit(hp.EXIT_REQUEUE)
"""


@pytest.mark.parametrize(("sig", "status"), [("SIGTERM", 3), ("SIGUSR1", 3), ("SIGINT", -2)])
def test_a_stop_signal_during_python_s_exit_leaves_the_exit_status_as_it_was(
    tmp_path: Path, sig: str, status: int
) -> None:
    """Seen under load on 2026-11-26 (test_run_lightning): one rank's program was leaving
    with status 3 after the other rank's stop, and its wrapper's SIGTERM reached it during
    Python's teardown, where the default action ended it with 143. A stop signal is ignored
    from the exit hooks on; Ctrl-C still ends a program that hangs there."""
    script = tmp_path / "late.py"
    script.write_text(LATE_SIGNAL_PROGRAM % sig)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == status, done.stderr


def test_hpcdls_own_flag_after_the_double_dash_is_warned_about(hpcdl, tmp_path) -> None:
    # `hpcdl run cluster=X -- python train.py --dry-run` submitted a real job (the flag went
    # to the program): a program may take --dry-run too, so it runs, with a warning.
    (tmp_path / "t.py").write_text("import sys\nprint('args', sys.argv[1:])\n")
    out = hpcdl("run", "run_dir=run", "--", "python", "t.py", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "args ['--dry-run']" in out.stdout
    assert out.stderr.startswith(
        "hpcdl: warning: --dry-run is after --, so it goes to your program, not to hpcdl; "
        "for hpcdl's --dry-run, put it before --\n"
    ), out.stderr


def test_a_metrics_file_only_an_earlier_attempt_wrote_is_warned_about(hpcdl, tmp_path) -> None:
    # Lightning's CSVLogger writes version_0/metrics.csv in the first attempt and
    # version_1/... in the next: metrics_file=version_0/... was merged as the run's result.
    (tmp_path / "p.py").write_text(
        "import os, pathlib, sys\n"
        "out = pathlib.Path(os.environ['HPCDL_RUN_DIR']) / 'm.json'\n"
        "if not out.exists():\n"
        "    out.write_text('{\"loss\": 1.0}')\n"
        "    sys.exit(3)  # a requeue asked for: the next attempt writes nothing\n"
    )
    first = hpcdl("run", "run_dir=r", "metrics_file=m.json", "--", "python", "p.py")
    assert first.returncode == 3, first.stdout + first.stderr
    assert "was last written before" not in first.stdout
    out = hpcdl("resume", "r")
    assert out.returncode == 0, out.stdout + out.stderr
    assert (
        f"hpcdl: warning: metrics_file=m.json: {tmp_path / 'r' / 'm.json'} was last written "
        "before this attempt started, so its values are an earlier attempt's" in out.stdout
    ), out.stdout


STOP_HINT_DRIVER = """\
import sys
from dataclasses import replace
from pathlib import Path
from hpcdl import script_job
from hpcdl.cli.compose import compose_config
from hpcdl.config.schema import ScriptConfig
from hpcdl.rundir import RunDir
from hpcdl.signals import stop_on_signals

script_job.STOP_HINT_S = 1.0
cfg = replace(compose_config([]), script=ScriptConfig(command=["python", sys.argv[2]]))
with stop_on_signals(("SIGTERM",)) as flag:
    script_job.run_script(cfg, RunDir(Path(sys.argv[1])), flag)
"""

# A program that does not end when asked (as Lightning's handler can hang under DDP).
SLOW_TO_STOP = """\
import os, pathlib, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path(os.environ["HPCDL_RUN_DIR"], "started").touch()
time.sleep(4)
"""


def test_a_program_still_running_long_after_a_stop_is_told_how_to_end(tmp_path) -> None:
    import signal
    import time

    (tmp_path / "driver.py").write_text(STOP_HINT_DRIVER)
    (tmp_path / "slow.py").write_text(SLOW_TO_STOP)
    run = tmp_path / "run"
    run.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    driver = start_driver(tmp_path, run, "slow.py", env)
    deadline = time.monotonic() + 60
    while not (run / "started").exists():
        assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()
        time.sleep(0.1)
    driver.send_signal(signal.SIGTERM)
    out, err = driver.communicate(timeout=60)
    assert "hpcdl: the program has not ended 1 s after the stop; one that hangs there" in out, (
        out + err
    )


def test_a_loggers_csv_gives_each_columns_last_value_and_ranks_by_no_counter(
    hpcdl, tmp_path
) -> None:
    """Lightning's CSVLogger writes train and val metrics on rows of their own: the last row
    left train_loss empty (null in summary.json), and a sweep ranked by `epoch`."""
    (tmp_path / "fit.py").write_text(
        "import os, pathlib, sys\n"
        "lr = float(sys.argv[1])\n"
        "rows = ['epoch,step,train_loss,val_loss', f'0,9,{1 - lr},', f'0,9,,{2 - lr}']\n"
        "out = pathlib.Path(os.environ['HPCDL_RUN_DIR']) / 'metrics.csv'\n"
        "out.write_text('\\n'.join(rows) + '\\n')\n"
    )
    out = hpcdl(
        "run", "-m", "hydra.sweep.dir=sw", "metrics_file=metrics.csv", "--", "python", "fit.py",
        "{0.1,0.5}",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads((tmp_path / "sw" / "0" / "summary.json").read_text())
    assert (summary["train_loss"], summary["val_loss"], summary["step"]) == (0.9, 1.9, 9)
    status = hpcdl("sweep", "status", "sw")
    assert status.stdout.splitlines()[0].endswith("| train_loss |"), status.stdout


def test_a_script_sweeps_dry_run_shows_the_program_as_a_single_runs_does(hpcdl, tmp_path) -> None:
    (tmp_path / "fit.py").write_text("print('fit')\n")
    out = hpcdl(
        "run", "-m", "cluster=rivanna_a100", "hydra.sweep.dir=sw", "--no-preflight", "--dry-run",
        "--", "python", "fit.py", "--lr={0.1,0.2}",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    at = lines.index("# program (trial 0's; each trial its own arguments)")
    assert lines[at + 1].strip() == f"python {tmp_path / 'sw' / 'code' / 'script' / 'fit.py'} --lr=0.1"
    assert not (tmp_path / "sw").exists()


def test_a_stop_torchrun_ends_with_status_1_is_said_so_also_as_the_commands_own(tmp_path) -> None:
    """`-- torchrun ...` on cluster=debug: torchrun's status 1 on the stop was "status 3
    would confirm"; and a checkpoint the program wrote itself was "no checkpoint was saved"
    (persona, FSDP)."""
    from hpcdl.rundir import RunDir
    from hpcdl.script_job import _is_torchrun, _unconfirmed_stop

    assert _is_torchrun(["torchrun", "--nproc-per-node", "2", "t.py"])
    assert _is_torchrun(["python3", "-m", "torch.distributed.run", "t.py"])
    assert not _is_torchrun(["python", "t.py"])
    line = _unconfirmed_stop(1, "the stop", RunDir(tmp_path), 0.0)
    assert line == (
        "torchrun exited with status 1 on the stop (its SignalException traceback above is how "
        "it ends); hpcdl.api's checkpoint store got no checkpoint after the stop (one your "
        "program writes itself is not looked for)"
    )


def test_a_value_twice_in_a_command_list_is_refused() -> None:
    # Before: two trials alike, each training the same thing.
    with pytest.raises(ConfigError, match=r"--lr=\{0.1,0.1\}: 0.1 is given twice; give each"):
        expand_token("--lr={0.1,0.1}")
    with pytest.raises(ConfigError, match=r"0\.1 and 1e-1 are one value"):
        expand_token("{0.1,1e-1}")
    with pytest.raises(ConfigError, match=r"seed=1,2,1: 1 is given twice"):
        expand_token("seed=1,2,1")
    assert expand_token("--opt={adam,adamw}") == ["--opt=adam", "--opt=adamw"]
