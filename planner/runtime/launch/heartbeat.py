"""Heartbeats of the ranks and the launcher's step watchdog: a hung rank ends its attempt.

A rank that hangs (stopped, deadlocked in a collective, a wedged device) stalls every other
rank at the next collective, and torch's process group waits its default 30 minutes before
anything fails. ``fxplan launch`` watches the steps instead:

* every rank writes ``DIR/rank-R`` (``DIR``: :data:`STATUS_DIR_ENV`, a directory the launcher
  makes on its own node) as ``"<step> <phase>"`` — ``start`` when the process begins,
  ``step`` after each optimizer step, ``save`` while a checkpoint is written, ``end`` after the
  last step (:class:`Heartbeat`);
* the launcher polls the files of its node (:class:`StepWatch`): a rank in phase ``step`` whose
  file is older than the step timeout ``τ`` has not finished its next step in ``τ`` seconds.
  The attempt is then ended (every process of it) and, under ``--max-restarts``, restarted
  from the newest checkpoint.

Phases ``start`` (imports, building and loading the model, the first step) and ``save`` are not
timed by the watchdog: they take as long as the model and the file system need, and a hang
there still ends at the process group's timeout. Every rank of a node beats, so each node's
launcher sees a stall anywhere (a stalled rank stalls all others at their next collective).

The default ``τ`` is ``max(τ_min, k · T_pred)`` with ``T_pred`` the plan's predicted step time,
``k`` = :data:`DEFAULT_FACTOR` and ``τ_min`` = :data:`MIN_TIMEOUT_S`: the floor covers what the
prediction does not price (a logging step's extra all-reduce, Python's garbage collector, a
busy host, a slow file system for ``metrics.jsonl``). ``fxplan launch --step-timeout S`` sets it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["STATUS_DIR_ENV", "DEFAULT_FACTOR", "MIN_TIMEOUT_S", "Heartbeat", "StepWatch",
           "default_step_timeout"]

#: The environment variable naming the launcher's status directory (heartbeats, error reports).
STATUS_DIR_ENV = "FXPLAN_STATUS_DIR"
#: ``k``: the default timeout is this many predicted step times …
DEFAULT_FACTOR = 5.0
#: … and at least this many seconds.
MIN_TIMEOUT_S = 60.0
#: Phases the watchdog times.
WATCHED = frozenset({"step"})


def default_step_timeout(predicted_step_s: float | None) -> float:
    """``max(τ_min, k · T_pred)`` (module docstring); ``τ_min`` without a prediction."""
    if predicted_step_s is None or not predicted_step_s > 0:
        return MIN_TIMEOUT_S
    return max(MIN_TIMEOUT_S, DEFAULT_FACTOR * float(predicted_step_s))


class Heartbeat:
    """One rank's heartbeat file; does nothing outside ``fxplan launch`` (no status dir)."""

    def __init__(self, rank: int, directory: str | None = None) -> None:
        directory = directory if directory is not None else os.environ.get(STATUS_DIR_ENV)
        self.path = Path(directory) / f"rank-{rank}" if directory else None

    def beat(self, step: int, phase: str) -> None:
        """Record that this rank is at ``step`` in ``phase`` (one small write; a failure to
        write is ignored: the watchdog must never be what stops training)."""
        if self.path is None:
            return
        try:
            with open(self.path, "w") as handle:
                handle.write(f"{step} {phase}\n")
        except OSError:
            pass


@dataclass(frozen=True)
class Stall:
    """Ranks whose last finished step is older than the timeout."""

    ranks: tuple[int, ...]
    step: int
    idle_s: float
    timeout_s: float

    def describe(self) -> str:
        who = ", ".join(map(str, self.ranks))
        return (f"rank(s) {who} finished no step for {self.idle_s:.0f} s after step {self.step} "
                f"(step timeout {self.timeout_s:g} s, --step-timeout): a rank is hung")


class StepWatch:
    """The launcher's view of its node's heartbeats (module docstring)."""

    def __init__(self, directory: str | Path, timeout_s: float) -> None:
        self.dir, self.timeout_s = Path(directory), float(timeout_s)

    def clear(self) -> None:
        """Forget the previous attempt's beats (a new attempt starts)."""
        for path in self.dir.glob("rank-*"):
            path.unlink(missing_ok=True)

    def stalled(self, now: float | None = None) -> Stall | None:
        """The ranks in a timed phase whose file is older than the timeout, else ``None``."""
        now = time.time() if now is None else now
        late: list[tuple[int, int, float]] = []
        for path in self.dir.glob("rank-*"):
            try:
                text = path.read_text().split()
                age = now - path.stat().st_mtime
                rank, step = int(path.name[5:]), int(text[0])
            except (OSError, ValueError, IndexError):
                continue  # being rewritten, or cut: read again at the next poll
            if len(text) > 1 and text[1] in WATCHED and age > self.timeout_s:
                late.append((rank, step, age))
        if not late:
            return None
        step = min(s for _, s, _ in late)
        ranks = tuple(sorted(r for r, s, _ in late if s == step))
        return Stall(ranks, step, max(a for _, _, a in late), self.timeout_s)
