"""fxplan supervising torchrun: restart a failed job as a fresh torchrun, up to N times.

Why not torchrun's own ``--max-restarts``: with torch 2.13 and gloo, the workers of the
restarted group fail in gloo's ``connectFullMesh`` (connection refused) and a second restart
hangs (a plain DDP script does the same). A *fresh* torchrun per attempt has none of
that state: a new agent, a new rendezvous store on a new port (single node: a free loopback
port) or a new rendezvous id (many nodes), new worker processes.

One attempt ``k = 0, 1, …``::

    env, argv = make_attempt(k)            # fresh port / rendezvous id, FXPLAN_ATTEMPT=k
    start argv in its own session          # its own process group: torchrun + every worker
    wait for it to end, or for a stalled step (:class:`~fxplan.runtime.launch.heartbeat.StepWatch`)
    kill what is left of the group         # SIGTERM, then SIGKILL after `grace_s`; verified
    exit code 0 → done; an input error reported by a worker → done (a restart would fail
    again); else, if k < max_restarts → log a `restart` event, attempt k + 1

torchrun runs with ``--max-restarts 0``: when one worker dies (SIGKILL, a crash, an OOM kill)
its agent stops the others and exits non-zero, which is what this loop sees. The workers of
attempt ``k + 1`` resume from the newest committed checkpoint in the run directory
(``fxplan.worker --auto-resume``) and, when the world they got is not the plan's, replan.
SIGINT/SIGTERM sent to the supervisor are passed to the group and end the job without a restart.
torchrun is started with a parent-death signal (:mod:`fxplan.runtime.launch.parent_death`): a supervisor
killed outright takes the attempt with it. A stalled step is logged as a ``stall`` event (the
ranks, their last step, the seconds without a step) before the attempt is ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from fxplan.runtime.checkpoint.manifest import newest_committed_step
from fxplan.runtime.train.events import EventLog
from fxplan.runtime.launch.heartbeat import Stall, StepWatch
from fxplan.runtime.launch.parent_death import parent_death_hook

__all__ = ["supervise", "last_logged_step", "group_members", "end_group", "wait_attempt"]

#: Seconds between two looks at a running attempt's heartbeats.
POLL_S = 0.5
#: Seconds a stalled attempt's torchrun gets to stop its workers before SIGKILL (a hung rank
#: does not answer SIGTERM; torchrun's own wait for it would be 30 s).
STALL_GRACE_S = 3.0

#: ``(environment added, argv)`` of attempt ``k``.
AttemptFactory = Callable[[int], "tuple[dict[str, str], list[str]]"]


def last_logged_step(run_dir: str | Path) -> int | None:
    """The highest ``step`` in ``run_dir/metrics.jsonl`` (``None`` when nothing is logged)."""
    path = Path(run_dir) / "metrics.jsonl"
    steps = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                steps.append(int(json.loads(line)["step"]))
            except (ValueError, KeyError, TypeError, RecursionError):
                continue  # a line cut by the crash
    return max(steps, default=None)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``, read from ``/proc``; where there
    is no ``/proc``, ``[pgid]`` while ``killpg(pgid, 0)`` finds the group, else ``[]``."""
    if not os.path.isdir("/proc"):  # pragma: no cover - Linux here
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except (ProcessLookupError, PermissionError):
            return []
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:  # state, ppid, pgrp
            found.append(int(entry))
    return found


def end_group(pgid: int, grace_s: float = 10.0) -> list[int]:
    """SIGTERM every process of group ``pgid``, SIGKILL what is left after ``grace_s``; returns
    the pids that survived both (empty when the group is gone)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if not group_members(pgid):
            return []
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return []
        deadline = time.monotonic() + wait_s
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
    return group_members(pgid)


def wait_attempt(proc: subprocess.Popen, watch: StepWatch | None,
                 poll_s: float = POLL_S) -> Stall | None:
    """Wait until ``proc`` ends (``None``) or ``watch`` sees a stalled step (the
    :class:`Stall`; ``proc`` is left running for the caller to end)."""
    while True:
        try:
            proc.wait(timeout=poll_s if watch is not None else None)
            return None
        except subprocess.TimeoutExpired:
            stall = watch.stalled() if watch is not None else None
            if stall is not None:
                return stall


def supervise(make_attempt: AttemptFactory, *, max_restarts: int, run_dir: str | Path,
              say: Callable[[str], None] = print, grace_s: float = 10.0,
              watch: StepWatch | None = None,
              input_error: Callable[[], str | None] | None = None) -> int:
    """Run attempts until one exits 0 or ``max_restarts`` restarts are spent (module
    docstring); returns the last attempt's exit code. ``watch``: the step watchdog of the
    attempts' heartbeats; ``input_error()``: the workers' report of an input error after a
    failed attempt (no restart then), else ``None``."""
    if max_restarts < 0:
        raise ValueError(f"max_restarts {max_restarts}: expected ≥ 0")
    stopping: list[int] = []
    current: list[subprocess.Popen] = []

    def forward(signum: int, _frame: object) -> None:
        stopping.append(signum)
        for proc in current:
            try:
                os.killpg(proc.pid, signum)
            except ProcessLookupError:
                pass

    main = threading.current_thread() is threading.main_thread()  # handlers: main thread only
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)
                } if main else {}
    try:
        attempt, code = 0, 1
        while True:
            env, argv = make_attempt(attempt)
            if attempt:
                say(f"restart {attempt}/{max_restarts}: {subprocess.list2cmdline(argv)}")
            if watch is not None:
                watch.clear()
            proc = subprocess.Popen(argv, env={**os.environ, **env}, start_new_session=True,
                                    preexec_fn=parent_death_hook(signal.SIGTERM))
            current[:] = [proc]
            stall = wait_attempt(proc, watch)
            if stall is not None:
                say(f"{stall.describe()}; ending attempt {attempt}")
                EventLog(run_dir, attempt).log("stall", ranks=list(stall.ranks),
                                               last_step=stall.step, idle_s=round(stall.idle_s, 1),
                                               timeout_s=stall.timeout_s)
            left = end_group(proc.pid, STALL_GRACE_S if stall is not None else grace_s)
            code = proc.wait()
            current.clear()
            if left:
                say(f"supervisor: processes {left} of attempt {attempt} survived SIGKILL")
            if stall is not None and code == 0:
                code = 1  # ended by the watchdog: a failed attempt whatever torchrun said
            refused = input_error() if code and input_error is not None else None
            if refused:
                return code
            if code == 0 or stopping or attempt >= max_restarts:
                if code and not stopping and max_restarts:
                    say(f"attempt {attempt} failed (exit code {code}) and the {max_restarts} "
                        "restart(s) are spent: giving up")
                return code
            checkpoint, last = newest_committed_step(run_dir), last_logged_step(run_dir)
            attempt += 1
            redone = None if last is None else last - (checkpoint or 0)
            EventLog(run_dir, attempt).log(
                "restart", exit_code=code, checkpoint_step=checkpoint, last_step=last,
                steps_redone=redone, restarts_left=max_restarts - attempt)
            say(f"attempt {attempt - 1} failed (exit code {code}); every process of it ended; "
                + (f"resuming from checkpoint step {checkpoint}" if checkpoint is not None
                   else "no checkpoint yet: starting over")
                + (f" (steps {(checkpoint or 0) + 1}–{last} are done again)" if redone else ""))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
