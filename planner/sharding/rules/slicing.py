"""The ATen spellings of slicing and broadcasting: ``slice``, ``select``, ``expand``.

    aten.slice(x, dim, start, end, step)   dims other than ``dim`` follow; ``dim`` too when
                                           the slice is the whole dim (the identity)
    aten.select(x, dim, index)             dims other than ``dim`` follow, shifted past it
    aten.expand(x, size)                   dims of ``x`` at full size follow (right-aligned);
                                           a broadcast dim of size 1 stays replicated

All are views (linear): ``Partial`` passes through.
"""

from __future__ import annotations

import torch

from fxplan.sharding.context import OpContext
from fxplan.sharding.registry import register_rule
from fxplan.sharding.strategy import P, R, S, AxisOption

aten = torch.ops.aten


def _kept(pairs: dict[int, int]) -> list[AxisOption]:
    return [AxisOption((R,), R), AxisOption((P,), P)] + [AxisOption((S(d),), S(e))
                                                         for d, e in pairs.items()]


@register_rule(aten.slice.Tensor, follows=True)
def slice_rule(ctx: OpContext) -> list[AxisOption]:
    """Every dim but the sliced one follows (it too when the slice is whole)."""
    shape = ctx.shapes[0]
    dim = int(ctx.arg(1, "dim", 0)) % len(shape)
    whole = tuple(ctx.out) == tuple(shape)
    return _kept({d: d for d in range(len(shape)) if d != dim or whole})


@register_rule(aten.select.int, follows=True)
def select_rule(ctx: OpContext) -> list[AxisOption]:
    """The selected dim disappears; the others follow."""
    ndim = ctx.operands[0].ndim
    dim = int(ctx.arg(1, "dim")) % ndim
    return _kept({d: d - (d > dim) for d in range(ndim) if d != dim})


@register_rule(aten.expand.default, follows=True)
def expand_rule(ctx: OpContext) -> list[AxisOption]:
    """Input dims kept at full size follow to their right-aligned output dim."""
    shape, out = ctx.shapes[0], tuple(ctx.out)
    offset = len(out) - len(shape)
    return _kept({d: d + offset for d in range(len(shape)) if shape[d] == out[d + offset]})
