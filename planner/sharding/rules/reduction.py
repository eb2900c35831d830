"""Reductions over ``dim`` (``sum``, ``mean``; ``max``/``min``/``amax`` without Partial).

A sum over a sharded dim leaves each rank a partial sum, so ``S(d) -> P`` for a reduced
``d`` (a mean is a sum scaled by a constant: the same); kept dims follow (their position
shifts when ``keepdim`` is false). ``max``-like reductions keep only the kept-dim options.
"""

from __future__ import annotations

import torch

from fxplan.sharding.context import OpContext
from fxplan.sharding.registry import register_rule
from fxplan.sharding.strategy import P, R, S, AxisOption

SUMS = (torch.sum, torch.mean, "sum", "mean")
EXTREMES = (torch.amax, torch.amin, "amax", "amin")


def _reduced(ctx: OpContext) -> tuple[set[int], dict[int, int]]:
    ndim = ctx.operands[0].ndim
    dim = ctx.arg(1, "dim")
    keepdim = bool(ctx.arg(2, "keepdim", False))
    dims = set(range(ndim)) if dim is None else {int(d) % ndim for d in (dim if isinstance(dim, (tuple, list)) else [dim])}
    kept = [d for d in range(ndim) if d not in dims]
    return dims, {d: (d if keepdim else kept.index(d)) for d in kept}


def _options(ctx: OpContext, partial: bool) -> list[AxisOption]:
    reduced, kept = _reduced(ctx)
    options = [AxisOption((R,), R)] + [AxisOption((S(d),), S(e)) for d, e in kept.items()]
    if partial:
        options += [AxisOption((S(d),), P) for d in sorted(reduced)] + [AxisOption((P,), P)]
    return options


@register_rule(*SUMS)
def sum_rule(ctx: OpContext) -> list[AxisOption]:
    """Sums and means: reduced shards become partial sums."""
    return _options(ctx, partial=True)


@register_rule(*EXTREMES)
def extreme_rule(ctx: OpContext) -> list[AxisOption]:
    """Max/min: only kept dims may be sharded."""
    return _options(ctx, partial=False)
