"""``fxplan.core.quick_exit.exit_now``: the exit status, the exit handlers and every written byte
as ``sys.exit`` leaves them, in a fresh interpreter each."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PROGRAM = """
import atexit, sys, threading, time
from fxplan.core.quick_exit import exit_now
out = open(sys.argv[1], "w", buffering=1 << 20)        # never flushed, never closed
out.write("x" * 5000)
atexit.register(lambda: open(sys.argv[1] + ".atexit", "w").write("ran"))
if sys.argv[3] == "thread":                            # a non-daemon thread still working
    threading.Thread(target=lambda: (time.sleep(0.5),
                                     open(sys.argv[1] + ".thread", "w").write("done"))).start()
print("last line", end="")                             # no newline: still in stdout's buffer
exit_now(eval(sys.argv[2]))
"""


def _run(tmp_path: Path, code: str, thread: str = "none") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path / "out.txt"), code,
                           thread], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("code, status", [("0", 0), ("3", 3), ("None", 0), ("-1", 255),
                                          ("258", 2)])
def test_the_status_handlers_and_buffers_are_as_sys_exit_leaves_them(tmp_path, code, status):
    done = _run(tmp_path, code)
    assert done.returncode == status, done.stderr
    assert done.stdout == "last line"
    assert (tmp_path / "out.txt").read_text() == "x" * 5000
    assert (tmp_path / "out.txt.atexit").read_text() == "ran"


def test_a_running_thread_is_waited_for_and_a_message_printed_as_sys_exit_does(tmp_path):
    done = _run(tmp_path, "3", thread="thread")
    assert done.returncode == 3 and (tmp_path / "out.txt.thread").read_text() == "done"
    assert (tmp_path / "out.txt").read_text() == "x" * 5000
    said = _run(tmp_path, "'no such plan'")
    assert said.returncode == 1 and said.stderr.strip() == "no such plan"
    assert (tmp_path / "out.txt.atexit").read_text() == "ran"
