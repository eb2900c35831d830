"""Read one mesh axis out of a plan's placements.

A plan's :class:`~fxplan.core.placements.PlacementMap` holds one placement per axis of
``plan.placements.axes`` (``("dp", "tp")`` by default), e.g. ``(Shard(0), Shard(1))`` =
batch-sharded over dp, dim 1 sharded over tp. The runtime realises each axis with a different
PyTorch piece (tp → DTensor placements, dp → DDP/ZeRO/FSDP over the batch), so passes ask for
the entry of one axis: ``axis_placement(plan, (Shard(0), Shard(1)), "tp") == Shard(1)``. An axis
the map does not name reads as ``Replicate()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fxplan.core.placements import Placement, Placements, Replicate, Shard

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["axis_placement", "normalize"]


def axis_placement(plan: "Plan", placements: Placements, axis: str) -> Placement:
    """The placement of mesh ``axis`` in ``placements`` (a value of ``plan.placements``)."""
    if axis not in plan.placements.axes:
        return Replicate()
    return placements[plan.placements.axis(axis)]


def normalize(placement: Placement, ndim: int) -> Placement:
    """``Shard(-1)`` on a 3-D tensor → ``Shard(2)``; other placements unchanged."""
    if isinstance(placement, Shard) and placement.dim < 0:
        return Shard(placement.dim % ndim)
    return placement
