"""The error of a configuration the cost model cannot price, and the check every degree and
count of a configuration goes through."""

from __future__ import annotations

from typing import Any

from fxplan.core.errors import UserError

__all__ = ["CostModelError", "positive_int"]


class CostModelError(UserError, ValueError):
    """A configuration the cost model cannot price; the message shows the arithmetic."""


def positive_int(name: str, value: Any) -> int:
    """``value`` when it is an integer ≥ 1 (not a bool); else :class:`CostModelError` naming
    ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CostModelError(f"{name} must be a positive integer, got {value!r}")
    return value
