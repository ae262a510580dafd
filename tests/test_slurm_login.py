"""The login-node side of Slurm, without a cluster: sbatch text, parsers, no torch import."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hpcdl.cli.compose import compose_config
from hpcdl.launch.preflight import constraint_satisfied, parse_gres, parse_partitions, slurm_minutes
from hpcdl.launch.slurm import rank_environment, sbatch_parameters, sbatch_refusal
from tests.conftest import run_hpcdl, run_without_torch


def test_dry_run_prints_the_workshop_flags_and_submits_nothing(hpcdl, tmp_path) -> None:
    out = hpcdl(
        "train", "cluster=rivanna_a100", "cluster.gpus_per_node=4", "run_dir=r", "--dry-run"
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for line in (
        "#SBATCH --partition=gpu",
        "#SBATCH --gres=gpu:a100:4",
        "#SBATCH --constraint=gpupod",
        "#SBATCH --ntasks-per-node=4",  # one task per GPU
        "#SBATCH --signal=USR2@180",
        "#SBATCH --requeue",
        "module load cuda",
        f"export PYTHONPATH={tmp_path / 'r' / 'code'}",
        "srun --unbuffered",
    ):
        assert line in text, line
    assert text.count("RANK(SLURM_PROCID)=") == 4
    assert "nothing submitted" in text
    assert not (tmp_path / "r").exists()
    # No workload key of submitit's: a site that enforces them would refuse or misbill it.
    assert "--wckey" not in text
    assert "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in text  # torch's current name


def test_login_node_path_never_imports_torch(tmp_path) -> None:
    code = (
        "from hpcdl.cli.main import main\n"
        "main(['train', 'cluster=rivanna_a100', '--dry-run'])\n"
        "main(['train', '--cfg', 'job'])\n"
        "import hpcdl.launch.slurm, hpcdl.launch.monitor, hpcdl.launch.preflight, hpcdl.rundir\n"
        "print('no torch')\n"
    )
    out = run_without_torch(code, cwd=tmp_path)
    assert "no torch" in out.stdout


def test_tasks_default_to_one_per_gpu_and_extra_parameters_win() -> None:
    cfg = compose_config(
        [
            "cluster=slurm",
            "cluster.gpus_per_node=3",
            "cluster.gpu_type=h100",
            "+cluster.sbatch_extra.exclusive=true",
            "cluster.signal=USR1",
            "cluster.signal_delay_s=60",
        ]
    )
    params = sbatch_parameters(cfg.cluster, "job")
    assert params["ntasks_per_node"] == 3
    assert params["gres"] == "gpu:h100:3"
    assert params["additional_parameters"]["signal"] == "USR1@60"
    assert params["additional_parameters"]["exclusive"] is True
    assert len(rank_environment(cfg)) == 3
    # `exclusive: false` is no option (it was written --exclusive=False, which sbatch
    # refuses); mem_gb=0 is sbatch's --mem=0, a node's whole memory (it was refused).
    off = compose_config(["cluster=slurm", "+cluster.sbatch_extra.exclusive=false"])
    assert "exclusive" not in sbatch_parameters(off.cluster, "job")["additional_parameters"]
    whole = compose_config(["cluster=slurm", "cluster.mem_gb=0"])
    assert sbatch_parameters(whole.cluster, "job")["mem"] == "0"
    unset = compose_config(["cluster=slurm", "cluster.mem_gb=null"])
    assert "mem" not in sbatch_parameters(unset.cluster, "job")  # the site's default


def test_job_name_export_none_and_a_failing_setup_line_in_the_script(hpcdl) -> None:
    """An HPC engineer's flags: sbatch_extra.job-name was written after hpcdl's own
    --job-name (Slurm took hpcdl's); export=NONE left srun's ranks without the script's
    environment (submitit's job failed on the node); a setup line that failed (a `module
    load`) went unnoticed and the job trained on, COMPLETED. On the dev cluster:
    tests/slurm/test_slurm.py."""
    out = hpcdl(
        "train", "cluster=devcluster", "+cluster.sbatch_extra.job-name=myjob",
        "+cluster.sbatch_extra.export=NONE", "cluster.setup=[module load cuda/12.4]",
        "--no-preflight", "--dry-run",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line for line in lines if "--job-name" in line] == ["#SBATCH --job-name=myjob"]
    assert "#SBATCH --export=NONE" in lines
    assert next(line for line in lines if line.startswith("srun ")).count(" --export=ALL ") == 1
    setup = lines.index("module load cuda/12.4")
    assert lines[setup - 3 : setup] == [
        "set -e",
        "trap 'echo \"error: cluster.setup: \\`$HPCDL_SETUP_LINE\\` failed (exit $?); the job "
        "stops\" >&2' ERR",
        "HPCDL_SETUP_LINE='module load cuda/12.4'",  # the line, also where a function fails
    ]
    assert lines[setup + 1 : setup + 4] == ["trap - ERR", "set +e", "unset HPCDL_SETUP_LINE"]
    # Lmod's `module` is a shell function: the trap named its last command, `return 1`.
    script = "\n".join(
        [
            'module() { echo "Lmod has detected the following error: $2" >&2; return 1; }',
            *lines[setup - 3 : setup + 4],
            "echo reached",
        ]
    )
    ran = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert ran.returncode == 1 and "reached" not in ran.stdout
    assert ran.stderr.endswith(
        "error: cluster.setup: `module load cuda/12.4` failed (exit 1); the job stops\n"
    ), ran.stderr


@pytest.mark.parametrize(
    ("minutes", "delay", "needed"),
    [(1, 30, 3), (2, 30, 3), (3, 30, None), (3, 120, 4), (4, 120, None), (60, 120, None)],
)
def test_a_time_limit_too_short_to_train_in_is_warned_about(minutes, delay, needed) -> None:
    """sbatch may signal up to 60 s before signal_delay_s: under a minute left to train."""
    from hpcdl.launch.preflight import short_time_limit_note

    cfg = compose_config(
        ["cluster=devcluster", f"cluster.timeout_min={minutes}", f"cluster.signal_delay_s={delay}"]
    )
    note = short_time_limit_note(cfg.cluster)
    if needed is None:
        assert note is None
    else:
        assert note is not None and f"set cluster.timeout_min={needed} or more" in note
        # A smaller delay only where one fits (not for a 1-minute limit: none can).
        fits = minutes * 60 - 120
        assert note.endswith(f", or cluster.signal_delay_s={fits} or less" if fits >= 30 else
                             f"{needed} or more"), note  # fmt: skip


def test_a_short_time_limit_is_one_warning_line_and_submits_nothing_else_changed(hpcdl) -> None:
    """A dry run of a two-trial sweep: one warning line (not one per trial), the scripts
    printed as without it."""
    args = ["cluster=devcluster", "cluster.timeout_min=1", "--no-preflight"]
    out = hpcdl("train", "-m", "optim.lr=0.1,0.2", *args, "--dry-run")
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("warning:")]
    assert lines == [
        "warning: cluster.timeout_min=1 with cluster.signal_delay_s=30: Slurm may send the "
        "time-limit signal up to 60 s early, so an allocation may save and stop before it "
        "trains a step (each time counts against cluster.max_requeues=3); set "
        "cluster.timeout_min=3 or more"
    ]
    assert "#SBATCH --time=1" in out.stdout and "nothing submitted" in out.stdout
    plain = hpcdl("train", "cluster=devcluster", "run_dir=r", "--no-preflight", "--dry-run")
    assert plain.returncode == 0 and "warning:" not in plain.stderr


def test_a_dry_run_into_a_run_dir_that_exists_is_refused_as_the_submit_would_be(
    hpcdl, tmp_path
) -> None:
    # Before: the script, "nothing submitted" and exit 0; the submit then said no.
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.yaml").write_text("model: {}\n")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("mine")
    for run_dir, said in [
        ("r", "run_dir='r' already exists; continue it with `hpcdl resume r`"),
        ("notes", "run_dir='notes': "),
    ]:
        out = hpcdl("train", "cluster=devcluster", f"run_dir={run_dir}", "--no-preflight",
                    "--dry-run")  # fmt: skip
        assert out.returncode == 2, out.stdout
        assert "#SBATCH" in out.stdout and "nothing submitted" in out.stdout
        assert out.stderr.startswith(f"error: {said}") and out.stderr.count("\n") == 1
    assert (tmp_path / "notes" / "a.txt").read_text() == "mine"
    for cluster in ("cluster=devcluster", "cluster=debug"):  # and a sweep's dir
        out = hpcdl("train", "-m", cluster, "optim.lr=0.1,0.2", "hydra.sweep.dir=notes",
                    "--no-preflight", "--dry-run")  # fmt: skip
        assert out.returncode == 2, out.stdout
        assert "1: optim.lr=0.2" in out.stdout
        assert out.stderr.startswith(f"error: hydra.sweep.dir='{tmp_path / 'notes'}' already")
    (tmp_path / "afile").write_text("mine")  # a file where the sweep dir would go
    for how in ("--dry-run", "--no-preflight"):
        out = hpcdl("train", "-m", "optim.lr=0.1,0.2", "hydra.sweep.dir=afile", how)
        assert out.returncode == 2 and out.stderr == (
            f"error: hydra.sweep.dir='{tmp_path / 'afile'}' is a file, not a folder; choose a "
            "new hydra.sweep.dir\n"
        )
    assert (tmp_path / "afile").read_text() == "mine"


def test_dry_run_needs_a_slurm_profile(hpcdl) -> None:
    out = hpcdl("train", "--dry-run")
    assert out.returncode == 2 and "not a Slurm profile" in out.stderr


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("UNLIMITED", None),
        ("30", 30),
        ("1:00:00", 60),
        ("2-00:00:00", 2880),
        ("1-12", 2160),
        ("10:30", 10.5),
    ],
)
def test_slurm_minutes(text: str, minutes: float | None) -> None:
    assert slurm_minutes(text) == minutes


def test_parse_gres_and_constraints() -> None:
    assert parse_gres("gpu:a100:4(S:0-1)") == {"a100": 4, "": 4}
    assert parse_gres("gpu:a100:2,gpu:v100:2") == {"a100": 2, "v100": 2, "": 4}
    assert parse_gres("gpu:4") == {"": 4}
    assert parse_gres("(null)") == {}
    assert constraint_satisfied("gpupod", {"gpupod", "ib"})
    assert constraint_satisfied("gpupod&ib", {"gpupod", "ib"})
    assert not constraint_satisfied("gpupod&nvlink", {"gpupod"})
    assert constraint_satisfied("a|gpupod", {"gpupod"})


def test_parse_partitions() -> None:
    text = (
        "PartitionName=cpu AllowGroups=ALL Default=YES MaxNodes=UNLIMITED MaxTime=01:00:00 Nodes=n[1-2]\n"
        "PartitionName=gpu Default=NO MaxNodes=2 MaxTime=2-00:00:00 Nodes=n[1-2]\n"
    )
    parts = parse_partitions(text)
    assert parts["cpu"]["Default"] == "YES" and parts["gpu"]["MaxNodes"] == "2"


def test_sbatch_refusal_names_the_sbatch_extra_options_it_may_come_from() -> None:
    cluster = compose_config(["cluster=rivanna_a100"]).cluster
    stderr = 'sbatch: error: Invalid --begin specification\nTry "sbatch --help"\n'
    assert sbatch_refusal(stderr, cluster) == (
        "sbatch refused the job: sbatch: error: Invalid --begin specification"
    )
    cluster.sbatch_extra = {"begin": "soon", "nodelist": "n[1-2]"}
    assert sbatch_refusal(stderr, cluster) == (
        "sbatch refused the job: sbatch: error: Invalid --begin specification "
        "(from cluster.sbatch_extra: --begin=soon)"
    )
    # Words that name a key of the profile: that key, not sbatch_extra (a support ticket's
    # user went looking there for a bad account).
    account = "sbatch: error: Batch job submission failed: Invalid account or account/partition"
    cluster.account = "lab9"
    assert sbatch_refusal(account, cluster).endswith("partition (cluster.account=lab9)")
    generic = "sbatch: error: Batch job submission failed: Unspecified error"
    assert sbatch_refusal(generic, cluster).endswith(
        "(cluster.sbatch_extra adds --begin=soon --nodelist=n[1-2]: check those)"
    )
    unknown = "sbatch: unrecognized option '--beginn=soon'\n"
    cluster.sbatch_extra = {"beginn": "soon"}
    assert sbatch_refusal(unknown, cluster).startswith(
        "cluster.sbatch_extra.beginn: sbatch has no option --beginn"
    )


def test_requeue_policy_counts_timeouts_not_preemptions() -> None:
    from hpcdl.launch.slurm_job import should_requeue

    assert should_requeue("preempted", num_timeouts_before=99, max_requeues=0)
    assert should_requeue("timeout", num_timeouts_before=2, max_requeues=3)
    assert not should_requeue("timeout", num_timeouts_before=3, max_requeues=3)
    assert not should_requeue("cancelled", num_timeouts_before=0, max_requeues=3)


def test_warning_signal_is_a_timeout_only_near_the_time_limit(monkeypatch) -> None:
    from hpcdl.launch import slurm_job

    monkeypatch.setattr(slurm_job, "seconds_left", lambda job_id: 40.0)
    assert slurm_job.classify("SIGUSR2", "SIGUSR2", "1", signal_delay_s=30) == "timeout"
    monkeypatch.setattr(slurm_job, "seconds_left", lambda job_id: 3000.0)
    assert slurm_job.classify("SIGUSR2", "SIGUSR2", "1", signal_delay_s=30) == "preempted"
    monkeypatch.setattr(slurm_job, "restarts_now", lambda job_id: 2)
    assert slurm_job.classify("SIGTERM", "SIGUSR2", "1", 30, started_restarts=2) == "cancelled"


def test_sigterm_is_an_outside_requeue_when_slurm_already_counts_the_restart(monkeypatch) -> None:
    """`scontrol requeue` ends the job with a plain SIGTERM, like scancel; Slurm's restart
    count has already gone up by then (`scontrol show job`), a scancel's has not."""
    from hpcdl.launch import slurm_job

    monkeypatch.setattr(slurm_job, "restarts_now", lambda job_id: 3)
    assert slurm_job.classify("SIGTERM", "SIGUSR2", "7", 30, started_restarts=2) == "requeued"
    assert slurm_job.classify("SIGTERM", "SIGUSR2", "7", 30, started_restarts=3) == "cancelled"
    monkeypatch.setattr(slurm_job, "restarts_now", lambda job_id: None)  # scontrol failed
    assert slurm_job.classify("SIGTERM", "SIGUSR2", "7", 30, started_restarts=0) == "cancelled"
    assert not slurm_job.should_requeue("requeued", num_timeouts_before=0, max_requeues=3)


def test_snapshot_freezes_the_users_model_module_but_not_installed_ones(
    tmp_path, monkeypatch, capsys
) -> None:
    from hpcdl.launch.snapshot import changed_since_frozen, snapshot_code

    src = tmp_path / "src"
    (src / "mypkg_frz").mkdir(parents=True)
    (src / "mypkg_frz" / "__init__.py").write_text("")
    (src / "mypkg_frz" / "nets.py").write_text("def build(**kw): ...\n")
    (src / "mymod_frz.py").write_text("def build(**kw): ...\n")
    monkeypatch.syspath_prepend(str(src))
    base = tmp_path / "run"
    targets = ["mypkg_frz.nets:build", "mymod_frz:build", "numpy.random:x", "absent_frz:f"]
    code = base / "code"
    snapshot_code(code, targets)
    assert (code / "hpcdl" / "trainer.py").exists()
    assert (code / "mypkg_frz" / "nets.py").read_text() == "def build(**kw): ...\n"
    assert (code / "mymod_frz.py").exists()
    assert not (code / "numpy").exists()  # installed libraries are not copied
    assert (code / "FROZEN").read_text().split()[::2] == ["mymod_frz", "mypkg_frz"]
    assert "module 'absent_frz' is not importable here" in capsys.readouterr().err
    # later edits stay out of the run; a second snapshot (resume) keeps the first one
    (src / "mymod_frz.py").write_text("raise ImportError('edited')\n")
    snapshot_code(code, targets)
    assert (code / "mymod_frz.py").read_text() == "def build(**kw): ...\n"
    # ... and the resume (or a sweep's rerun) says which of them were edited since.
    from hpcdl.launch.slurm import warn_edited_code
    from hpcdl.rundir import RunDir

    capsys.readouterr()
    assert changed_since_frozen(code) == ["mymod_frz"]
    (src / "mypkg_frz" / "extra.py").write_text("")  # a module added to the package
    assert changed_since_frozen(code) == ["mymod_frz", "mypkg_frz"]
    warn_edited_code(RunDir(base), "its job", "start a new run")
    assert capsys.readouterr().err == (
        f"warning: mymod_frz, mypkg_frz changed since {code} was frozen; its job runs that "
        "frozen copy, not your edits (start a new run)\n"
    )
    (src / "mymod_frz.py").write_text("def build(**kw): ...\n")
    (src / "mypkg_frz" / "extra.py").unlink()
    (src / "mypkg_frz" / "__pycache__").mkdir()  # bytecode is no edit
    (src / "mypkg_frz" / "__pycache__" / "nets.cpython-311.pyc").write_bytes(b"x")
    assert changed_since_frozen(code) == []
    (src / "mymod_frz.py").unlink()  # moved away: nothing to say about edits
    assert changed_since_frozen(code) == []


def test_a_module_missing_from_the_users_package_is_refused_at_submit(hpcdl, tmp_path) -> None:
    """The login node imports none of the user's code; a module its package lacks (a typo)
    used to be frozen without it and fail in the job."""
    from hpcdl.launch.snapshot import missing_submodule

    (tmp_path / "labpkg_ms").mkdir()
    (tmp_path / "labpkg_ms" / "__init__.py").write_text("raise RuntimeError('never run')\n")
    (tmp_path / "labpkg_ms" / "data.py").write_text("def build(): ...\n")
    env = {"PYTHONPATH": str(tmp_path)}
    args = ["cluster=devcluster", "data=custom", "data.target=labpkg_ms.dta:build"]
    out = hpcdl("train", "run_dir=run", *args, "--no-preflight", env=env)
    assert out.returncode == 2, out.stderr + out.stdout
    assert out.stderr.strip().splitlines() == [
        f"error: data.target='labpkg_ms.dta:build': there is no module 'labpkg_ms.dta' in "
        f"{tmp_path / 'labpkg_ms'}; check the module path"
    ]
    assert not (tmp_path / "run").exists()
    assert missing_submodule("numpy.nosuch:x") is None  # installed: the job's environment decides


def test_chain_mode_asks_for_no_requeue_and_links_count_as_restarts(monkeypatch) -> None:
    from hpcdl.env import CHAIN_LINK, rank_env_from
    from hpcdl.launch.slurm import outside_job_env

    chain = compose_config(["cluster=rivanna_a100", "cluster.requeue=chain"])
    assert "requeue" not in sbatch_parameters(chain.cluster, "j")["additional_parameters"]
    plain = compose_config(["cluster=rivanna_a100"])
    assert sbatch_parameters(plain.cluster, "j")["additional_parameters"]["requeue"] is True
    slurm = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_RESTART_COUNT": "1"}
    assert rank_env_from({**slurm, CHAIN_LINK: "2"}).restart_count == 3
    # A job submitted from inside a chained job starts its own count.
    monkeypatch.setenv(CHAIN_LINK, "2")
    with outside_job_env():
        import os

        assert CHAIN_LINK not in os.environ


def test_unknown_requeue_mode_is_one_line(hpcdl) -> None:
    out = hpcdl("train", "cluster=devcluster", "cluster.requeue=again", "--dry-run")
    assert out.returncode == 2
    assert "cluster.requeue" in out.stderr and "chain" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("extra", "owner"),
    [
        ("cluster.sbatch_extra.time=90", "--time comes from cluster.timeout_min"),
        ("+cluster.sbatch_extra.signal=USR1@60", "--signal comes from cluster.signal and"),
        ("+cluster.sbatch_extra.cpus_per_task=4", "--cpus-per-task comes from cluster.cpus_per"),
        ("+cluster.sbatch_extra.output=/tmp/x.out", "--output is set by hpcdl itself"),
    ],
)
def test_sbatch_extra_may_not_set_what_the_profile_sets(hpcdl, tmp_path, extra, owner) -> None:
    """An option hpcdl writes itself, in sbatch_extra too, replaced hpcdl's line or added a
    second one: a --time past MaxTime queued unchecked, a --signal the ranks ignore (the job
    ran into its time limit, TIMEOUT, not requeued: seen on the dev cluster).
    Refused in one line before anything is created, also with --no-preflight; no Slurm
    is reached here (SLURM_CONF points nowhere)."""
    key = extra.lstrip("+").split("=")[0]
    nowhere = {"SLURM_CONF": str(tmp_path / "no-slurm.conf")}
    for flags in (["--dry-run"], [], ["--no-preflight"]):
        out = hpcdl("train", "cluster=devcluster", extra, "run_dir=r", *flags, env=nowhere)
        assert out.returncode == 2, (flags, out.stdout, out.stderr)
        errors = out.stderr.strip().splitlines()
        assert len(errors) == 1 and errors[0].startswith(f"error: {key}: {owner}"), errors
        assert f"drop this key (~{key})" in errors[0]
        assert not (tmp_path / "r").exists()
    fine = hpcdl("train", "cluster=devcluster", "+cluster.sbatch_extra.exclusive=true",
                 "run_dir=r", "--dry-run", "--no-preflight", env=nowhere)  # fmt: skip
    assert fine.returncode == 0 and "#SBATCH --exclusive" in fine.stdout, fine.stderr


@pytest.mark.parametrize(
    ("name", "why"),
    [("TERM", "would not tell the warning from a cancel"), ("USR3", "is not a signal")],
)
def test_a_warning_signal_the_job_cannot_act_on_is_refused(hpcdl, tmp_path, name, why) -> None:
    """cluster.signal=TERM: scancel's SIGTERM looked like the warning, so `hpcdl cancel`
    was recorded as a preemption and the job requeued itself and trained on (seen on the
    dev cluster); USR3 reached sbatch, whose refusal did not name the key."""
    nowhere = {"SLURM_CONF": str(tmp_path / "no-slurm.conf")}
    for flags in (["--dry-run"], [], ["--no-preflight"]):
        out = hpcdl("train", "cluster=devcluster", f"cluster.signal={name}", "run_dir=r", *flags,
                    env=nowhere)  # fmt: skip
        assert out.returncode == 2, (flags, out.stdout, out.stderr)
        errors = out.stderr.strip().splitlines()
        assert len(errors) == 1 and errors[0].startswith(f"error: cluster.signal='{name}': {why}")
        assert not (tmp_path / "r").exists()
    ok = hpcdl("train", "cluster=devcluster", "cluster.signal=SIGUSR1", "run_dir=r", "--dry-run",
               "--no-preflight", env=nowhere)  # fmt: skip
    assert ok.returncode == 0 and "#SBATCH --signal=USR1@30" in ok.stdout, ok.stderr


def test_a_slurm_conf_that_is_not_there_is_one_line_at_once(hpcdl, tmp_path) -> None:
    """A stale SLURM_CONF (a removed dev cluster's state dir): scontrol retried for 60 s
    and then failed with `s_p_parse_file: cannot stat file`; now one line, at once."""
    missing = tmp_path / "gone" / "slurm.conf"
    out = hpcdl("train", "cluster=devcluster", "run_dir=r", env={"SLURM_CONF": str(missing)},
                timeout=30)  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    errors = out.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith(f"error: SLURM_CONF={missing}: no such file")
    assert not (tmp_path / "r").exists()


def test_overrides_may_follow_flags_and_the_job_uses_this_interpreter(hpcdl, tmp_path) -> None:
    out = hpcdl("train", "cluster=rivanna_a100", "--dry-run", "run_dir=r", "cluster.nodes=2")
    assert out.returncode == 0, out.stderr
    assert f"# run dir (not created): {tmp_path / 'r'}" in out.stdout
    assert "#SBATCH --nodes=2" in out.stdout
    # The interpreter that runs hpcdl, as submitit's real submission uses.
    assert f"{sys.executable} -u -m hpcdl.launch.rank_main" in out.stdout
    bad = hpcdl("train", "--dry-run", "--nope", "run_dir=r")
    assert bad.returncode == 2 and "hpcdl train: unknown option --nope" in bad.stderr


def test_cluster_python_is_the_interpreter_srun_starts_after_the_setup(hpcdl, tmp_path) -> None:
    """An HPC engineer's report: compute nodes that need another environment (another CPU
    architecture, a module's Python) could not choose it; the login node's absolute path
    was used whatever cluster.setup activated."""
    out = hpcdl(
        "train", "cluster=devcluster", "run_dir=r", "cluster.python=python3",
        "cluster.setup=[module load python/3.11]", "--no-preflight", "--dry-run",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    srun = next(line for line in lines if line.startswith("srun "))
    assert srun.endswith(f" --export=ALL python3 -u -m hpcdl.launch.rank_main {tmp_path}/r/logs")
    assert lines.index("module load python/3.11") < lines.index(srun)  # found on its PATH
    assert sys.executable not in out.stdout and "# note:" not in out.stdout
    # A path this machine lacks may exist on the compute nodes only: shown, not refused.
    missing = "/nonexistent/python3"
    out = hpcdl(
        "train", "cluster=devcluster", "run_dir=r", f"cluster.python={missing}",
        "--no-preflight", "--dry-run",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"--export=ALL {missing} -u -m hpcdl.launch.rank_main" in out.stdout
    assert (
        f"# note: cluster.python={missing} does not exist here; the compute nodes must have it"
        in out.stdout.splitlines()
    )
    # `hpcdl run entry=...`: the function's own Python (hpcdl.entry) is the job's too.
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "__init__.py").write_text("")
    (tmp_path / "lab" / "train.py").write_text("def main():\n    pass\n")
    out = hpcdl(
        "run", "cluster=devcluster", f"cluster.python={missing}", "entry=lab.train:main",
        "--no-preflight", "--dry-run", env={"PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    program = out.stdout.split("# program")[1].splitlines()[1]
    assert program.strip().startswith(f"{missing} -u -m hpcdl.entry lab.train:main"), program


def test_a_chain_link_and_a_sweep_array_run_cluster_python_too(tmp_path) -> None:
    """Every job hpcdl submits (a run, a chain's next link, a sweep's array) goes through
    make_executor: its interpreter is cluster.python."""
    from hpcdl.launch.slurm import make_executor
    from hpcdl.rundir import RunDir

    cfg = compose_config(["cluster=devcluster", "cluster.python=/opt/py/bin/python3"])
    executor = make_executor(cfg, RunDir(tmp_path / "r"))
    assert executor._submitit_command_str.startswith("/opt/py/bin/python3 -u -m ")
    default = make_executor(compose_config(["cluster=devcluster"]), RunDir(tmp_path / "r"))
    assert default._submitit_command_str.startswith(f"{sys.executable} -u -m ")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["cluster.python=''"], "cluster.python='': give one interpreter, a name on the node's "
         "PATH after cluster.setup (python3) or an absolute path, without spaces"),
        (["cluster.python='python3 -u'"], "cluster.python='python3 -u': give one interpreter"),
        (["cluster.python='/opt/my py/python3'"], "cluster.python='/opt/my py/python3': give"),
        (["cluster.python=venv/bin/python"], "cluster.python='venv/bin/python': a relative "
         "path; give an absolute path ("),
        (["cluster=local", "cluster.python=python3"], "cluster.python='python3': cluster=local "
         "runs its ranks here"),
        (["cluster.container.image=img.sif", "cluster.python=python3"], "cluster.python="
         "'python3': with cluster.container.image the ranks run the image's interpreter, "
         "cluster.container.python='python3'; set that instead"),
    ],
)  # fmt: skip
def test_a_cluster_python_the_job_cannot_use_is_one_line_naming_the_key(
    overrides, expected
) -> None:
    from hpcdl.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        compose_config(["cluster=devcluster", *overrides])
    assert str(info.value).startswith(expected), str(info.value)
    assert "\n" not in str(info.value)


def test_sweep_dry_run_prints_the_job_array_under_the_sweep_dir(hpcdl, tmp_path) -> None:
    out = hpcdl(
        "train",
        "-m",
        "cluster=devcluster",
        "optim.lr=0.1,0.01",
        "trainer.seed=1,2,3",
        "hydra.sweep.dir=sw",
        "cluster.array_parallelism=2",
        "--dry-run",
    )
    assert out.returncode == 0, out.stderr
    assert "6 trials:" in out.stdout
    assert f"# sweep dir (not created): {tmp_path / 'sw'}" in out.stdout
    assert "#SBATCH --array=0-5%2" in out.stdout
    assert f"#SBATCH --output={tmp_path / 'sw' / 'logs'}/%A_%a_0_log.out" in out.stdout
    assert not (tmp_path / "sw").exists() and not (tmp_path / "outputs").exists()


def test_array_parallelism_zero_runs_every_task_at_once(tmp_path) -> None:
    # submitit's own default throttle is 256: a 300-task array ran at most 256 at once,
    # though cluster.array_parallelism=0 is documented as no limit.
    from hpcdl.launch.slurm import sbatch_text
    from hpcdl.rundir import SweepDir

    cfg = compose_config(["cluster=rivanna_a100"])
    assert "#SBATCH --array=0-299%300\n" in sbatch_text(cfg, SweepDir(tmp_path), array_size=300)
    cfg.cluster.array_parallelism = 8
    assert "#SBATCH --array=0-299%8\n" in sbatch_text(cfg, SweepDir(tmp_path), array_size=300)


def test_containers_wrap_each_rank_and_preflight_checks_runtime_and_image(hpcdl, tmp_path) -> None:
    (tmp_path / "img.sif").write_bytes(b"")
    out = hpcdl(
        "train",
        "cluster=rivanna_a100",
        "cluster.container.image=img.sif",
        "cluster.container.binds=[/scratch]",
        "run_dir=r",
        "--dry-run",
    )
    assert out.returncode == 0, out.stderr
    run = tmp_path / "r"
    assert (
        # The run dir, the folder the run is created from (its workdir), the binds.
        f"apptainer exec --nv --bind {run},{tmp_path},/scratch {tmp_path / 'img.sif'} python3 -u -m "
        "hpcdl.launch.rank_main" in out.stdout
    )
    assert f"if [ -e {run}/logs/$SLURM_JOB_ID.requeue ]" in out.stdout  # after srun
    pyxis = hpcdl(
        "train",
        "cluster=rivanna_a100",
        "cluster.container.runtime=pyxis",
        "cluster.container.image='nvcr.io#nvidia/pytorch:25.01-py3'",
        "run_dir=r",
        "--dry-run",
    )
    assert pyxis.returncode == 0, pyxis.stderr
    assert "'--container-image=nvcr.io#nvidia/pytorch:25.01-py3'" in pyxis.stdout
    assert f"--container-mounts={run}:{run},{tmp_path}:{tmp_path}" in pyxis.stdout
    # Preflight, before anything is created: the runtime, then the image.
    env = {"PATH": "/usr/bin:/bin"}  # no apptainer here
    missing = hpcdl("train", "cluster=devcluster", "cluster.container.image=img.sif", env=env)
    assert missing.returncode == 2 and "'apptainer' is not on PATH" in missing.stderr
    local = hpcdl("train", "cluster.container.image=img.sif")
    assert local.returncode == 2 and "containers are for Slurm profiles" in local.stderr
    assert not list(tmp_path.glob("outputs"))


def test_a_value_hydra_cannot_read_unquoted_says_how_to_quote_it(hpcdl) -> None:
    image = "nvcr.io#nvidia/pytorch:25.01-py3"
    out = hpcdl("train", "cluster=devcluster", f"cluster.container.image={image}", "--dry-run")
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"error: cluster.container.image={image}: Hydra cannot read this value unquoted; "
        f"quote it: \"cluster.container.image='{image}'\" (the double quotes are for the shell)"
    )


def test_an_attempt_that_raises_records_its_end(hpcdl, tmp_path) -> None:
    """The job payload (rank 0 of a Slurm job) records a `failed` end with the error when
    training raises, as it does for every other end (slurm.md: each attempt's end reason)."""
    import numpy as np

    # Arrays of the wrong lengths: the login checks pass (they read names, not data).
    np.savez(tmp_path / "broken.npz", x=np.zeros((10, 3)), y=np.zeros(5))
    out = hpcdl(
        "train", "cluster=devcluster", "run_dir=r", "data=files", "data.path=broken.npz",
        "--no-launch", "--no-preflight",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    job = subprocess.run(
        [sys.executable, "-m", "hpcdl.launch.slurm_job", str(tmp_path / "r")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},
    )
    assert job.returncode != 0
    records = [json.loads(line) for line in (tmp_path / "r" / "attempts.jsonl").open()]
    assert [r["event"] for r in records] == ["start", "end"], records
    assert records[-1]["reason"] == "failed"
    broken = tmp_path / "broken.npz"  # made absolute at compose
    assert records[-1]["error"].startswith(
        f"DataError: data.path='{broken}': 10 feature rows but 5 labels"
    ), records[-1]


def test_a_resume_of_a_slurm_run_whose_model_code_was_edited_warns(hpcdl, tmp_path) -> None:
    """The job runs the module frozen at the first submission: an edit since (a bug fixed)
    does not reach it, and the resume says so instead of rerunning the bug silently."""
    (tmp_path / "edited_net.py").write_text(
        "from torch import nn\ndef build(input_shape, num_classes):\n"
        "    return nn.Linear(input_shape[0], num_classes)\n"
    )
    train = ["cluster=rivanna_a100", "model=custom", "model.target=edited_net:build"]
    out = hpcdl("train", *train, "run_dir=r", "--no-launch", "--no-preflight",
                env={"PYTHONPATH": str(tmp_path)})  # fmt: skip
    assert out.returncode == 0, out.stderr
    resume = ["resume", "r", "--no-preflight", "--dry-run"]
    quiet = hpcdl(*resume, env={"PYTHONPATH": str(tmp_path)})
    assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet.stderr
    with (tmp_path / "edited_net.py").open("a") as f:
        f.write("# fixed\n")
    told = hpcdl(*resume, env={"PYTHONPATH": str(tmp_path)})
    assert told.returncode == 0, told.stderr
    assert told.stderr == (
        f"warning: edited_net changed since {tmp_path / 'r' / 'code'} was frozen; its job runs "
        f"that frozen copy, not your edits (to run your edits: hpcdl resume {tmp_path / 'r'} "
        "--fresh-code)\n"
    )
    # evaluate/predict import the module here: from another folder, without PYTHONPATH,
    # they name the run's frozen copy (was a bare "cannot import 'edited_net'").
    (tmp_path / "elsewhere").mkdir()
    out = run_hpcdl("evaluate", str(tmp_path / "r"), cwd=tmp_path / "elsewhere")
    code = tmp_path / "r" / "code"
    assert out.returncode == 2 and out.stderr == (
        f"error: model.target='edited_net:build': cannot import 'edited_net' here; the run's "
        f"frozen copy is in {code}: PYTHONPATH={code} hpcdl evaluate {tmp_path / 'r'} ... (or "
        "your own checkout's folder)\n"
    ), out.stderr


def test_shell_variables_in_a_profile_reach_the_script_as_written(tmp_path) -> None:
    """`${USER}` in cluster.setup or cluster.env is the shell's: OmegaConf took it for an
    interpolation of a config key USER and failed with a 105-line traceback. Config
    interpolations (`${trainer.seed}`) still resolve; the run's config.yaml reads back."""
    from hpcdl.config.convert import load_config, save_config
    from hpcdl.launch.slurm import sbatch_text
    from hpcdl.rundir import RunDir

    site = tmp_path / "site" / "cluster"
    site.mkdir(parents=True)
    (site / "uni.yaml").write_text(
        "defaults:\n  - slurm\n  - _self_\nname: uni\n"
        "setup:\n  - export SCRATCH=/scratch/${USER}\n  - echo seed ${trainer.seed}\n"
        "env:\n  TMPDIR: /tmp/${USER}\n"
    )
    cfg = compose_config(["cluster=uni", "trainer.seed=7"], [str(tmp_path / "site")])
    assert cfg.cluster.setup == ["export SCRATCH=/scratch/${USER}", "echo seed 7"]
    assert cfg.cluster.env["TMPDIR"] == "/tmp/${USER}"
    script = sbatch_text(cfg, RunDir(tmp_path / "r"))
    assert "\nexport SCRATCH=/scratch/${USER}\n" in script and "\necho seed 7\n" in script
    save_config(cfg, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert again.cluster.setup == cfg.cluster.setup and again.cluster.env == cfg.cluster.env
    # On the command line too.
    line = compose_config(["cluster=slurm", "cluster.setup=['export A=/s/${SLURM_JOB_ID}']"])
    assert line.cluster.setup == ["export A=/s/${SLURM_JOB_ID}"]


def test_a_list_of_partitions_is_checked_as_sbatch_takes_it(monkeypatch) -> None:
    """cluster.partition='gpu,cpu' (the job starts in whichever runs it first) was refused as
    'no such partition'; each must exist, and one must be able to run the request."""
    from hpcdl.config.validate import ConfigError
    from hpcdl.launch import preflight

    answers = {
        "scontrol": "PartitionName=cpu Default=YES MaxTime=01:00:00 Nodes=n1\n"
        "PartitionName=gpu Default=NO MaxTime=01:00:00 Nodes=n1\n",
        "gpu": "n1|gpupod|gpu:a100:4|8|7800\n",
        "cpu": "n1|(null)|(null)|8|7800\n",
    }

    def run(cmd: list[str]) -> str:
        return answers["scontrol" if cmd[0] == "scontrol" else cmd[cmd.index("-p") + 1]]

    monkeypatch.setattr(preflight, "_run", run)
    cluster = compose_config(["cluster=devcluster", "cluster.partition='gpu,cpu'"]).cluster
    assert preflight.check_request(cluster) == "gpu,cpu"
    cluster.partition = "gpu,nope"
    with pytest.raises(ConfigError, match=r"^cluster.partition='gpu,nope': no partition 'nope';"):
        preflight.check_request(cluster)
    cluster.partition, cluster.gpus_per_node = "cpu,gpu", 5
    with pytest.raises(ConfigError) as info:
        preflight.check_request(cluster)
    assert str(info.value).endswith("(and none of cluster.partition='cpu,gpu' can)")


def test_a_program_found_by_name_under_export_none_is_warned_about(hpcdl, tmp_path) -> None:
    # A site's --export=NONE: the job's PATH is the node's, so `python` there is not this
    # shell's venv, and a script importing from the venv failed on the node, unwarned.
    (tmp_path / "t.py").write_text("print('hi')\n")
    base = ["run", "cluster=devcluster", "+cluster.sbatch_extra.export=NONE", "--no-preflight"]
    out = hpcdl(*base, "--dry-run", "--", "python", "t.py")
    assert out.returncode == 0, out.stderr
    assert "warning: --export=NONE: the job finds `python` on the node's PATH" in out.stderr
    activated = hpcdl(
        *base, "cluster.setup=[source /opt/venv/bin/activate]", "--dry-run", "--", "python", "t.py"
    )
    assert activated.returncode == 0 and "--export=NONE" not in activated.stderr
    train = hpcdl("train", *base[1:], "--dry-run")  # its interpreter is an absolute path
    assert train.returncode == 0 and "--export=NONE" not in train.stderr


def test_a_target_not_importable_here_is_refused_unless_the_job_sets_up_its_own(
    tmp_path, monkeypatch, capsys
) -> None:
    """It was a warning, then a submission whose job failed after its queue wait: the job
    runs this Python, without the shell's PYTHONPATH (a user trial's `mylm` module)."""
    from hpcdl.cli.main import main

    monkeypatch.chdir(tmp_path)
    user = ["model=custom", "model.target=absent_lab.nets:Net", "cluster=devcluster"]
    assert main(["train", *user, "run_dir=r", "--no-preflight"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "error: model.target='absent_lab.nets:Net': module 'absent_lab' is not importable here"
    ), err
    assert "put its folder on PYTHONPATH" in err and len(err.splitlines()) == 1
    assert main(["train", *user, "--dry-run", "--no-preflight"]) == 2
    assert not (tmp_path / "r").exists()
    capsys.readouterr()
    (tmp_path / "absent_lab").mkdir()  # here, but not on PYTHONPATH: said so
    (tmp_path / "absent_lab" / "__init__.py").write_text("")
    assert main(["train", *user, "--dry-run", "--no-preflight"]) == 2
    said = f"it is in this folder ({tmp_path / 'absent_lab'}), which is not on PYTHONPATH"
    assert f"{said}: run PYTHONPATH=. hpcdl ..., or set up" in capsys.readouterr().err
    # The job's own environment (module load, conda activate) may have it: warned, also
    # in the dry run, which goes on.
    setup = "cluster.setup=[source /opt/lab/env.sh]"
    assert main(["train", *user, setup, "--dry-run", "--no-preflight"]) == 0
    out = capsys.readouterr().out
    assert "# warning: model.target='absent_lab.nets:Net': module 'absent_lab' is not" in out


PROBED_TASK = """
import torch


def vector_loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y, reduction="none"), {}
"""


def test_probe_runs_ones_code_here_before_a_slurm_submission(
    tmp_path, monkeypatch, capsys
) -> None:
    """A login node runs none of the user's code, so a broken loss failed in the job after
    its queue wait (a user trial's); `--probe` runs it on one batch here, and the dry run
    says whether it ran."""
    from hpcdl.cli.main import main

    (tmp_path / "probedtask.py").write_text(PROBED_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    user = ["task=custom", "task.target=probedtask:vector_loss", "cluster=devcluster"]
    assert main(["train", *user, "--dry-run", "--no-preflight"]) == 0
    out = capsys.readouterr().out
    assert "# your code: not run here (a login node imports no torch); --probe runs" in out
    for extra in (["run_dir=r"], ["--dry-run"], ["-m", "optim.lr=0.1,0.01"]):
        assert main(["train", *user, *extra, "--probe", "--no-preflight"]) == 2, extra
        err = capsys.readouterr().err
        assert "task.target='probedtask:vector_loss': the loss is (" in err, err
        assert len(err.splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["probedtask.py"]  # nothing made
    fixed = ["task.target=probedfix:mean_loss"]  # a module of its own: not imported yet
    (tmp_path / "probedfix.py").write_text(
        "from probedtask import vector_loss\n\n\ndef mean_loss(model, batch):\n"
        "    loss, metrics = vector_loss(model, batch)\n    return loss.mean(), metrics\n"
    )
    assert main(["train", *user, *fixed, "--dry-run", "--probe", "--no-preflight"]) == 0
    assert "# your code: ran on one batch here (--probe)\n" in capsys.readouterr().out


CUDA_NET = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(30, 2)

    def forward(self, x):
        return self.fc(x * torch.ones(x.shape[1], device="cuda"))
"""


def test_a_model_that_asks_for_cuda_itself_is_probed_up_to_there_where_ranks_get_gpus(
    tmp_path, monkeypatch, capsys
) -> None:
    """The probe runs on this machine's CPU: a model that puts a tensor on 'cuda' itself
    fails there but not on the job's GPUs, so a run that trains on GPUs is warned (and goes
    on); one that trains on the CPU would fail as the probe did, and is refused."""
    from hpcdl.cli.main import main

    (tmp_path / "cudanet.py").write_text(CUDA_NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    user = ["model=custom", "model.target=cudanet:Net", "cluster=devcluster", "--no-preflight"]
    gpus = ["cluster.gpus_per_node=1", "--dry-run", "--probe"]
    assert main(["train", *user, *gpus]) == 0
    captured = capsys.readouterr()
    [warning] = captured.err.splitlines()
    assert warning == (
        "warning: model.target='cudanet:Net': checked up to its first use of CUDA: on this "
        "machine's CPU the first training batch raised AssertionError: Torch not compiled with "
        "CUDA enabled; the job's ranks run it on their GPUs"
    ), warning
    assert "# your code: ran here (--probe) until it asked for CUDA itself" in captured.out
    for cpu in (["cluster.gpus_per_node=0", "--dry-run", "--probe"], [*gpus, "trainer.device=cpu"]):
        assert main(["train", *user, *cpu]) == 2, cpu
        [error] = capsys.readouterr().err.splitlines()
        assert error.startswith("error: model.target='cudanet:Net': the first training batch failed")
        assert error.endswith(
            "take the device from the inputs, e.g. torch.zeros(n, device=x.device); this run "
            "trains on the CPU)"
        ), error
    local = ["model=custom", "model.target=cudanet:Net", "run_dir=r"]  # cluster=debug here
    assert main(["train", *local]) == 2
    assert "this run trains on the CPU" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cudanet.py"]


def test_submit_probe_true_refuses_a_broken_loss_before_the_run_dir(tmp_path, monkeypatch) -> None:
    import hpcdl
    from hpcdl.errors import ConfigError

    (tmp_path / "probedapi.py").write_text(PROBED_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    user = ["task=custom", "task.target=probedapi:vector_loss", "cluster=devcluster", "run_dir=r"]
    with pytest.raises(ConfigError, match=r"the loss is \("):
        hpcdl.submit(user, preflight=False, probe=True)
    with pytest.raises(ConfigError, match=r"trial 0 .*the loss is \("):
        hpcdl.submit_sweep([*user[:3], "optim.lr=0.1,0.01"], preflight=False, probe=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["probedapi.py"]
