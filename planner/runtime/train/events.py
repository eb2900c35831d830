"""``RUN_DIR/events.jsonl``: what happened to a job besides its steps, one JSON object a line.

Every line has ``kind``, ``time`` (Unix seconds) and ``attempt`` (the supervised attempt that
logged it, 0 first), and then what the kind needs:

- ``restart`` (written by the supervisor, :mod:`fxplan.runtime.launch.supervisor`): an attempt ended
  with ``exit_code`` ≠ 0 and attempt ``attempt`` starts; ``checkpoint_step`` is the newest
  committed checkpoint it will resume from (``null``: none yet, it starts over), ``last_step``
  the last step ``metrics.jsonl`` logged before the failure, ``steps_redone`` their difference
  (the at-most-one checkpoint interval the failure costs), ``restarts_left``.
- ``replan`` (rank 0 of the workers): the world the job got differs from the plan's; ``old``
  and ``new`` are plan summaries (``summary``, ``world_size``, ``cluster``, ``batch``,
  ``microbatch``, ``num_microbatches``, ``predicted_step_time_s``), ``replan_ms`` the time the
  search took, ``changes`` what differs in words.
- ``resume`` (rank 0 of the workers): training went on from a checkpoint: ``checkpoint_step``,
  ``checkpoint``, ``next_sample`` (the checkpoint's data position: step × its global batch),
  ``first_sample`` (the global index the first step of this attempt reads: step × this plan's
  global batch) and ``samples_skipped = max(0, first − next)``,
  ``samples_replayed = max(0, next − first)``: both 0 when the global batch is kept.

Lines are appended with one ``write`` each, flushed, so a crash loses at most the line being
written; the supervisor and rank 0 never write at the same time (one runs while the other
waits). A line left cut (a kill, a full disk) is dropped before the next one is appended, and
:func:`read_events` skips any line that does not parse
(:func:`read_json_lines`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["EVENTS", "EventLog", "read_events", "read_json_lines"]

EVENTS = "events.jsonl"


class EventLog:
    """Appends events to ``run_dir/events.jsonl`` (created on the first event)."""

    def __init__(self, run_dir: str | Path, attempt: int = 0) -> None:
        self.path = Path(run_dir) / EVENTS
        self.attempt = attempt

    def log(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Append one event and return it."""
        event = {"kind": kind, "time": round(time.time(), 3), "attempt": self.attempt, **fields}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(event, sort_keys=False) + "\n"
        _drop_cut_tail(self.path)
        with self.path.open("a") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        return event


def read_json_lines(path: str | Path) -> list[str]:
    """The lines of a JSON-lines file of the run directory that hold one JSON object each; a
    line that does not parse (the last one, cut by a kill or a full disk, or bytes that are no
    text) is left out. Every reader of ``metrics.jsonl`` and ``events.jsonl`` goes through
    this, so a cut file never stops a resume."""
    kept = []
    for raw in Path(path).read_bytes().splitlines():
        try:
            line = raw.decode("utf-8")
            if isinstance(json.loads(line), dict):
                kept.append(line)
        except (UnicodeDecodeError, ValueError, RecursionError):
            continue
    return kept


def _drop_cut_tail(path: Path) -> None:
    """Truncate ``path`` after its last newline: a last line without one was cut."""
    try:
        with path.open("rb+") as handle:
            size = handle.seek(0, os.SEEK_END)
            if size == 0:
                return
            handle.seek(size - 1)
            if handle.read(1) == b"\n":
                return
            tail = min(size, 1 << 20)
            handle.seek(size - tail)
            end = handle.read(tail).rfind(b"\n")
            handle.truncate(size - tail + end + 1 if end >= 0 else 0)
    except FileNotFoundError:
        return


def read_events(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every event of ``run_dir`` in order (an empty list when there is none); a line that does
    not parse (cut) is skipped."""
    path = Path(run_dir) / EVENTS
    if not path.is_file():
        return []
    return [json.loads(line) for line in read_json_lines(path)]
