"""The command line's console. Numbers are formatted by :mod:`fxplan.core.units`."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["console"]


def console() -> Any:
    """A ``rich`` console: the terminal's width, or 140 columns when the output is piped, so
    that tables in files and tests are not wrapped to 80."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 140, highlight=False, emoji=False)
