"""Run a child process in the foreground and pass Ctrl-C on to it.

``fxplan launch`` runs torchrun as a child. A Ctrl-C typed at a terminal reaches both (same
process group), but a SIGINT sent to fxplan alone (a job scheduler, ``kill -INT``) would leave
torchrun and its ranks running. :func:`run_foreground` forwards the interrupt to the child,
waits up to ``grace_s`` seconds for it to stop (torchrun stops its ranks on SIGINT), kills it
after that, and raises ``KeyboardInterrupt`` so that the command exits with code 130 and one
line (:func:`fxplan.cli.main.interrupted`).
"""

from __future__ import annotations

import signal
import subprocess
from typing import Mapping, Sequence

__all__ = ["run_foreground"]


def run_foreground(cmd: Sequence[str], env: Mapping[str, str], *, grace_s: float = 30.0) -> int:
    """``subprocess.call(cmd, env=env)`` that leaves no child behind on Ctrl-C."""
    child = subprocess.Popen(list(cmd), env=dict(env))
    try:
        return child.wait()
    except KeyboardInterrupt:
        if child.poll() is None:
            child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        raise
