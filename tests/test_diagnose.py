"""hpcdl.launch.diagnose: the rank that made a job fail, read from logs like submitit's."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.launch.diagnose import describe, root_cause

PEER = (
    "[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:4242\n"
)


def logs(tmp_path: Path, job_id: str, texts: dict[int, str]) -> Path:
    for task, text in texts.items():
        (tmp_path / f"{job_id}_{task}_log.out").write_text(text)
    return tmp_path


def test_the_rank_with_an_error_of_its_own_is_named_not_the_peers_that_lost_it(
    tmp_path: Path,
) -> None:
    folder = logs(tmp_path, "77", {0: PEER, 1: "Traceback ...\nValueError: bad shape\n", 2: PEER})
    assert root_cause(folder, "77") == (1, "ValueError: bad shape")
    assert describe(root_cause(folder, "77")) == "rank 1: ValueError: bad shape"


def test_a_stall_is_the_cause_even_when_peers_report_errors(tmp_path: Path) -> None:
    stalled = "hpcdl: rank 3 made no progress for 31 s (phase step); dumping stacks\n"
    folder = logs(tmp_path, "5", {0: "ValueError: later\n", 3: stalled})
    rank, detail = root_cause(folder, "5") or (None, "")
    assert rank == 3 and detail.startswith("stalled: rank 3 made no progress for 31 s")
    assert "its stacks" not in detail  # none followed the line (a shell script's stall)
    dumped = stalled + 'Thread 0x7f (most recent call first):\n  File "x.py", line 3 in f\n'
    (tmp_path / "dumped").mkdir()
    folder = logs(tmp_path / "dumped", "5", {3: dumped})
    assert (root_cause(folder, "5") or (0, ""))[1].endswith("(its stacks are in its log)")


def test_a_rank_killed_without_a_word_is_named(tmp_path: Path) -> None:
    folder = logs(tmp_path, "9", {0: PEER, 1: "epoch 1 step 5\n"})
    rank, detail = root_cause(folder, "9") or (None, "")
    assert rank == 1 and detail.startswith("ended without an error of its own")


def test_an_hpcdl_run_program_s_exit_status_is_its_rank_s_cause_not_the_peers_it_ended(
    tmp_path: Path,
) -> None:
    # Before: "no error in the ranks' logs" (sys.exit("...") prints no error line).
    ended = (
        "step 3\nhpcdl: rank 1's program exited with status 7: ending this rank's program "
        "(SIGTERM, SIGKILL after 10 s)\nhpcdl: the program ended with status 143, after "
        "rank 1's had failed\n"
    )
    failed = "step 3\nno shard 1 in /data\nhpcdl: the program exited with status 7\n"
    folder = logs(tmp_path, "31", {0: ended, 1: failed, 2: ended})
    assert root_cause(folder, "31") == (1, "the program exited with status 7: no shard 1 in /data")
    silent = logs(tmp_path, "32", {0: "hpcdl: the program exited with status 9\n"})
    assert root_cause(silent, "32") == (0, "the program exited with status 9")
    # Killed by a signal: named, not the last line it wrote before (an FSDP warning's, say).
    killed = "step 3\n  output = self._register_pre_backward_hook(output)\nhpcdl: the program exited with status 137\n"
    assert root_cause(logs(tmp_path, "33", {0: ended, 1: killed}), "33") == (
        1,
        "the program was killed by SIGKILL (status 137: kill -9, or the kernel's "
        "out-of-memory killer)",
    )


def test_a_long_lost_peer_error_is_cut_between_words() -> None:
    """The cause `hpcdl status` shows is cut at a space with ' ...', not mid-word ('Conne')."""
    from hpcdl.launch.diagnose import clipped

    long = PEER.strip() * 3
    cut = clipped(long, 120)
    assert cut.endswith(" ...") and len(cut) <= 124
    kept = cut.removesuffix(" ...")
    assert long.startswith(kept) and not long[len(kept)].isalnum()  # not mid-word
    assert clipped("short", 120) == "short"
    assert clipped("x" * 150, 120) == "x" * 120 + " ..."  # one word: cut where it must be


def test_a_job_that_died_before_python_names_the_first_error_line(tmp_path: Path) -> None:
    folder = logs(tmp_path, "12", {0: "loading modules\n/bin/bash: pyth0n: command not found\n"})
    assert root_cause(folder, "12") == (0, "/bin/bash: pyth0n: command not found")


def test_an_interpreter_srun_could_not_start_is_named_with_the_key_that_chose_it(
    tmp_path: Path,
) -> None:
    """cluster.python (or the login node's own interpreter) missing on the node: slurmstepd's
    line, read as the interpreter, the node and why, with the key to fix."""
    text = (
        "slurmstepd-n1: error: execve(): /nonexistent/python3: No such file or directory\n"
        "srun: error: n1: task 0: Exited with exit code 2\n"
    )
    rank, cause = root_cause(logs(tmp_path, "33", {0: text}), "33") or (None, "")
    assert rank == 0
    assert cause.startswith(
        "could not start /nonexistent/python3 on n1 (No such file or directory); "
        "set cluster.python to an interpreter the compute nodes have"
    ), cause
    # Another program (a container runtime) is named without the interpreter's advice.
    text = "slurmstepd-n2: error: execve(): apptainer: No such file or directory\n"
    assert root_cause(logs(tmp_path, "34", {0: text}), "34") == (
        0,
        "could not start apptainer on n2 (No such file or directory)",
    )


def test_array_tasks_and_other_jobs_logs_are_kept_apart(tmp_path: Path) -> None:
    folder = logs(tmp_path, "40_3", {0: "KeyError: 'x'\n"})
    logs(tmp_path, "40_31", {0: "OSError: other task\n"})
    logs(tmp_path, "41", {0: "OSError: other job\n"})
    assert root_cause(folder, "40_3") == (0, "KeyError: 'x'")
    assert root_cause(folder, "42") is None


def test_a_rank_that_timed_out_in_a_collective_is_named_before_those_that_lost_it(
    tmp_path: Path,
) -> None:
    waited = (
        "[rank{}]: RuntimeError: [../unbound_buffer.cc:78] Timed out waiting 10000ms for recv\n"
    )
    folder = logs(tmp_path, "3", {0: PEER, 1: waited.format(1)})
    rank, detail = root_cause(folder, "3") or (None, "")
    assert rank == 1 and detail.startswith("hung in a collective until its timeout")
    # Both timed out: rank 0 in the step's own all-reduce, rank 1 in a barrier of its own.
    in_step = 'Traceback (most recent call last):\n  File "trainer.py", line 207, in train_step\n'
    in_hook = 'Traceback (most recent call last):\n  File "hook.py", line 4, in after_step\n'
    folder = logs(tmp_path, "4", {0: in_step + waited.format(0), 1: in_hook + waited.format(1)})
    assert (root_cause(folder, "4") or (None, ""))[0] == 1
    # Rank 2 timed out first and left: rank 1, still in its barrier, lost a peer instead.
    lost = in_hook + PEER.replace("rank0", "rank1")
    folder = logs(
        tmp_path, "6", {0: in_step + waited.format(0), 1: lost, 2: in_step + waited.format(2)}
    )
    rank, detail = root_cause(folder, "6") or (None, "")
    assert rank == 1 and detail.startswith("hung in a collective until its timeout")


def test_a_task_srun_saw_die_of_a_signal_is_named_with_its_own_last_fatal_line(
    tmp_path: Path,
) -> None:
    # Every rank finished its work; srun's line lands in the batch log (rank 0's).
    done = "epoch 5/5: train_loss 0.35\nsubmitit INFO - Job completed successfully\n"
    folder = logs(
        tmp_path,
        "72",
        {
            0: done + "srun: error: n2: task 3: Aborted\n",
            1: done,
            2: done,
            3: done + "terminate called without an active exception\n",
        },
    )
    assert describe(root_cause(folder, "72")) == (
        "rank 3: died of Aborted on n2: terminate called without an active exception"
    )


def test_a_task_killed_without_a_word_is_named_from_sruns_line(tmp_path: Path) -> None:
    folder = logs(tmp_path, "74", {0: PEER + "srun: error: n1: task 1: Killed\n", 1: "epoch 1\n"})
    assert root_cause(folder, "74") == (1, "died of Killed on n1")


def test_a_task_that_exited_non_zero_is_left_to_its_own_error(tmp_path: Path) -> None:
    folder = logs(
        tmp_path,
        "73",
        {0: "srun: error: n1: task 1: Exited with exit code 1\n", 1: "KeyError: 'lr'\n"},
    )
    assert root_cause(folder, "73") == (1, "KeyError: 'lr'")


def test_of_several_tasks_srun_saw_die_the_one_without_an_error_of_its_own_is_named(
    tmp_path: Path,
) -> None:
    batch = PEER + "srun: error: n1: task 2: Killed\nsrun: error: n2: task 3: Segmentation fault\n"
    folder = logs(
        tmp_path,
        "75",
        {0: batch, 2: PEER, 3: "step 7\nFatal Python error: Segmentation fault\n"},
    )
    assert root_cause(folder, "75") == (
        3,
        "died of Segmentation fault on n2: Fatal Python error: Segmentation fault",
    )


def test_ranks_are_read_in_rank_order_past_nine(tmp_path: Path) -> None:
    """Rank 2's own error comes before rank 10's (the logs' names sort 10 first)."""
    folder = logs(tmp_path, "5", {10: "ValueError: ten\n", 2: "ValueError: two\n"})
    assert root_cause(folder, "5") == (2, "ValueError: two")


WAITING_STALL = (
    "hpcdl: rank {} made no progress for 1800s in 'waiting for the other ranks (step sums)' "
    "(allowance 1800s, trainer.stall_timeout_s); stacks of every thread follow\n"
)


def test_with_nccl_a_rank_stalled_waiting_is_named_after_the_rank_that_failed(tmp_path) -> None:
    """NCCL gives a rank waiting for a failed or dead peer no error of its own: its
    watchdog's stall (while waiting for the others) is a consequence."""
    a, b, c, d = (tmp_path / name for name in "abcd")
    for folder in (a, b, c, d):
        folder.mkdir()
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    assert root_cause(logs(a, "5", {0: WAITING_STALL.format(0), 1: oom}), "5") == (1, oom.strip())
    hung = "hpcdl: rank 2 made no progress for 1800s in 'training' (allowance 1800s, x); s\n"
    rank, detail = root_cause(logs(b, "6", {0: WAITING_STALL.format(0), 2: hung}), "6") or (0, "")
    assert rank == 2 and "in 'training'" in detail
    rank, detail = root_cause(logs(c, "7", {0: WAITING_STALL.format(0), 1: "step 3\n"}), "7") or (
        0,
        "",
    )
    assert rank == 1 and detail.startswith("ended without an error of its own")
    both = {3: WAITING_STALL.format(3), 1: WAITING_STALL.format(1)}
    rank, detail = root_cause(logs(d, "8", both), "8") or (0, "")
    assert rank == 1 and "waiting for the other ranks" in detail


def test_slurms_banner_of_an_earlier_requeue_is_no_cause(tmp_path: Path) -> None:
    # A job requeued once (by its own time-limit stop) keeps the first attempt's banner in
    # its log; the run then stopped itself again: nothing in the log is an error.
    banner = "slurmstepd-n1: error: *** STEP 11.0 ON n1 CANCELLED AT 2026-11-25T22:00:01 DUE TO JOB REQUEUE ***\n"
    folder = logs(tmp_path, "11", {0: f"epoch 1 step 5\n{banner}stopped by SIGUSR2\n"})
    assert root_cause(folder, "11") is None


def test_status_names_no_cause_for_a_job_that_stopped_itself(tmp_path: Path) -> None:
    import json

    from hpcdl.launch.monitor import stopped_itself
    from hpcdl.rundir import RunDir

    def ended(reason: str, job_id: str = "11") -> RunDir:
        end = {"event": "end", "job_id": job_id, "reason": reason, "action": "not requeued"}
        (tmp_path / "attempts.jsonl").write_text(json.dumps(end) + "\n")
        return RunDir(tmp_path)

    assert stopped_itself(ended("timeout"), "11")
    assert not stopped_itself(ended("failed"), "11")
    assert not stopped_itself(ended("timeout", job_id="10"), "11")  # an earlier job's end


def test_the_terminal_folds_a_traceback_of_a_lost_peer_into_one_line(tmp_path, capsys) -> None:
    """cluster=local echoes rank 0's log: when rank 0 only lost the rank that failed, its
    40-line gloo traceback came before the cause; now one line, the log keeps it all."""
    from hpcdl.launch.logtail import LineEcho

    log = tmp_path / "7_0_log.out"
    lost = [
        "submitit ERROR (2026-11-27 07:47:31,976) - Submitted job triggered an exception\n",
        "Traceback (most recent call last):\n",
        '  File "/x/trainer.py", line 355, in train_step\n',
        "    out.loss_sum.backward()\n",
        "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:950. This is ...\n",
    ]
    own = [
        "Traceback (most recent call last):\n",
        '  File "/x/build.py", line 3, in build\n',
        "ValueError: rank 0's own bug\n",
    ]
    log.write_text("epoch 1/3 ...\n" + "".join(lost[:3]))  # a traceback being written
    echo = LineEcho(log, hidden=b"submitit INFO (", fold_peer_loss=True)
    echo.poll()
    assert capsys.readouterr().out == "epoch 1/3 ...\n"  # held until its last line
    with log.open("a") as f:
        f.write("".join(lost[3:] + own) + "partial")
    echo.poll()
    assert capsys.readouterr().out == (
        "rank 0 stopped: it lost another rank (RuntimeError: ...Connection closed by "
        f"peer...); the cause, that rank's error, follows (rank 0's traceback: {log})\n"
        + "".join(own)
    )
    echo.poll(final=True)
    assert capsys.readouterr().out == "partial"
    assert log.read_text().count("Traceback") == 2  # the log keeps everything
    plain = LineEcho(log, hidden=b"submitit INFO (")  # Slurm's and the others: as written
    plain.poll(final=True)
    assert capsys.readouterr().out == log.read_text()

    # hpcdl's own one-line error (a save on a full disk): the launcher says it once, as
    # `error: ...`; the terminal showed it twice.
    full = tmp_path / "8_0_log.out"
    full.write_text(
        "epoch 1/2 ...\n"
        "submitit ERROR (2026-11-27 17:13:43,559) - Submitted job triggered an exception\n"
        "hpcdl.errors.CheckpointError: /r/checkpoints/step_13.pt: checkpoint not saved: ENOSPC\n"
    )
    LineEcho(full, hidden=b"submitit INFO (", fold_peer_loss=True).poll(final=True)
    assert capsys.readouterr().out == "epoch 1/2 ...\n"


def test_a_program_not_found_is_the_cause_not_a_setup_line_the_script_let_fail(
    tmp_path: Path,
) -> None:
    # `module purge || true` left a shell error first; the cause is hpcdl's own line.
    text = (
        "/var/spool/slurmd/job00061/slurm_script: line 26: module: command not found\n"
        "hpcdl: 'mytool' is not found in the job's environment (PATH)\n"
    )
    folder = logs(tmp_path, "61", {0: text})
    assert root_cause(folder, "61") == (
        0,
        "'mytool' is not found in the job's environment (PATH)",
    )


class _NoLabels:
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> dict:
        return {}["labels"]


def test_an_error_in_a_dataloader_worker_is_kept_as_raised_there() -> None:
    """The end record (hpcdl status's last_end) said `KeyError: Caught KeyError in
    DataLoader worker process 0.`, torch's wrapping, not the error (a user trial's)."""
    import torch.utils.data

    from hpcdl.launch.diagnose import error_line

    loader = torch.utils.data.DataLoader(_NoLabels(), num_workers=1)
    with pytest.raises(KeyError) as caught:
        next(iter(loader))
    assert error_line(caught.value) == "KeyError: 'labels'"
    assert error_line(ValueError("bad sample 17\nmore")) == "ValueError: bad sample 17"
