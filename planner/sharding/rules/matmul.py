"""The matmul family by einsum equations built from the operand shapes.

    linear   x(…,k) · W(n,k)ᵀ + b(n)      "…k,nk->…n"   b follows the output's n dim
    matmul   a(…,m,k) @ b(…,k,n)          "…mk,…kn->…mn" (batch dims broadcast, right-aligned)
    addmm    c + a(m,k) @ b(k,n)           c follows the output, broadcast
    baddbmm  c + a(b,m,k) @ b(b,k,n)

A batch dim of size 1 in one operand broadcast against the other gets its own letter, so
only the operand that really has the dim is sharded on it.
"""

from __future__ import annotations

import operator
import string
from typing import Sequence

import torch
import torch.nn.functional as F

from fxplan.core.placements import Shard
from fxplan.sharding.context import OpContext
from fxplan.sharding.einsum import einsum_options
from fxplan.sharding.registry import register_rule
from fxplan.sharding.rules.common import broadcast_to_operand
from fxplan.sharding.strategy import R, S, AxisOption

_LETTERS = string.ascii_lowercase


def matmul_equation(a: Sequence[int], b: Sequence[int]) -> str:
    """``torch.matmul`` semantics for ``a``, ``b`` of rank ≥ 1 as an einsum equation."""
    if len(a) == 1 and len(b) == 1:
        return "k,k->"
    fresh = iter(_LETTERS.replace("m", "").replace("n", "").replace("k", ""))
    a_core = "k" if len(a) == 1 else "mk"
    b_core = "k" if len(b) == 1 else "kn"
    a_batch, b_batch = list(a[: len(a) - len(a_core)]), list(b[: len(b) - len(b_core)])
    width = max(len(a_batch), len(b_batch))
    a_letters, b_letters, out_letters = [], [], []
    for i in range(width):
        da = a_batch[i - (width - len(a_batch))] if i >= width - len(a_batch) else None
        db = b_batch[i - (width - len(b_batch))] if i >= width - len(b_batch) else None
        if da is not None and db is not None and da == db:  # a shared batch dim
            letter = next(fresh)
            a_letters.append(letter)
            b_letters.append(letter)
            out_letters.append(letter)
            continue
        # broadcast: each side that has the dim gets its own letter; the output keeps the
        # letter of the side with the full size
        la = next(fresh) if da is not None else None
        lb = next(fresh) if db is not None else None
        a_letters += [la] if la else []
        b_letters += [lb] if lb else []
        out_letters.append(la if la and (da or 1) >= (db or 1) else lb)
    out_core = ("m" if len(a) > 1 else "") + ("n" if len(b) > 1 else "")
    return f"{''.join(a_letters)}{a_core},{''.join(b_letters)}{b_core}->{''.join(out_letters)}{out_core}"


@register_rule(torch.nn.Linear, F.linear)
def linear_rule(ctx: OpContext) -> list[AxisOption]:
    """``x W^T (+ b)``: data/sequence parallel on x's leading dims, column parallel on n
    (bias sharded alike), row parallel on k (output Partial, bias added once)."""
    x = ctx.shapes[0]
    lead = _LETTERS[: len(x) - 1].replace("k", "y").replace("n", "z")
    options = einsum_options(f"{lead}k,nk->{lead}n")
    if len(ctx.operands) < 3:
        return options
    out_n = len(x) - 1
    return [AxisOption((*o.inputs, S(0) if o.output == Shard(out_n) else R), o.output) for o in options]


@register_rule(torch.matmul, operator.matmul, torch.bmm, torch.mm, "matmul", "bmm", "mm")
def matmul_rule(ctx: OpContext) -> list[AxisOption]:
    """``a @ b`` with torch's broadcasting (batch, m, n, and contracted k)."""
    return einsum_options(matmul_equation(ctx.shapes[0], ctx.shapes[1]))


@register_rule(torch.addmm, torch.baddbmm, "addmm", "baddbmm")
def addmm_rule(ctx: OpContext) -> list[AxisOption]:
    """``c + a @ b``: the product's options, ``c`` following the output with broadcasting."""
    c, a, b = ctx.shapes[:3]
    out = ctx.out
    return [AxisOption((broadcast_to_operand(o.output, out, c), *o.inputs), o.output)
            for o in einsum_options(matmul_equation(a, b))]
