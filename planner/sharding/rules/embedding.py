"""Embedding lookup ``W[idx]`` for ``idx`` of shape (…) and ``W`` of shape (V, C).

    batch / sequence   idx S(d), W R      -> S(d)
    column parallel    idx R,   W S(1)    -> S(last)    (each rank looks up its C/n columns)
    vocab parallel     idx R,   W S(0)    -> P          (each rank looks up the ids in its
                                                         vocabulary range and zeros the rest;
                                                         the sum over ranks is the lookup)
"""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from fxplan.sharding.context import OpContext
from fxplan.sharding.registry import register_rule
from fxplan.sharding.strategy import P, R, S, AxisOption

import torch


@register_rule(nn.Embedding, F.embedding)
def embedding_rule(ctx: OpContext) -> list[AxisOption]:
    """Batch/sequence, column- and vocabulary-parallel lookups."""
    idx_ndim = ctx.operands[0].ndim
    options = [AxisOption((R, R), R), AxisOption((R, S(1)), S(idx_ndim)),
               AxisOption((R, S(0)), P, note="vocab-parallel lookup (masked ids)")]
    options += [AxisOption((S(d), R), S(d)) for d in range(idx_ndim)]
    return options


@register_rule(torch.ops.aten.embedding.default)
def aten_embedding_rule(ctx: OpContext) -> list[AxisOption]:
    """``aten.embedding(weight, indices)``: the same lookups, operands in ATen's order."""
    idx_ndim = ctx.operands[1].ndim
    options = [AxisOption((R, R), R), AxisOption((S(1), R), S(idx_ndim)),
               AxisOption((S(0), R), P, note="vocab-parallel lookup (masked ids)")]
    options += [AxisOption((R, S(d)), S(d)) for d in range(idx_ndim)]
    return options
