"""Reading a user's file: every way it can fail becomes the caller's :class:`UserError`.

A missing file, a directory where a file is expected, a file the user may not read, and bytes
that are not UTF-8 text each get one sentence naming the file and what was expected, instead
of ``FileNotFoundError``/``IsADirectoryError``/``PermissionError``/``UnicodeDecodeError``
tracebacks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from fxplan.core.errors import UserError

__all__ = ["read_text", "file_problem"]


def file_problem(path: Path, err: BaseException) -> str:
    """Why ``path`` could not be read, in words."""
    if isinstance(err, UnicodeDecodeError):
        return (f"is not UTF-8 text ({err.reason} at byte {err.start}); expected a UTF-8 "
                "text file")
    if isinstance(err, IsADirectoryError) or path.is_dir():
        return "is a directory; expected a file"
    if isinstance(err, FileNotFoundError):
        return "does not exist"
    if isinstance(err, PermissionError):
        return "cannot be read (permission denied)"
    if isinstance(err, NotADirectoryError):
        return "is not a path to a file (a component is not a directory)"
    return f"cannot be read ({getattr(err, 'strerror', None) or err})"


def read_text(path: str | Path, *, what: str,
              error: Callable[[str], UserError] = UserError) -> str:
    """The UTF-8 text of ``path``; otherwise ``error(message)`` with the message
    ``"{what} {path} {problem}"`` (e.g. "plan file x.json is a directory; expected a file")."""
    path = Path(path)
    try:
        if path.is_dir():
            raise IsADirectoryError(str(path))
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise error(f"{what} {path} {file_problem(path, err)}") from None
