"""Numbers for people: SI prefixes, binary byte units, counts in K/M/B/T, and the console.

Every verb prints numbers through these so that one table reads like the next: three
significant digits and a unit (``1.68 B`` parameters, ``79.1 GiB``, ``312 TFLOP``).
"""

from __future__ import annotations

import sys
from typing import Any

_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_COUNT = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K"))
_BINARY = ((2 ** 40, "TiB"), (2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB"))


def _scaled(value: float, units: tuple[tuple[float, str], ...], digits: int) -> tuple[str, str]:
    for factor, unit in units:
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g}", unit
    return f"{value:.{digits}g}", ""


def si(value: float, unit: str = "", digits: int = 3) -> str:
    """``value`` with an SI prefix: ``si(3.1e12, "FLOP")`` → ``"3.1 TFLOP"``."""
    number, prefix = _scaled(value, _SI, digits)
    return f"{number} {prefix}{unit}".rstrip()


def count(value: float, digits: int = 3) -> str:
    """A count such as a number of parameters: ``count(1.68e9)`` → ``"1.68 B"``,
    ``count(124_439_808)`` → ``"124 M"``, ``count(512)`` → ``"512"``."""
    number, suffix = _scaled(value, _COUNT, digits)
    return f"{number} {suffix}".rstrip()


def binary_bytes(value: float, digits: int = 3) -> str:
    """Bytes in binary units: ``binary_bytes(2**31)`` → ``"2 GiB"``; below 1 KiB, ``"512 B"``."""
    for factor, unit in _BINARY:
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g} {unit}"
    return f"{value:.0f} B"


def console() -> Any:
    """A ``rich`` console: the terminal's width, or 140 columns when the output is piped, so
    that tables in files and tests are not wrapped to 80."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 140, highlight=False, emoji=False)
