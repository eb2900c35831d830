"""Ctrl-C and ``sys.exit`` in user files, in real processes: ``fxplan plan`` of a big search
interrupted with SIGINT ends with exit code 130 and one line, no traceback (also none from an
exit hook), and no child process left; a model file that calls ``sys.exit(0)`` is a user error
(exit 2), not a silent success."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

BIG = ["plan", "gpt3-175b", "--cluster", "dgx-a100-80g:nodes=128", "--batch", "1536"]


def _fxplan(*argv: str) -> list[str]:
    return [sys.executable, "-m", "fxplan.cli.main", *argv]


def _default_sigint() -> None:
    """In the child before it runs Python: SIGINT back to its default action. A shell that
    starts the test run in the background (``cmd &`` without job control) ignores SIGINT, its
    children inherit that, and Python then leaves it ignored: the interrupt these tests send
    would never arrive as a KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _children(pid: int) -> list[int]:
    """Live child processes of ``pid`` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry))
    return out


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc for child processes")
def test_sigint_during_a_search_exits_130_with_one_line():
    proc = subprocess.Popen(_fxplan(*BIG), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=_default_sigint,
                            text=True, env={**os.environ, "COLUMNS": "120"})
    # Wait until the search is running: torch imported, capture under way (the process has
    # read its modules); a guard against a hang only, not a timing assertion.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        with open(f"/proc/{proc.pid}/status") as status:
            rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
        if rss > 300_000:  # kB: torch and the model are loaded
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the search ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert "Traceback" not in err and "Traceback" not in out
    assert err.strip().splitlines()[-1] == "fxplan plan: interrupted"
    assert len([line for line in err.splitlines() if "interrupted" in line]) == 1
    assert _children(proc.pid) == []


def test_launch_forwards_sigint_to_its_child_and_leaves_none(tmp_path):
    """The torchrun child gets the SIGINT, is waited for, and fxplan exits 130."""
    from fxplan.cli.child import run_foreground

    script = tmp_path / "child.py"
    script.write_text("import signal, sys, time\n"
                      "signal.signal(signal.SIGINT, lambda *a: sys.exit(7))\n"
                      "print('ready', flush=True)\ntime.sleep(600)\n")
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import sys\nfrom fxplan.cli.child import run_foreground\nfrom fxplan.cli.main import interrupted\n"
        f"try:\n    run_foreground([sys.executable, {str(script)!r}], {{}})\n"
        "except KeyboardInterrupt:\n    sys.exit(interrupted('launch'))\n")
    proc = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    assert proc.stdout.readline().strip() == "ready"
    child = _children(proc.pid)
    assert len(child) == 1
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip() == "fxplan launch: interrupted", err
    assert not os.path.exists(f"/proc/{child[0]}") or _children(proc.pid) == []
    assert run_foreground  # imported in-process too: the module loads without a terminal


def test_user_model_file_that_exits_is_a_user_error(tmp_path):
    """In a real process (in-process cases of exit and raise are in test_cli.py)."""
    body, needle = "import sys\nsys.exit(0)\n", "sys.exit(0)"
    model = tmp_path / "model.py"
    model.write_text(body)
    done = subprocess.run(_fxplan("graph", f"{model}:build"), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2, done.stderr
    assert needle in done.stderr and str(model) in done.stderr
    assert "Traceback" not in done.stderr
