"""Strategy data types: what a distributed operator needs, gives and implies.

A sharding rule speaks about *one* mesh axis at a time: an :class:`AxisOption` says, for a
single axis, the placement each tensor operand must have, the placement of the output and the
communication the op itself runs over that axis (e.g. the all-reduces of a vocab-parallel
loss). Axes are independent, so a full :class:`OpStrategy` on an ``k``-D mesh is one option
per axis (:mod:`fxplan.sharding.expand`), printed per tensor in mesh-axis order, compactly::

    S(0)R, RS(0) -> S(0)S(2)        # operand 0, operand 1 -> output, on a (dp, tp) mesh

Placements are torch's public types (``Shard``, ``Replicate``, ``Partial``); ``None`` stands
for an operand that is not a tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from fxplan.core.placements import (Partial, Placement, Placements, Replicate, Shard,
                                    format_placements)

__all__ = ["Comm", "AxisOption", "OpStrategy", "R", "P", "S"]

R: Placement = Replicate()
P: Placement = Partial()


def S(dim: int) -> Placement:  # noqa: N802 (reads like the printed form)
    return Shard(dim)


@dataclass(frozen=True)
class Comm:
    """A collective the op runs itself over one mesh axis: ``kind`` on a buffer of the local
    size of operand ``operand`` (``-1``: the output) with dims ``drop_dims`` reduced away,
    ``count`` times, in ``dtype_bytes``-byte elements; ``backward`` if it runs again there."""

    kind: str
    operand: int = -1
    drop_dims: tuple[int, ...] = ()
    count: int = 1
    dtype_bytes: int = 4
    backward: bool = False


@dataclass(frozen=True)
class AxisOption:
    """One mesh axis: operand placements (``None`` for non-tensors) → output placement."""

    inputs: tuple[Optional[Placement], ...]
    output: Placement
    comms: tuple[Comm, ...] = ()
    note: str = ""

    @property
    def splits(self) -> bool:
        """Whether the op's work is divided over the axis (any placement not ``R``)."""
        return any(p is not None and not isinstance(p, Replicate) for p in (*self.inputs, self.output))


@dataclass(frozen=True)
class OpStrategy:
    """A full strategy on a ``k``-D mesh: per operand and for the output, one placement per
    axis; ``comms[a]`` the collectives the op runs over axis ``a``; ``split[a]`` whether the
    op's work is divided over axis ``a``."""

    inputs: tuple[Optional[Placements], ...]
    output: Placements
    comms: tuple[tuple[Comm, ...], ...] = ()
    split: tuple[bool, ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_axes(cls, options: Sequence[AxisOption]) -> "OpStrategy":
        num = len(options[0].inputs)
        inputs = tuple(
            None if options[0].inputs[i] is None else tuple(o.inputs[i] for o in options)
            for i in range(num)
        )
        return cls(inputs, tuple(o.output for o in options), tuple(o.comms for o in options),
                   tuple(o.splits for o in options), tuple(sorted({o.note for o in options if o.note})))

    def __str__(self) -> str:
        ins = ", ".join("-" if p is None else format_placements(p) for p in self.inputs)
        return f"{ins} -> {format_placements(self.output)}"
