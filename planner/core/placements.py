"""Compact placement strings and local shapes for distributed tensors.

A distributed tensor carries one placement per mesh axis, using PyTorch's public types
(:class:`~torch.distributed.tensor.Shard`, :class:`~torch.distributed.tensor.Replicate`,
:class:`~torch.distributed.tensor.Partial`). fxplan prints them compactly, one token per
axis, in mesh-axis order:

    ``S(d)``  shard tensor dim ``d`` over the axis
    ``R``     replicate over the axis
    ``P``     partial sum over the axis (each rank holds an addend)

so ``S(0)R`` is "batch-sharded over axis 0, replicated over axis 1". The local shape of a
tensor with global shape ``g`` is ``g[d] / n_a`` on every dim ``d`` sharded by an axis ``a``
of size ``n_a`` (ceil division, as torch pads uneven shards).
"""

from __future__ import annotations

import math
import re
from typing import Sequence

from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

__all__ = [
    "Placement",
    "Partial",
    "Replicate",
    "Shard",
    "format_placements",
    "parse_placements",
    "local_shape",
    "shard_factor",
]

_TOKEN = re.compile(r"S\((-?\d+)\)|R|P")


def format_placement(placement: Placement) -> str:
    """One token: ``S(d)``, ``R`` or ``P``."""
    if isinstance(placement, Shard):
        return f"S({placement.dim})"
    if isinstance(placement, Replicate):
        return "R"
    if isinstance(placement, Partial):
        return "P"
    raise TypeError(f"unknown placement type {type(placement).__name__}")


def format_placements(placements: Sequence[Placement]) -> str:
    """``(Shard(0), Replicate())`` → ``"S(0)R"``."""
    return "".join(format_placement(p) for p in placements)


def parse_placements(text: str) -> tuple[Placement, ...]:
    """``"S(0)R"`` → ``(Shard(0), Replicate())``; the inverse of :func:`format_placements`."""
    placements: list[Placement] = []
    position = 0
    compact = text.replace(" ", "")
    while position < len(compact):
        match = _TOKEN.match(compact, position)
        if match is None:
            raise ValueError(
                f"bad placement string {text!r} at position {position}: expected one token per "
                "mesh axis among S(d), R, P (e.g. 'S(0)R')"
            )
        token = match.group(0)
        if token == "R":
            placements.append(Replicate())
        elif token == "P":
            placements.append(Partial())
        else:
            placements.append(Shard(int(match.group(1))))
        position = match.end()
    return tuple(placements)


def shard_factor(placements: Sequence[Placement], mesh_shape: Sequence[int], ndim: int | None = None) -> int:
    """How many ways the tensor's elements are split: the product of the sizes of the axes
    that shard it (replicated and partial axes hold full-size local tensors)."""
    factor = 1
    for placement, size in zip(placements, mesh_shape, strict=True):
        if isinstance(placement, Shard):
            factor *= size
    return factor


def local_shape(
    global_shape: Sequence[int], placements: Sequence[Placement], mesh_shape: Sequence[int]
) -> tuple[int, ...]:
    """Per-rank shape: ``ceil(g[d] / n_a)`` for each axis ``a`` sharding dim ``d``."""
    shape = list(global_shape)
    for placement, size in zip(placements, mesh_shape, strict=True):
        if isinstance(placement, Shard):
            dim = placement.dim % len(shape) if shape else 0
            if not shape:
                raise ValueError("cannot shard a scalar")
            shape[dim] = math.ceil(shape[dim] / size)
    return tuple(shape)
