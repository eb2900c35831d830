"""``CaptureError`` and the helpers that point it at the user's source line."""

from __future__ import annotations

from fxplan.core.errors import UserError

import linecache
import os
import traceback
from types import TracebackType

import torch

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PASSES_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep

#: What a user can do about an untraceable module, in the words the error uses.
REMEDIES = ("mark the module as a leaf (capture(..., leaf_modules=[{leaf!r}]) or "
            "fxplan graph --leaf {leaf}), so fx records it as one opaque call; pass "
            "concrete_args={{...}} for forward arguments that decide the branch; or wrap a "
            "helper function with torch.fx.wrap so fx calls it instead of tracing it")


class CaptureError(UserError, ValueError):
    """The model could not be captured; the message names the module, the source line and
    what to do. ``module_path`` and ``location`` (``file:line``) are kept as attributes."""

    def __init__(self, message: str, *, module_path: str | None = None,
                 location: str | None = None) -> None:
        super().__init__(message)
        self.module_path = module_path
        self.location = location


def user_frame(tb: TracebackType | None) -> tuple[str, int, str] | None:
    """The innermost traceback frame outside torch and fxplan's passes: (file, line, code)."""
    found = None
    for frame, lineno in traceback.walk_tb(tb):
        filename = os.path.abspath(frame.f_code.co_filename)
        if filename.startswith((_TORCH_DIR, _PASSES_DIR)) or filename.startswith("<"):
            continue
        found = (filename, lineno, linecache.getline(filename, lineno).strip())
    return found


def short_path(filename: str) -> str:
    """``filename`` relative to the working directory when it lies below it."""
    rel = os.path.relpath(filename)
    return filename if rel.startswith("..") else rel


def location_of(frame: tuple[str, int, str] | None) -> tuple[str | None, str]:
    """``("file:line", " at file:line: `code`")`` for an error message (empty if unknown)."""
    if frame is None:
        return None, ""
    location = f"{short_path(frame[0])}:{frame[1]}"
    return location, f" at {location}: `{frame[2]}`"
