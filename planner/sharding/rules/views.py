"""Views: reshape, flatten, (un)squeeze, transpose, permute — propagate dims through them.

Reshape. Row-major, a shard of input dim ``d`` over ``n`` ranks gives each rank, for every
index of the dims before ``d``, one contiguous run of the elements. An output dim ``e`` gives
the same runs exactly when the products of the dims before them agree,

    Π_{i<d} in[i]  =  Π_{j<e} out[j]        (both dims > 1)

(then the run lengths agree too, since the totals do). So ``S(d) -> S(e)`` for such pairs —
``(B, T, C) -> (B, T, H, D)`` maps the hidden dim to the heads dim, ``(B, T, V) -> (B·T, V)``
maps the batch dim to the merged one — and a dim with no partner stays replicated. Whether
``e`` divides by the axis size is checked with the output shape.

Transpose/permute move the shard with its dim. Every view is linear, so ``Partial`` passes.
"""

from __future__ import annotations

import math

import torch

from fxplan.sharding.context import OpContext
from fxplan.sharding.registry import register_rule
from fxplan.sharding.strategy import P, R, S, AxisOption

__all__ = ["reshape_dim_map"]


def reshape_dim_map(src: tuple[int, ...], dst: tuple[int, ...]) -> dict[int, int]:
    """Input dim → output dim pairs whose shards coincide (module docstring)."""
    dst_prefix = {}
    for e in range(len(dst)):
        if dst[e] > 1:
            dst_prefix.setdefault(math.prod(dst[:e]), e)
    return {d: dst_prefix[math.prod(src[:d])] for d in range(len(src))
            if src[d] > 1 and math.prod(src[:d]) in dst_prefix}


def _mapped(dims: dict[int, int]) -> list[AxisOption]:
    options = [AxisOption((R,), R), AxisOption((P,), P)]
    return options + [AxisOption((S(d),), S(e)) for d, e in dims.items()]


@register_rule("view", "reshape", torch.reshape, torch.flatten, "flatten", "unflatten",
               torch.unflatten, "squeeze", "unsqueeze", torch.squeeze, torch.unsqueeze,
               "view_as", "reshape_as", follows=True)
def reshape_rule(ctx: OpContext) -> list[AxisOption]:
    """Any reshape: the prefix-product dim map."""
    return _mapped(reshape_dim_map(tuple(ctx.shapes[0]), tuple(ctx.out)))


def _permutation(ctx: OpContext) -> list[int]:
    ndim = ctx.operands[0].ndim
    if ctx.op in ("permute", torch.permute):
        dims = ctx.node.args[1:] if ctx.node.op == "call_method" else ctx.arg(1, "dims")
        dims = dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        return [int(d) % ndim for d in dims]
    if ctx.op in ("t", torch.t):
        return list(range(ndim))[::-1]
    a, b = int(ctx.arg(1, "dim0")) % ndim, int(ctx.arg(2, "dim1")) % ndim
    perm = list(range(ndim))
    perm[a], perm[b] = perm[b], perm[a]
    return perm


@register_rule("transpose", "permute", "t", "swapaxes", torch.transpose, torch.permute, torch.t,
               torch.swapaxes, follows=True)
def transpose_rule(ctx: OpContext) -> list[AxisOption]:
    """Output dim ``i`` is input dim ``perm[i]``: the shard moves with it."""
    perm = _permutation(ctx)
    return _mapped({src: dst for dst, src in enumerate(perm)})
