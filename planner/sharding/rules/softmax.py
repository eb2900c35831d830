"""Softmax and log-softmax: any dim but the one normalised over."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from fxplan.sharding.context import OpContext
from fxplan.sharding.registry import register_rule
from fxplan.sharding.strategy import R, S, AxisOption


@register_rule(F.softmax, F.log_softmax, torch.softmax, torch.log_softmax, nn.Softmax, nn.LogSoftmax,
               "softmax", "log_softmax")
def softmax_rule(ctx: OpContext) -> list[AxisOption]:
    """Shard every dim except ``dim`` (sharding it would need a cross-rank max and sum)."""
    ndim = ctx.operands[0].ndim
    dim = ctx.module.dim if ctx.module is not None else ctx.arg(1, "dim")
    dim = -1 if dim is None else dim % ndim
    return [AxisOption((R,), R)] + [AxisOption((S(d),), S(d)) for d in range(ndim) if d != dim]
