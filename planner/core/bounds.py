"""Physical bounds on every number a user gives, and the checks that enforce them.

A number outside these bounds describes no machine or job that exists, and some of them would
make a loop run for hours (``--batch 1000000000000``) or overflow a float (``memory_gib:
1e300``). Every entry point (command line flags, the Python API, cluster specs, model specs,
plan files) checks its numbers here and raises :class:`BoundsError` (a
:class:`~fxplan.core.errors.UserError`) naming the field, the value and the range expected.

The limits are generous: about a hundred times the largest training jobs published so far
(~10⁵ accelerators, global batches of a few thousand sequences of ≤ 10⁶ tokens).

=====================  ======================  ============================================
quantity               bound                   why
=====================  ======================  ============================================
devices (world size)   1 … 2²⁰ = 1,048,576     ten times the largest clusters built
nodes                  1 … 2²⁰                 at least one device per node
devices per node       1 … 4,096               a node is one machine
global batch           1 … 2²⁴ = 16,777,216    samples per optimiser step
sequence length        1 … 2²⁴ tokens
device memory          (0, 2²⁰] GiB            1 PiB per device
time budget            (0, 604,800] s          one week of search
=====================  ======================  ============================================
"""

from __future__ import annotations

import math
from typing import Any

from fxplan.core.errors import UserError

__all__ = ["BoundsError", "MAX_BATCH", "MAX_DEVICES", "MAX_DEVICES_PER_NODE", "MAX_MEMORY_GIB",
           "MAX_NODES", "MAX_SEQ", "MAX_TIME_BUDGET_S", "check_count", "check_number"]

MAX_DEVICES = 2 ** 20
MAX_NODES = 2 ** 20
MAX_DEVICES_PER_NODE = 4096
MAX_BATCH = 2 ** 24
MAX_SEQ = 2 ** 24
MAX_MEMORY_GIB = float(2 ** 20)
MAX_TIME_BUDGET_S = 7 * 24 * 3600.0


class BoundsError(UserError, ValueError):
    """A number of the wrong type or outside its physical range (message: field, value,
    range)."""


def check_count(name: str, value: Any, *, low: int = 1, high: int | None = None) -> int:
    """``value`` if it is an ``int`` (not ``bool``, not ``16.0``, not ``"16"``) in
    ``[low, high]``, else :class:`BoundsError` naming ``name`` and the range."""
    expected = f"an integer {_range(low, high)}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise BoundsError(f"{name} = {value!r} ({type(value).__name__}): expected {expected}")
    if value < low or (high is not None and value > high):
        raise BoundsError(f"{name} = {_short(value)}: expected {expected}")
    return value


def check_number(name: str, value: Any, *, low: float = 0.0, high: float | None = None,
                 low_open: bool = True) -> float:
    """``value`` as a float if it is a finite real number (not ``bool``, not text) with
    ``low < value`` (``low ≤ value`` when ``low_open`` is false) and ``value ≤ high``."""
    bound = f"> {low:g}" if low_open else f"≥ {low:g}"
    expected = f"a finite number {bound}" + (f" and ≤ {high:,g}" if high is not None else "")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BoundsError(f"{name} = {value!r} ({type(value).__name__}): expected {expected}")
    number = float(value) if abs(value) < 1e308 else math.inf
    if (not math.isfinite(number) or number < low or (low_open and number == low)
            or (high is not None and number > high)):
        raise BoundsError(f"{name} = {_short(value)}: expected {expected}")
    return number


def _range(low: int, high: int | None) -> str:
    return f"≥ {low:,}" if high is None else f"in {low:,} … {high:,}"


def _short(value: Any) -> str:
    """``value`` as text, big integers abbreviated (``10**30`` has 31 digits, not a page)."""
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:10]}…({len(text)} digits)"
