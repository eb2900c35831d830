"""From one-axis options to full strategies on a mesh.

Mesh axes are independent, so the strategies of an op on a mesh of shape ``(n_0 … n_{k-1})``
are the products of one :class:`~fxplan.sharding.strategy.AxisOption` per axis, kept when
every sharded tensor dim divides evenly:

    for each tensor t and dim d:   t.shape[d]  mod  Π_{a : t sharded on d over a} n_a  = 0

An axis of size 1 takes only the replicated option (any other says the same thing), and
duplicates are dropped.
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

from fxplan.core.placements import Placements, Replicate, Shard
from fxplan.sharding.context import tensor_shape
from fxplan.sharding.strategy import AxisOption, OpStrategy

__all__ = ["expand_options", "divides", "normalise"]


def normalise(option: AxisOption, ndims: Sequence[int], out_ndim: int) -> AxisOption:
    """``Shard(-1)`` → ``Shard(ndim-1)`` for every operand and the output."""
    def fix(p: Any, ndim: int) -> Any:
        return Shard(p.dim % ndim) if isinstance(p, Shard) and ndim else p

    inputs = tuple(fix(p, n) for p, n in zip(option.inputs, ndims, strict=True))
    return AxisOption(inputs, fix(option.output, out_ndim), option.comms, option.note)


def divides(shape: Sequence[int], placements: Placements, mesh_shape: Sequence[int]) -> bool:
    """Whether ``placements`` shard ``shape`` evenly (and shard no scalar, no dim twice over
    a non-dividing product)."""
    ways = [1] * len(shape)
    for placement, n in zip(placements, mesh_shape):
        if isinstance(placement, Shard):
            if not shape or placement.dim >= len(shape):
                return False
            ways[placement.dim] *= n
    return all(size % w == 0 for size, w in zip(shape, ways))


def _replicated(option: AxisOption) -> bool:
    return all(p is None or isinstance(p, Replicate) for p in option.inputs) and isinstance(option.output, Replicate)


def expand_options(options: Sequence[AxisOption], mesh_shape: Sequence[int],
                   operand_shapes: Sequence[Sequence[int]], out_shape: Any) -> list[OpStrategy]:
    """All valid :class:`OpStrategy` of an op with ``options`` per axis (module docstring)."""
    out_shapes = [out_shape] if tensor_shape(out_shape) is not None else list(out_shape or [()])
    out_ndim = len(out_shapes[0])
    options = list(dict.fromkeys(normalise(o, [len(s) for s in operand_shapes], out_ndim) for o in options))
    trivial = [o for o in options if _replicated(o)] or options[:1]
    per_axis = [trivial if n == 1 else options for n in mesh_shape]
    strategies: dict[tuple, OpStrategy] = {}
    for combo in itertools.product(*per_axis):
        strategy = OpStrategy.from_axes(combo)
        if strategy.inputs and any(
            p is not None and not divides(shape, p, mesh_shape)
            for p, shape in zip(strategy.inputs, operand_shapes)
        ):
            continue
        if not all(divides(s, strategy.output, mesh_shape) for s in out_shapes):
            continue
        strategies.setdefault((strategy.inputs, strategy.output), strategy)
    return list(strategies.values())

