"""Selecting and joining: getitem, narrow, split/chunk, cat.

* ``getitem`` of a multi-output node (``q, k, v = x.split(…)``) — the element follows.
* ``getitem`` with basic indexing — dims kept whole follow; a dim cut by a slice or an
  integer must be replicated (a shard would hold a different range); ``None`` adds a dim.
  Advanced (tensor) indexing falls back to replicated operands.
* ``narrow`` — as a slice of one dim (a full-length narrow is the identity).
* ``split``/``chunk`` into equal pieces along ``dim`` — other dims follow. Sharding ``dim``
  itself is allowed when every piece divides by the axis: the input is then taken as laid
  out *interleaved* (rank r holds the r-th shard of every piece, Megatron's fused-QKV
  layout), which the rewrite obtains by permuting the producing weight's rows once; the
  strategy carries a note saying so.
* ``cat`` along ``dim`` — other dims follow in all inputs.

All are linear: ``Partial`` passes through.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from fxplan.sharding.context import OpContext
from fxplan.sharding.registry import register_rule
from fxplan.sharding.rules.common import follow_options
from fxplan.sharding.strategy import P, R, S, AxisOption

INTERLEAVED = "split of a sharded dim: producer laid out interleaved"


def _index_map(index: Any, ndim: int, shape: tuple[int, ...]) -> dict[int, int] | None:
    """Input dims kept whole → output dim, or ``None`` for advanced indexing."""
    items = list(index) if isinstance(index, tuple) else [index]
    if any(not isinstance(i, (int, slice, type(None), type(Ellipsis))) for i in items):
        return None
    if Ellipsis in items:
        at = items.index(Ellipsis)
        used = sum(1 for i in items if i is not None and i is not Ellipsis)
        items[at:at + 1] = [slice(None)] * (ndim - used)
    items += [slice(None)] * (ndim - sum(1 for i in items if i is not None))
    kept, d, e = {}, 0, 0
    for item in items:
        if item is None:
            e += 1
            continue
        if isinstance(item, slice):
            if _full(item, shape[d]):
                kept[d] = e
            e += 1
        d += 1
    return kept


def _full(item: slice, size: int) -> bool:
    start, stop, step = item.start, item.stop, item.step
    return (start in (None, 0) and step in (None, 1)
            and (stop is None or (isinstance(stop, int) and stop >= size)))


def _kept_options(kept: dict[int, int]) -> list[AxisOption]:
    return [AxisOption((R,), R), AxisOption((P,), P)] + [AxisOption((S(d),), S(e)) for d, e in kept.items()]


@register_rule(operator.getitem, follows=True)
def getitem_rule(ctx: OpContext) -> list[AxisOption]:
    """Element of a multi-output node, or basic indexing of a tensor."""
    operand = ctx.operands[0]
    if operand.element is not None:
        return follow_options(operand.ndim, linear=True)
    kept = _index_map(ctx.node.args[1], operand.ndim, operand.shape)
    if kept is None:
        return [AxisOption(tuple(R for _ in ctx.operands), R)]
    return _kept_options(kept)


@register_rule("narrow", torch.narrow, follows=True)
def narrow_rule(ctx: OpContext) -> list[AxisOption]:
    """``narrow(dim, start, length)``: the narrowed dim replicated unless narrowed to itself."""
    shape = ctx.operands[0].shape
    dim = int(ctx.arg(1, "dim")) % len(shape)
    whole = ctx.out[dim] == shape[dim]
    return _kept_options({d: d for d in range(len(shape)) if d != dim or whole})


@register_rule("split", "chunk", torch.split, torch.chunk, follows=True)
def split_rule(ctx: OpContext) -> list[AxisOption]:
    """Equal pieces along ``dim``: other dims follow; ``dim`` itself interleaved."""
    shape = ctx.operands[0].shape
    dim = int(ctx.arg(2, "dim", 0)) % len(shape)
    pieces = [piece[dim] for piece in ctx.out]
    options = _kept_options({d: d for d in range(len(shape)) if d != dim})
    if len(set(pieces)) == 1 and len(pieces) > 1:
        options.append(AxisOption((S(dim),), S(dim), note=INTERLEAVED))
    return options


@register_rule(torch.cat, torch.concat, torch.concatenate)
def cat_rule(ctx: OpContext) -> list[AxisOption]:
    """Concatenation along ``dim``: any other dim sharded in every input."""
    ndim = len(ctx.out)
    dim = int(ctx.arg(1, "dim", 0)) % ndim
    count = len(ctx.operands)
    options = [AxisOption((R,) * count, R), AxisOption((P,) * count, P)]
    return options + [AxisOption((S(d),) * count, S(d)) for d in range(ndim) if d != dim]
