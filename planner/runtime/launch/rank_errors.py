"""Input errors only a worker can see, reported once by the launcher instead of per-rank tracebacks.

Most bad input is refused by ``fxplan launch`` before any process starts. Some is seen only
inside a rank: a data hook that yields the wrong type, a token id at or above the vocabulary
beyond the part of the file the launcher scanned, a checkpoint write that fails because the
disk is full. Such a failure is a :class:`~fxplan.core.errors.UserError` in the worker. Under
``fxplan launch`` (a status directory in :data:`~fxplan.runtime.launch.heartbeat.STATUS_DIR_ENV`) the
rank writes ``DIR/error-rank-R.json`` (``{"rank", "kind", "message"}``) and exits with
:data:`INPUT_ERROR_EXIT` at once, printing nothing; torchrun then ends the other ranks. The
launcher reads the reports (:func:`read_reports`), prints one paragraph — the message once, with
the ranks that hit it — and exits with code 2 without spending a restart: running the same input
again would fail again.

Any other exception in a rank under ``fxplan launch`` (a shape that does not fit, a collective
that broke) is a *failure*: the rank writes its whole traceback to
``RUN_DIR/failures/rank-R.txt``, a report ``DIR/failure-rank-R.json`` (``{"rank", "kind",
"message", "where", "log", "time"}``: the exception's last line, the innermost frame of the
traceback) and exits with code 1 at once, printing nothing. torchrun ends the other ranks
(their own failures, a peer's closed connection, are reported the same way) and restarts as it
would. The launcher prints one paragraph (:func:`summarize_failures`): the first failure in
time, the ranks that hit the same one, and where every rank's traceback is; torchrun's own
failure log and error box are left out (:mod:`fxplan.runtime.launch.torchrun`).
"""

from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path
from typing import Any

from fxplan.runtime.launch.heartbeat import STATUS_DIR_ENV

__all__ = ["INPUT_ERROR_EXIT", "FAILURE_EXIT", "report_error", "read_reports", "clear_reports",
           "summarize", "report_failure", "read_failures", "summarize_failures"]

#: The exit code of a worker that reported an input error.
INPUT_ERROR_EXIT = 2

#: The exit code of a worker that reported a failure (any other exception).
FAILURE_EXIT = 1


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
    return sorted(_read(directory, "error-rank-*.json"), key=lambda d: d.get("rank", 0))


def _read(directory: str | Path, pattern: str) -> list[dict[str, Any]]:
    """The complete reports (JSON objects with a message) of the files ``pattern`` matches."""
    found = []
    for path in Path(directory).glob(pattern):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("message"), str):
            found.append(data)
    return found


def clear_reports(directory: str | Path) -> None:
    """Remove the reports, input errors and failures (a new attempt starts)."""
    for pattern in ("error-rank-*.json", "failure-rank-*.json"):
        for path in Path(directory).glob(pattern):
            path.unlink(missing_ok=True)


def report_failure(rank: int, err: BaseException, run_dir: str,
                   directory: str | None = None) -> bool:
    """Write rank ``rank``'s traceback of ``err`` to ``RUN_DIR/failures/rank-R.txt`` and its
    report (module docstring); ``False`` (nothing written) outside ``fxplan launch`` or when
    either cannot be written (the caller then raises as before)."""
    directory = directory if directory is not None else os.environ.get(STATUS_DIR_ENV)
    if not directory:
        return False
    frames = traceback.extract_tb(err.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    log = Path(run_dir) / "failures" / f"rank-{rank}.txt"
    path = Path(directory) / f"failure-rank-{rank}.json"
    temp = path.with_name(f".{path.name}.tmp")
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("".join(traceback.format_exception(err)))
        temp.write_text(json.dumps({"rank": rank, "kind": type(err).__name__,
                                    "message": lines[-1] if lines else "", "where": where,
                                    "log": str(log), "time": time.time()}))
        os.replace(temp, path)
    except OSError:
        return False
    return True


def read_failures(directory: str | Path) -> list[dict[str, Any]]:
    """Every complete failure report in ``directory``, first in time first."""
    return sorted(_read(directory, "failure-rank-*.json"),
                  key=lambda d: (d.get("time", 0.0), d.get("rank", 0)))


def summarize_failures(reports: list[dict[str, Any]]) -> str:
    """One paragraph: the first failure in time, the ranks that hit the same, and where the
    tracebacks are."""
    first = reports[0]
    same = sorted(int(r.get("rank", 0)) for r in reports
                  if (r["kind"], r["message"]) == (first["kind"], first["message"]))
    others = len(reports) - len(same)
    where = f" at {first['where']}" if first.get("where") else ""
    ranks = f"rank{'s' if len(same) > 1 else ''} {', '.join(map(str, same))}"
    tail = f"; {others} other rank(s) stopped after it" if others else ""
    folder = Path(str(first.get("log", ""))).parent
    return (f"the run failed: {ranks}: {first['kind']}: {first['message']}{where}{tail}. "
            f"Every rank's traceback is in {folder}/.")


def summarize(reports: list[dict[str, Any]]) -> str:
    """One paragraph: each distinct message once, after the ranks that reported it."""
    by_message: dict[str, list[int]] = {}
    for report in reports:
        by_message.setdefault(report["message"], []).append(int(report.get("rank", 0)))
    parts = [f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {message}"
             for message, ranks in by_message.items()]
    return ("the workers stopped on an error of the run's input or storage, which a restart "
            "would meet again (not restarted): " + "; ".join(parts))
