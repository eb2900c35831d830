"""Numbers for people: SI prefixes, binary byte units, counts in K/M/B/T, durations, shares.

Every verb, the reports and the exports print numbers through these so that one table reads
like the next: three significant digits and a unit (``1.68 B`` parameters, ``79.1 GiB``,
``312 TFLOP``). The command line's console lives with the CLI (:mod:`fxplan.report.console`).
"""

from __future__ import annotations

__all__ = ["binary_bytes", "count", "gib", "percent", "plain", "seconds", "si", "time_unit"]

_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_COUNT = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K"))
_BINARY = ((2 ** 40, "TiB"), (2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB"))


def _number(value: float, digits: int) -> str:
    """``digits`` significant digits, never an exponent: ``1000`` stays ``"1000"``, not
    ``"1e+03"`` (a value too large for its unit's next step, such as 1000 GiB < 1 TiB)."""
    text = f"{value:.{digits}g}"
    return f"{value:.0f}" if "e+" in text else text


def plain(value: float, digits: int = 4) -> str:
    """``digits`` significant digits and no exponent, for a number whose unit is printed
    beside it: ``plain(1234.5)`` → ``"1234"``, ``plain(0.01234)`` → ``"0.01234"``."""
    return _number(value, digits)


def _scaled(value: float, units: tuple[tuple[float, str], ...], digits: int) -> tuple[str, str]:
    for factor, unit in units:
        if abs(value) >= factor:
            return _number(value / factor, digits), unit
    return _number(value, digits), ""


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
            return f"{_number(value / factor, digits)} {unit}"
    return f"{value:.0f} B"


#: Below this many seconds a time is float noise of a difference (``1.421e-14``): shown as 0.
_NOISE_S = 1e-9


def seconds(value: float, digits: int = 3, *, sign: bool = False) -> str:
    """A duration with a unit that keeps ``digits`` significant digits readable:
    ``seconds(0.0222788)`` → ``"22.3 ms"``, ``seconds(8.718)`` → ``"8.72 s"``,
    ``seconds(3e-6)`` → ``"3 µs"``; ``|value| < 1 ns`` (rounding noise of a difference,
    ``1.421e-14``) → ``"0 s"``. ``sign``: a leading ``+`` on positive values (for deltas)."""
    if abs(value) < _NOISE_S:
        return "0 s"
    plus = "+" if sign and value > 0 else ""
    for factor, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(value) >= factor:
            return f"{plus}{_number(value / factor, digits)} {unit}"
    return f"{plus}{_number(value / 1e-9, digits)} ns"


def percent(fraction: float, digits: int = 3, *, sign: bool = False) -> str:
    """``percent(0.3061)`` → ``"30.6 %"``; ``sign``: ``"+2.1 %"``; noise below 1e-9 → ``"0 %"``."""
    if abs(fraction) < _NOISE_S:
        return "0 %"
    plus = "+" if sign and fraction > 0 else ""
    return f"{plus}{_number(100 * fraction, digits)} %"


def gib(value: float, digits: int = 3, *, sign: bool = False) -> str:
    """A memory size given in GiB: ``gib(36.62)`` → ``"36.6 GiB"``, ``gib(0.25)`` → ``"256 MiB"``."""
    if abs(value) * 2 ** 30 < 1:
        return "0 B"
    plus = "+" if sign and value > 0 else ""
    return plus + binary_bytes(value * 2 ** 30, digits)


def time_unit(seconds: float) -> tuple[float, str]:
    """``(scale, unit)`` for an axis spanning ``seconds``: µs below 1 ms, ms below 10 s, else s."""
    if seconds < 1e-3:
        return 1e6, "µs"
    if seconds < 10:
        return 1e3, "ms"
    return 1.0, "s"
