"""Graph inputs and attributes (``placeholder``, ``get_attr``): any placement, no operands.

A data loader can hand each rank any slice of a batch, and a buffer or parameter can be
stored in any layout, so every dim (or none) may be sharded; the consumers' rules and the
reshards on the edges decide.
"""

from __future__ import annotations

from fxplan.sharding.context import OpContext, tensor_shape
from fxplan.sharding.registry import register_rule
from fxplan.sharding.strategy import R, S, AxisOption


@register_rule("placeholder", "get_attr")
def source_rule(ctx: OpContext) -> list[AxisOption]:
    """``R`` or ``S(d)`` for each dim of the value."""
    shape = tensor_shape(ctx.out) or ()
    return [AxisOption((), R)] + [AxisOption((), S(d)) for d in range(len(shape))]
