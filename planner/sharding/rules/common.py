"""Helpers shared by several rules: broadcasting and "follow the input"."""

from __future__ import annotations

from typing import Sequence

from fxplan.core.placements import Placement, Shard
from fxplan.sharding.strategy import P, R, S, AxisOption

__all__ = ["broadcast_to_operand", "follow_options", "pointwise_options"]


def broadcast_to_operand(placement: Placement, out_shape: Sequence[int], shape: Sequence[int]) -> Placement:
    """The placement an operand broadcast (right-aligned) against ``out_shape`` needs when the
    output is ``placement``: the aligned dim if it has the full size, else replicated."""
    if isinstance(placement, Shard):
        dim = placement.dim - (len(out_shape) - len(shape))
        if dim >= 0 and shape[dim] == out_shape[placement.dim]:
            return S(dim)
        return R
    return placement


def pointwise_options(shapes: Sequence[Sequence[int]], out_shape: Sequence[int],
                      partial_operands: Sequence[set[int]] = ()) -> list[AxisOption]:
    """Shard any output dim together with the operands' aligned dims (broadcast ones stay
    replicated); ``partial_operands`` lists the sets of operands that may be ``Partial``
    together (linearity), each giving a ``P`` output."""
    options = [AxisOption(tuple(R for _ in shapes), R)]
    for dim in range(len(out_shape)):
        if out_shape[dim] == 1:
            continue
        inputs = tuple(broadcast_to_operand(S(dim), out_shape, s) for s in shapes)
        options.append(AxisOption(inputs, S(dim)))
    for group in partial_operands:
        inputs = tuple(P if i in group else R for i in range(len(shapes)))
        options.append(AxisOption(inputs, P))
    return options


def follow_options(ndim: int, linear: bool = False) -> list[AxisOption]:
    """One-operand ops whose output takes its input's placement (``P`` too if ``linear``)."""
    options = [AxisOption((R,), R)] + [AxisOption((S(d),), S(d)) for d in range(ndim)]
    return options + ([AxisOption((P,), P)] if linear else [])
