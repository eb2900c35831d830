"""Pruning reasons grouped by kind, the useful near-misses first.

The search records every pruned family or candidate group as a sentence (``Plan.pruned``) and,
since :mod:`fxplan.inter_op.reasons`, its kind and numbers (``Plan.pruned_detail``, same
order). :func:`group_pruned` groups the sentences by kind in the order of
:data:`~fxplan.inter_op.reasons.KINDS` (memory near-misses, then candidates cut by the time
bound, duplicates, cost-model refusals, and last the trivial ones: a degree that does not
divide, more stages than layers), and orders the memory group by how close its candidate
came, the ratio ``needed / capacity`` (1.01 before 2.6). A plan written before
``pruned_detail`` existed is read from its sentences: the kind from their wording, the numbers
from "needs [≥] X GiB > Y GiB" or "simulated peak X GiB > Y GiB".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from fxplan.core.plan import Plan
from fxplan.inter_op.reasons import (DIVIDE, DUPLICATE, KINDS, MEMORY, REFUSED, STAGES,
                                     TIME_BOUND)

__all__ = ["OTHER", "PrunedGroup", "group_pruned"]

#: The kind of a sentence no rule recognises (a plan from another version).
OTHER = "other"

#: Old-plan sentences: (pattern, kind), first match wins.
_WORDING: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"more stages than layers"), STAGES),
    (re.compile(r"does not divide|not divisible"), DIVIDE),
    (re.compile(r"compute lower bound"), TIME_BOUND),
    (re.compile(r"already a finalist"), DUPLICATE),
    (re.compile(r"refused"), REFUSED),
    (re.compile(r"GiB >"), MEMORY),
)
_NEEDS = re.compile(r"(?:needs ≥?|simulated peak)\s*([\d.]+) GiB > ([\d.]+) GiB")


@dataclass(frozen=True)
class PrunedGroup:
    """The plan's pruned reasons of one ``kind``, closest candidate first."""

    kind: str
    reasons: tuple[str, ...]


def _detail(text: str, detail: Mapping[str, Any] | None) -> tuple[str, float]:
    """``(kind, closeness)`` of one reason: ``needed / capacity`` for memory, else 0."""
    if detail and "kind" in detail:
        kind = str(detail["kind"])
        needed, cap = detail.get("needed_gib"), detail.get("capacity_gib")
    else:
        kind = next((k for pattern, k in _WORDING if pattern.search(text)), OTHER)
        match = _NEEDS.search(text)
        needed, cap = (float(match[1]), float(match[2])) if match else (None, None)
    closeness = needed / cap if needed is not None and cap else float("inf")
    return kind, closeness if kind == MEMORY else 0.0


def group_pruned(plan: Plan) -> list[PrunedGroup]:
    """Pruning reasons grouped by kind, most useful kind first (memory/time near-misses before
    trivial divisibility), each group ordered by how close its candidate came."""
    details: list[Mapping[str, Any] | None] = (
        list(plan.pruned_detail) if len(plan.pruned_detail) == len(plan.pruned)
        else [None] * len(plan.pruned))
    groups: dict[str, list[tuple[float, int, str]]] = {}
    for index, (text, detail) in enumerate(zip(plan.pruned, details)):
        kind, closeness = _detail(text, detail)
        groups.setdefault(kind, []).append((closeness, index, text))
    order = {kind: i for i, kind in enumerate((*KINDS, OTHER))}
    return [PrunedGroup(kind, tuple(text for _, _, text in sorted(groups[kind])))
            for kind in sorted(groups, key=lambda k: order.get(k, len(order)))]
