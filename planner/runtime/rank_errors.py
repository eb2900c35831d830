"""Input errors only a worker can see, reported once by the launcher instead of per-rank tracebacks.

Most bad input is refused by ``fxplan launch`` before any process starts. Some is seen only
inside a rank: a data hook that yields the wrong type, a token id at or above the vocabulary
beyond the part of the file the launcher scanned, a checkpoint write that fails because the
disk is full. Such a failure is a :class:`~fxplan.core.errors.UserError` in the worker. Under
``fxplan launch`` (a status directory in :data:`~fxplan.runtime.heartbeat.STATUS_DIR_ENV`) the
rank writes ``DIR/error-rank-R.json`` (``{"rank", "kind", "message"}``) and exits with
:data:`INPUT_ERROR_EXIT` at once, printing nothing; torchrun then ends the other ranks. The
launcher reads the reports (:func:`read_reports`), prints one paragraph — the message once, with
the ranks that hit it — and exits with code 2 without spending a restart: running the same input
again would fail again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fxplan.runtime.heartbeat import STATUS_DIR_ENV

__all__ = ["INPUT_ERROR_EXIT", "report_error", "read_reports", "clear_reports", "summarize"]

#: The exit code of a worker that reported an input error.
INPUT_ERROR_EXIT = 2


def report_error(rank: int, err: BaseException, directory: str | None = None) -> bool:
    """Write rank ``rank``'s report of ``err``; ``False`` (nothing written) outside
    ``fxplan launch`` or when the directory cannot be written (the caller then raises as
    before)."""
    directory = directory if directory is not None else os.environ.get(STATUS_DIR_ENV)
    if not directory:
        return False
    path = Path(directory) / f"error-rank-{rank}.json"
    temp = path.with_name(f".{path.name}.tmp")
    try:
        temp.write_text(json.dumps({"rank": rank, "kind": type(err).__name__,
                                    "message": str(err)}))
        os.replace(temp, path)
    except OSError:
        return False
    return True


def read_reports(directory: str | Path) -> list[dict[str, Any]]:
    """Every complete report in ``directory``, by rank."""
    found = []
    for path in Path(directory).glob("error-rank-*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("message"), str):
            found.append(data)
    return sorted(found, key=lambda d: d.get("rank", 0))


def clear_reports(directory: str | Path) -> None:
    """Remove the reports (a new attempt starts)."""
    for path in Path(directory).glob("error-rank-*.json"):
        path.unlink(missing_ok=True)


def summarize(reports: list[dict[str, Any]]) -> str:
    """One paragraph: each distinct message once, after the ranks that reported it."""
    by_message: dict[str, list[int]] = {}
    for report in reports:
        by_message.setdefault(report["message"], []).append(int(report.get("rank", 0)))
    parts = [f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {message}"
             for message, ranks in by_message.items()]
    return ("the workers stopped on an error of the run's input or storage, which a restart "
            "would meet again (not restarted): " + "; ".join(parts))
