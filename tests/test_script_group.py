"""hpcdl.script_group: rank 0's wrapper tells a program with several ranks that never joins
a process group (each rank runs the whole program on its own) from one that does, by the
listening sockets of the program's processes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdl import script_group
from hpcdl.script_group import GroupWatch

# Listens in a child process of the program, as torch's store or gloo may: the session counts.
LISTENS = """\
import socket, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", '''
import socket, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
print("up", flush=True); time.sleep(60)
'''], stdout=subprocess.PIPE, text=True)
print(child.stdout.readline(), end="", flush=True); time.sleep(60)
"""
# Talks to nobody: the plain single-process script started as several ranks.
ALONE = "import socket, time\nc = socket.socket()\nprint('up', flush=True)\ntime.sleep(60)\n"


def _start(code: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    return proc


def _end(proc: subprocess.Popen) -> None:
    import os
    import signal

    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_a_program_whose_session_listens_has_joined(monkeypatch, capsys) -> None:
    monkeypatch.setattr(script_group, "CHECK_EVERY_S", 0.0)
    monkeypatch.setattr(script_group, "GROUP_HINT_S", 0.0)
    monkeypatch.setattr(script_group, "NOTE_MIN_S", 0.0)
    proc = _start(LISTENS)
    try:
        watch = GroupWatch(proc.pid, world_size=2)
        watch.poll()
    finally:
        _end(proc)
    assert watch.joined and watch.note() is None
    assert capsys.readouterr().out == ""


def test_a_program_that_listens_nowhere_is_pointed_out_once(monkeypatch, capsys) -> None:
    monkeypatch.setattr(script_group, "CHECK_EVERY_S", 0.0)
    monkeypatch.setattr(script_group, "GROUP_HINT_S", 0.3)
    proc = _start(ALONE)
    try:
        watch = GroupWatch(proc.pid, world_size=4)
        watch.poll()
        assert capsys.readouterr().out == ""  # not yet: before GROUP_HINT_S
        time.sleep(0.4)
        watch.poll()
        watch.poll()
    finally:
        _end(proc)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith(
        "hpcdl: note: rank 0's program has opened no network port in 0 s: it seems not to "
        "join a process group (torch.distributed.init_process_group), so each of the 4 ranks "
        "runs the whole program on its own"
    ), out
    assert "cluster.tasks_per_node=1 cluster.nodes=1" in out
    assert watch.note() is None  # said once


def test_at_the_end_only_a_program_that_ran_long_enough_is_pointed_out(monkeypatch) -> None:
    proc = _start(ALONE)
    try:
        watch = GroupWatch(proc.pid, world_size=2)
        watch.poll()
        assert watch.note() is None  # a short run: a group may have come and gone unseen
        monkeypatch.setattr(script_group, "NOTE_MIN_S", 0.0)
        note = watch.note()
        assert note is not None and "opened no network port while it ran" in note
        assert GroupWatch(proc.pid, world_size=1).note() is None  # one rank: nothing to join
    finally:
        _end(proc)


def test_without_proc_nothing_is_said(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(script_group, "NOTE_MIN_S", 0.0)
    assert script_group.listening_inodes(tmp_path) is None
    watch = GroupWatch(1, world_size=2, proc=tmp_path)
    watch.poll()
    assert watch.joined and watch.note() is None


@pytest.mark.timeout(180)
def test_a_ddp_program_that_runs_past_the_note_threshold_gets_no_note(hpcdl, tmp_path) -> None:
    # Long enough for the end-of-run note (NOTE_MIN_S): its absence shows the wrapper saw
    # the program's group (gloo's store on MASTER_PORT) while it ran.
    (tmp_path / "ddp.py").write_text(
        "import time, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        f"time.sleep({script_group.NOTE_MIN_S + 0.5})\n"
        "dist.barrier()\n"
        "dist.destroy_process_group()\n"
    )
    out = hpcdl(
        "run", "cluster=local", "cluster.tasks_per_node=2", "run_dir=r", "--", "python", "ddp.py"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    logs = "".join(p.read_text() for p in (tmp_path / "r" / "logs").glob("*.[eo][ru][rt]"))
    assert "opened no network port" not in out.stdout + out.stderr + logs
