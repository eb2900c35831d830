"""A process that ends when the process that started it ends (Linux ``PR_SET_PDEATHSIG``).

``fxplan launch`` starts torchrun, and torchrun starts one worker per rank: CPU ranks forked
from the forkserver its agent starts (:mod:`~fxplan.runtime.launch.forked_workers`; the server
ends with the agent), GPU ranks (and any under ``FXPLAN_FORK_WORKERS=0``) each its own
interpreter in a session of its own
(torch's ``SubprocessHandler``: ``start_new_session=True``). A launcher that is killed
outright (SIGKILL, the OOM killer) runs no handler, so nothing would stop torchrun, and a
torchrun killed outright would leave its workers training on, orphaned (parent pid 1), still
writing the run directory. Two links close that chain:

* the launcher starts torchrun with :func:`parent_death_hook` as ``preexec_fn``: the kernel
  sends torchrun ``SIGTERM`` when the launcher dies (torchrun's own handler then stops its
  workers);
* every worker calls :func:`die_with_parent` with ``SIGKILL`` at start: it dies with its
  parent (torchrun, or the forkserver that ends with it), whatever ended torchrun.

The signal is sent when the *thread* that forked the child ends; both forks happen on the main
thread (the launcher's, torchrun's agent loop), which lives as long as the process. The race of a
parent that dies between the fork and the ``prctl`` is closed by comparing the parent pid after
the call with the one before the fork. Elsewhere than Linux there is no ``prctl``: both
functions do nothing there (and say so by their return value). Under Slurm, ``srun`` ends a
job step's processes itself; a worker still dies with its torchrun.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Callable

__all__ = ["die_with_parent", "parent_death_hook"]

PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, looked up now (not after a fork), or ``None`` off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        return None


def die_with_parent(signum: int, parent: int | None = None) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent ends. ``parent``: the
    pid the parent had (default: the current one); when the parent is already another (it died
    before the call) the process ends at once with ``signum``. Returns whether it is armed."""
    expected = os.getppid() if parent is None else parent
    prctl = _prctl()
    if prctl is None or prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        return False
    if os.getppid() != expected:  # the parent is gone already: no signal will come
        os.kill(os.getpid(), signum)
    return True


def parent_death_hook(signum: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen` that makes the child receive ``signum``
    when this process ends; ``None`` where that is not possible (no ``prctl``). Everything
    it needs is looked up before the fork."""
    prctl = _prctl()
    if prctl is None:
        return None
    launcher, sig = os.getpid(), int(signum)

    def hook() -> None:  # runs in the child between fork and exec
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != launcher:
            os._exit(128 + sig)

    return hook
