"""Scaled dot-product attention: shard the batch or the heads.

    q (B, H, T, D), k and v (B, Hkv, S, D)  ->  out (B, H, T, D)

    batch   q, k, v S(0)  -> S(0)
    heads   q, k, v S(1)  -> S(1)     (with grouped-query attention a shard of the Hkv heads
                                       serves exactly its H/Hkv query heads, so this holds
                                       whenever both head counts divide)

A mask operand follows on the dims it has at full size, replicated where it broadcasts. The
sequence dim is not sharded: a causal mask assumes the block starts at position 0.
"""

from __future__ import annotations

import torch.nn.functional as F

from fxplan.sharding.context import OpContext
from fxplan.sharding.registry import register_rule
from fxplan.sharding.rules.common import broadcast_to_operand
from fxplan.sharding.strategy import R, S, AxisOption


@register_rule(F.scaled_dot_product_attention)
def sdpa_rule(ctx: OpContext) -> list[AxisOption]:
    """Batch- or head-parallel attention; the rest replicated."""
    out = ctx.out
    options = [AxisOption(tuple(R for _ in ctx.operands), R)]
    for dim in (0, 1):
        inputs = [S(dim), S(dim), S(dim)]
        inputs += [broadcast_to_operand(S(dim), out, s) for s in ctx.shapes[3:]]
        options.append(AxisOption(tuple(inputs), S(dim)))
    return options
