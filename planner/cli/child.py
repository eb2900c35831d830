"""Run a child process in the foreground: pass Ctrl-C on to it, take it along when killed, and
end it when its ranks stop stepping.

``fxplan launch`` runs torchrun as a child. A Ctrl-C typed at a terminal reaches both (same
process group), but a SIGINT sent to fxplan alone (a job scheduler, ``kill -INT``) would leave
torchrun and its ranks running. :func:`run_foreground` forwards the interrupt to the child,
waits up to ``grace_s`` seconds for it to stop (torchrun stops its ranks on SIGINT), kills it
after that, and raises ``KeyboardInterrupt`` so that the command exits with code 130 and one
line (:func:`fxplan.cli.main.interrupted`). A SIGKILL of fxplan runs no handler at all: the
child is started with a parent-death signal (:mod:`fxplan.runtime.launch.parent_death`), so the kernel
sends it SIGTERM when fxplan dies, and its ranks die with it. With a step watchdog
(:class:`~fxplan.runtime.launch.heartbeat.StepWatch`) a stalled step ends the child the same way as an
interrupt and is reported with ``say``.
"""

from __future__ import annotations

import signal
import subprocess
from typing import TYPE_CHECKING, Callable, Mapping, Sequence


if TYPE_CHECKING:  # pragma: no cover
    from fxplan.runtime.launch.heartbeat import StepWatch

__all__ = ["run_foreground"]


def _stop(child: subprocess.Popen, signum: int, grace_s: float) -> None:
    """Send ``signum`` to ``child``, wait ``grace_s`` seconds, then kill it."""
    if child.poll() is None:
        child.send_signal(signum)
    try:
        child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def run_foreground(cmd: Sequence[str], env: Mapping[str, str], *, grace_s: float = 30.0,
                   watch: "StepWatch | None" = None,
                   say: Callable[[str], None] = print) -> int:
    """``subprocess.call(cmd, env=env)`` that leaves no child behind on Ctrl-C, on fxplan's
    own death, or (``watch``) after a stalled step."""
    # here, not at the top: importing the runtime package imports torch, and ``fxplan --help``
    # and ``--version`` import every verb module
    from fxplan.runtime.launch.parent_death import parent_death_hook
    from fxplan.runtime.launch.supervisor import STALL_GRACE_S, wait_attempt

    child = subprocess.Popen(list(cmd), env=dict(env),
                             preexec_fn=parent_death_hook(signal.SIGTERM))
    try:
        stall = wait_attempt(child, watch)
    except KeyboardInterrupt:
        _stop(child, signal.SIGINT, grace_s)
        raise
    if stall is None:
        return child.returncode
    say(f"{stall.describe()}; ending the run (--max-restarts N restarts it from the newest "
        "checkpoint)")
    _stop(child, signal.SIGTERM, STALL_GRACE_S)  # its ranks die with it (parent death)
    return child.returncode or 1
