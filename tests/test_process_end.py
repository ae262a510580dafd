"""An `hpcdl` process whose command has finished leaves without the interpreter's teardown
(about a second after `import torch`), after what an exit must still do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PROGRAM = """
import atexit, sys, threading, time
import torch  # noqa: F401  (where the teardown is slow: hpcdl leaves without it)

out, how = sys.argv[1], sys.argv[2]


class AtTeardown:  # a module global: its __del__ runs in the interpreter's teardown only
    def __init__(self, path):
        self.path = path

    def __del__(self, open=open):  # builtins are gone by then
        with open(self.path, "w") as f:
            f.write("ran")


keep = AtTeardown(out + "/teardown")
atexit.register(lambda: open(out + "/atexit", "w").write("ran"))


def late():  # a non-daemon thread the exit must wait for (an async checkpoint write)
    time.sleep(0.5)
    with open(out + "/thread", "w") as f:
        f.write("ran")


threading.Thread(target=late).start()
print("unflushed", end="")
from hpcdl.cli.main import main

args = ["status", out + "/missing"]
if how == "given":  # called from Python with its arguments: Python's own exit
    sys.exit(main(args))
# main() of this process's command line: the `hpcdl` script's, or another program's (a
# notebook's kernel), which goes on after main() and so has Python's own exit
sys.argv = ["/venv/bin/hpcdl" if how == "own" else "/venv/bin/ipykernel_launcher.py", *args]
sys.exit(main())
"""


@pytest.mark.parametrize("how", ["own", "given", "other-program"])
def test_a_finished_command_leaves_after_threads_atexit_and_flush_without_the_teardown(
    tmp_path: Path, how: str
) -> None:
    program = tmp_path / "prog.py"
    program.write_text(PROGRAM)
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        [sys.executable, str(program), str(out), how], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr  # the command's status (no such run dir)
    assert done.stdout == "unflushed"  # the buffered output is flushed
    assert "neither a run dir nor a Slurm job id" in done.stderr
    assert (out / "thread").read_text() == "ran"  # the non-daemon thread ran to its end
    assert (out / "atexit").read_text() == "ran"  # the atexit handlers ran
    # The teardown: skipped where the command is the `hpcdl` process's own only.
    assert (out / "teardown").exists() == (how != "own")
