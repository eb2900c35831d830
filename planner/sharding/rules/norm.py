"""Normalisations: shard only the dims that are not normalised.

    LayerNorm / RMSNorm over the last k dims   x S(d), d < ndim−k  ->  S(d); weight, bias R
    BatchNorm over (N, spatial) per channel    x S(1) -> S(1), weight/bias S(0)  (channels)
                                               x S(0) -> S(0) with the batch statistics
                                               all-reduced (SyncBatchNorm: mean and variance,
                                               2·C floats, forward and backward)

Sharding the sequence dim of a LayerNorm is what sequence parallelism is.
"""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from fxplan.sharding.context import OpContext
from fxplan.sharding.registry import register_rule
from fxplan.sharding.strategy import R, S, AxisOption, Comm

_RMS_NORM_FN = getattr(F, "rms_norm", None)


def _normalized_ndim(ctx: OpContext) -> int:
    if ctx.module is not None:
        return len(ctx.module.normalized_shape)
    shape = ctx.arg(1, "normalized_shape")
    return len(shape) if isinstance(shape, (tuple, list)) else 1


@register_rule(nn.LayerNorm, nn.RMSNorm, F.layer_norm, *([_RMS_NORM_FN] if _RMS_NORM_FN else []))
def layer_norm_rule(ctx: OpContext) -> list[AxisOption]:
    """Shard a leading (non-normalised) dim of x and the output; affine parameters replicated."""
    ndim = ctx.operands[0].ndim
    rest = tuple(R for _ in ctx.operands[1:])
    options = [AxisOption((R, *rest), R)]
    for dim in range(ndim - _normalized_ndim(ctx)):
        options.append(AxisOption((S(dim), *rest), S(dim)))
    return options


@register_rule(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, F.batch_norm)
def batch_norm_rule(ctx: OpContext) -> list[AxisOption]:
    """Channels sharded with their affine parameters, or the batch with synced statistics."""
    rest = len(ctx.operands) - 1
    x_ndim = ctx.operands[0].ndim
    stats = Comm("all_reduce", operand=0, drop_dims=tuple(d for d in range(x_ndim) if d != 1),
                 count=2, backward=True)
    return [
        AxisOption((R,) + (R,) * rest, R),
        AxisOption((S(1),) + (S(0),) * rest, S(1)),
        AxisOption((S(0),) + (R,) * rest, S(0), (stats,), note="synchronised batch statistics"),
    ]
