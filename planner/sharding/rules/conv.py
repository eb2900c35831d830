"""Convolutions and pooling.

    conv   x (N, C, …), W (O, C/g, …), b (O)
           batch            x S(0), W R,    b R     -> S(0)
           output channels  x R,    W S(0), b S(0)  -> S(1)
           input channels   x S(1), W S(1), b R     -> P     (groups = 1 only)
    pool   x (N, C, …)      S(0) -> S(0),  S(1) -> S(1)      (spatial dims replicated)
"""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from fxplan.core.placements import Placement
from fxplan.sharding.context import OpContext
from fxplan.sharding.registry import register_rule
from fxplan.sharding.strategy import P, R, S, AxisOption

POOLS = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
         nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d, nn.AdaptiveMaxPool2d,
         F.max_pool2d, F.avg_pool2d, F.adaptive_avg_pool2d, F.adaptive_max_pool2d)


def _groups(ctx: OpContext) -> int:
    return ctx.module.groups if ctx.module is not None else int(ctx.arg(6, "groups", 1))


@register_rule(nn.Conv1d, nn.Conv2d, nn.Conv3d, F.conv1d, F.conv2d, F.conv3d)
def conv_rule(ctx: OpContext) -> list[AxisOption]:
    """Batch, output-channel, and (ungrouped) input-channel parallel convolutions."""
    with_bias = len(ctx.operands) > 2

    def option(x: Placement, w: Placement, b: Placement, out: Placement) -> AxisOption:
        return AxisOption((x, w, b) if with_bias else (x, w), out)

    options = [option(R, R, R, R), option(S(0), R, R, S(0)), option(R, S(0), S(0), S(1))]
    if _groups(ctx) == 1:
        options.append(option(S(1), S(1), R, P))
    return options


@register_rule(*POOLS, follows=True)
def pool_rule(ctx: OpContext) -> list[AxisOption]:
    """Batch or channel parallel pooling."""
    return [AxisOption((R,), R), AxisOption((S(0),), S(0)), AxisOption((S(1),), S(1))]
