"""Elementwise ops: "follow the input".

* unary activations and dropout — the output takes the input's placement, any dim;
* linear unary ops (negation, scaling by a constant, dtype casts, ``contiguous``) — also
  ``Partial`` in, ``Partial`` out;
* n-ary ops with broadcasting — shard an output dim together with each operand's aligned dim
  (operands broadcast along it stay replicated). ``add``/``sub`` of partial sums is a partial
  sum, and a product is linear in each factor, so ``mul`` takes one ``Partial`` factor with
  the others replicated (``div`` only in its numerator).

A non-linear op never takes ``Partial``: the reduction must happen first (the reshard on the
edge prices it, e.g. all-reduce or reduce-scatter before a dropout).
"""

from __future__ import annotations

import operator

import torch
import torch.nn as nn
import torch.nn.functional as F

from fxplan.sharding.context import OpContext
from fxplan.sharding.registry import register_rule
from fxplan.sharding.rules.common import follow_options, pointwise_options
from fxplan.sharding.strategy import AxisOption

ACTIVATIONS = (nn.GELU, nn.ReLU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Dropout, nn.LeakyReLU, nn.Mish,
               F.gelu, F.relu, F.silu, F.tanh, F.sigmoid, F.dropout, F.leaky_relu, F.mish,
               torch.relu, torch.tanh, torch.sigmoid, torch.exp, torch.rsqrt, torch.sqrt, torch.pow,
               torch.square, "relu", "gelu", "tanh", "sigmoid", "exp", "rsqrt", "sqrt", "pow",
               "square", "masked_fill", operator.pow, torch.nn.Identity,
               # ATen names (torch.export graphs; fxplan.sharding.aten)
               "silu", "dropout", "erf", "sin", "cos", "abs", "log", "reciprocal", "clamp")
LINEAR_UNARY = (operator.neg, torch.neg, "neg", "contiguous", "float", "half", "bfloat16", "to",
                "type", "type_as", "clone", "detach", torch.clone, "alias", "to_copy",
                "lift_fresh_copy")
ADDITIVE = (operator.add, operator.sub, torch.add, torch.sub, "add", "sub")
MULTIPLICATIVE = (operator.mul, torch.mul, "mul")
DIVISION = (operator.truediv, torch.div, "div")
OTHER_NARY = (torch.where, torch.maximum, torch.minimum, "where", "maximum", "minimum")


def _options(ctx: OpContext, linear_groups: list[set[int]]) -> list[AxisOption]:
    if len(ctx.operands) == 1 and tuple(ctx.shapes[0]) == tuple(ctx.out):
        return follow_options(len(ctx.out), linear=bool(linear_groups))
    return pointwise_options(ctx.shapes, ctx.out, linear_groups)


@register_rule(*ACTIVATIONS, *OTHER_NARY, follows=True)
def nonlinear_pointwise_rule(ctx: OpContext) -> list[AxisOption]:
    """Follow the input on any dim; no ``Partial``."""
    return _options(ctx, [])


@register_rule(*LINEAR_UNARY, follows=True)
def linear_unary_rule(ctx: OpContext) -> list[AxisOption]:
    """Follow the input on any dim, ``Partial`` included."""
    return _options(ctx, [set(range(len(ctx.operands)))])


@register_rule(*ADDITIVE, follows=True)
def additive_rule(ctx: OpContext) -> list[AxisOption]:
    """``a ± b``: partial sums add (all tensor operands ``Partial`` together)."""
    return _options(ctx, [set(range(len(ctx.operands)))])


@register_rule(*MULTIPLICATIVE, follows=True)
def multiplicative_rule(ctx: OpContext) -> list[AxisOption]:
    """``a · b``: linear in each factor, so one factor may be ``Partial``."""
    return _options(ctx, [{i} for i in range(len(ctx.operands))])


@register_rule(*DIVISION, follows=True)
def division_rule(ctx: OpContext) -> list[AxisOption]:
    """``a / b``: linear in the numerator only."""
    if ctx.operands and ctx.operands[0].producer is ctx.node.args[0]:
        return _options(ctx, [{0}])
    return _options(ctx, [])
