"""Read one mesh axis out of a plan's compact placement strings.

A plan writes placements over ``plan.placement_axes`` (``("dp", "tp")`` by default), e.g.
``"S(0)S(1)"`` = batch-sharded over dp, dim 1 sharded over tp. The runtime realises each axis
with a different PyTorch piece (tp → DTensor placements, dp → DDP/ZeRO/FSDP over the batch), so
passes ask for the token of one axis: ``axis_placement("S(0)S(1)", plan, "tp") == Shard(1)``.
An axis missing from ``placement_axes`` reads as ``Replicate()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fxplan.core.placements import Placement, Replicate, Shard, parse_placements

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["axis_placement", "normalize"]


def axis_placement(text: str, plan: "Plan", axis: str) -> Placement:
    """The placement of mesh ``axis`` in ``text`` (one token per ``plan.placement_axes``)."""
    placements = parse_placements(text)
    if len(placements) != len(plan.placement_axes):
        raise ValueError(
            f"placement {text!r} has {len(placements)} tokens but placement_axes "
            f"{plan.placement_axes} has {len(plan.placement_axes)}"
        )
    if axis not in plan.placement_axes:
        return Replicate()
    return placements[plan.placement_axes.index(axis)]


def normalize(placement: Placement, ndim: int) -> Placement:
    """``Shard(-1)`` on a 3-D tensor → ``Shard(2)``; other placements unchanged."""
    if isinstance(placement, Shard) and placement.dim < 0:
        return Shard(placement.dim % ndim)
    return placement
