"""Cross-entropy of logits (N, V, …) against class ids (N, …).

    batch parallel   logits S(0), ids S(0)  ->  P  (a mean over the batch is a sum of the
                                                    ranks' shares; S(0) for reduction='none')
    vocab parallel   logits S(1), ids R     ->  R  (Megatron's parallel cross-entropy: each rank
                                                    has V/n classes; the row max, the sum of
                                                    exponentials and the target logit are
                                                    all-reduced — three all-reduces of N floats
                                                    — and every rank then holds the loss)
"""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from fxplan.sharding.context import OpContext
from fxplan.sharding.registry import register_rule
from fxplan.sharding.strategy import P, R, S, AxisOption, Comm


@register_rule(F.cross_entropy, nn.CrossEntropyLoss)
def cross_entropy_rule(ctx: OpContext) -> list[AxisOption]:
    """Batch- or vocabulary-parallel loss."""
    reduced = ctx.out == ()
    stats = Comm("all_reduce", operand=0, drop_dims=(1,), count=3)
    rest = tuple(R for _ in ctx.operands[2:])
    return [
        AxisOption((R, R, *rest), R),
        AxisOption((S(0), S(0), *rest), P if reduced else S(0)),
        AxisOption((S(1), R, *rest), R, (stats,), note="vocab-parallel loss"),
    ]
