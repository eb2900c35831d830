"""The plan's pruning reasons grouped by kind, the useful kinds first.

Minimal version (the ``report-explain`` branch owns the full one, same interface). A reason is
classified by its wording (the strings :mod:`fxplan.inter_op` writes): memory near-misses
("needs 93.4 GiB > 80 GiB", "does not fit"), then the time bound, then finalists that priced
as another, then anything else, then divisibility and stage-count rules. Inside a group,
reasons naming a memory need are ordered by that need (the smallest — the closest to fitting —
first); the others keep the search's order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["PrunedGroup", "group_pruned"]


@dataclass(frozen=True)
class PrunedGroup:
    """One kind of pruning reason and the plan's reasons of that kind, closest first."""

    kind: str
    reasons: tuple[str, ...]


#: ``(kind, pattern)`` in the order the groups are shown; the first matching pattern wins.
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("does not fit in memory", re.compile(r"GiB >|does not fit|did not fit|fits at")),
    ("slower than the best (time bound)", re.compile(r"lower bound")),
    ("same as another finalist", re.compile(r"already a finalist")),
    ("other", re.compile(r"(?!)")),
    ("degree does not divide", re.compile(r"does not divide|not divisible")),
    ("more stages than layers", re.compile(r"more stages than layers")),
)

_NEED = re.compile(r"needs? (?:≥ )?([0-9.]+) GiB|peak ([0-9.]+) GiB")


def _need_gib(reason: str) -> float:
    """The memory a reason says its candidate needs (GiB), ``inf`` when it names none."""
    match = _NEED.search(reason)
    return float(next(g for g in match.groups() if g)) if match else float("inf")


def group_pruned(plan: "Plan") -> list[PrunedGroup]:
    """Pruning reasons grouped by kind, most useful kind first (module docstring)."""
    groups: dict[str, list[str]] = {kind: [] for kind, _ in KINDS}
    for reason in plan.pruned:
        kind = next((k for k, pattern in KINDS if pattern.search(reason)), "other")
        groups[kind].append(reason)
    return [PrunedGroup(kind, tuple(sorted(reasons, key=_need_gib)))
            for kind, reasons in groups.items() if reasons]
