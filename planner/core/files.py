"""Reading a user's file: every way it can fail becomes the caller's :class:`UserError`.

A missing file, a directory where a file is expected, a file the user may not read, and bytes
that are not UTF-8 text each get one sentence naming the file and what was expected, instead
of ``FileNotFoundError``/``IsADirectoryError``/``PermissionError``/``UnicodeDecodeError``
tracebacks. A path that exists but is no regular file (a FIFO, which would block the read, or
a device such as ``/dev/zero``, which would never end) is refused as what it is, before it is
opened; a caller may bound the size it reads (``max_bytes``), checked from ``stat`` before the
read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Callable

from fxplan.core.errors import UserError

__all__ = ["read_text", "file_problem", "not_regular"]

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def not_regular(path: str | Path) -> str | None:
    """What ``path`` is when it exists and is neither a regular file nor a directory (``"a
    FIFO (named pipe)"``, ``"a character device"``, …), else ``None``."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), None)


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
              error: Callable[[str], UserError] = UserError, max_bytes: int | None = None) -> str:
    """The UTF-8 text of ``path``; otherwise ``error(message)`` with the message
    ``"{what} {path} {problem}"`` (e.g. "plan file x.json is a directory; expected a file").
    ``max_bytes``: a larger file is refused unread."""
    path = Path(path)
    kind = not_regular(path)
    if kind is not None:
        raise error(f"{what} {path} is {kind}, not a regular file; expected a file")
    try:
        if path.is_dir():
            raise IsADirectoryError(str(path))
        size = path.stat().st_size
        if max_bytes is not None and size > max_bytes:
            raise error(f"{what} {path} is {size / 2**20:.1f} MiB; a {what} of more than "
                        f"{max_bytes / 2**20:g} MiB is refused unread")
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise error(f"{what} {path} {file_problem(path, err)}") from None
