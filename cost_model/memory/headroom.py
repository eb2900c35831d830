"""``--memory-headroom``: memory a plan must leave free on every device, beyond its estimate.

A plan fits when, on every pipeline rank, the estimated peak ``M`` (tensors plus the runtime
terms of :mod:`cost_model.memory.runtime` and the device's reserve) leaves the headroom
``H`` free of the capacity ``C``::

    M + H ≤ C        H = h·C  (a fraction, "0.1" or "10%")   or   H = g GiB  ("4GiB")

**Default ``h = 5 %``** (4 GiB of an 80 GiB A100/H100, 1.6 GiB of a 32 GiB V100). The memory
model is a per-rank peak of what it itemises; a real step also allocates what it does not:
the fp32 upcast of the logits in the loss (``4·b·s·V`` bytes: 2 GiB at b = 1, s = 4096,
V = 131072), kernel workspaces (flash attention, cuDNN), transient copies of the optimizer's
foreach kernels, and communicators created lazily by later collectives. Each of these is a
few percent of HBM at today's sizes, and an OOM costs the whole job, while 5 % of memory
costs little speed (a smaller microbatch or one more recompute level at worst). Pass ``0``
to plan to the edge, a larger value for models or frameworks with bigger transients.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from fxplan.core.errors import UserError

__all__ = ["DEFAULT_HEADROOM", "HeadroomError", "MemoryHeadroom", "parse_headroom"]

GIB = float(1 << 30)


class HeadroomError(UserError):
    """A memory headroom that is not a fraction in [0, 1), a percentage or a GiB amount."""


@dataclass(frozen=True)
class MemoryHeadroom:
    """Either ``fraction`` of the capacity (``gib`` None) or ``gib`` GiB (``fraction`` None)."""

    fraction: float | None = None
    gib: float | None = None

    def bytes(self, capacity: float) -> float:
        """``H`` in bytes for a device of ``capacity`` bytes (module docstring)."""
        return self.fraction * capacity if self.fraction is not None else float(self.gib) * GIB

    def describe(self) -> str:
        """``"5 %"`` or ``"4 GiB"`` (as the user would write it back)."""
        if self.fraction is not None:
            return f"{100 * self.fraction:g} %"
        return f"{self.gib:g} GiB"

    def to_json(self) -> str:
        """The text :func:`parse_headroom` reads back: ``"5%"`` or ``"4GiB"``."""
        return self.describe().replace(" ", "")


#: 5 % of each device's memory (module docstring).
DEFAULT_HEADROOM = MemoryHeadroom(fraction=0.05)

_TEXT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(%|gib|g)?\s*$", re.IGNORECASE)


def _refuse(value: object, why: str) -> HeadroomError:
    return HeadroomError(
        f"memory headroom {value!r}: {why}; give a fraction of each device's memory in [0, 1) "
        "(0.1), a percentage below 100 (10%) or an amount in GiB (4GiB); the default is "
        f"{DEFAULT_HEADROOM.describe()}")


def parse_headroom(value: "str | float | int | MemoryHeadroom | None") -> MemoryHeadroom:
    """``None`` → the default; ``0.1``, ``"0.1"``, ``"10%"`` → a fraction; ``"4GiB"`` (also
    ``4G``) → GiB. Anything else, a negative value, a fraction ≥ 1 or a percentage
    ≥ 100 is a :class:`HeadroomError` (a ``UserError``)."""
    if value is None:
        return DEFAULT_HEADROOM
    if isinstance(value, MemoryHeadroom):
        return value
    if isinstance(value, bool):
        raise _refuse(value, "expected a number or a text, got a bool")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    elif isinstance(value, str):
        match = _TEXT.match(value)
        if match is None:
            raise _refuse(value, "not a number, a percentage or a GiB amount")
        number, unit = float(match.group(1)), (match.group(2) or "").lower()
    else:
        raise _refuse(value, f"expected a number or a text, got {type(value).__name__}")
    if not math.isfinite(number) or number < 0:
        raise _refuse(value, "it must be a finite number ≥ 0")
    if unit in ("gib", "g"):
        return MemoryHeadroom(gib=number)
    fraction = number / 100 if unit == "%" else number
    if fraction >= 1:
        raise _refuse(value, "a fraction must be below 1 (below 100 %); write 4GiB for an "
                             "amount")
    return MemoryHeadroom(fraction=fraction)
