"""Strided shards moved by hand: ``_StridedShard`` to ``Replicate`` and back.

A fused projection split head-parallel (the q, k and v blocks of one weight, each sharded over
tp: :mod:`fxplan.runtime.styles.tp_attention`, :mod:`fxplan.runtime.styles.tp_fused_qkv`) is a DTensor
placed ``_StridedShard(d, split_factor=f)`` on its tp mesh dim: along tensor dim ``d`` the
full tensor is ``f`` pieces of ``a`` rows, each cut into ``t`` chunks, and mesh rank ``r``
holds chunk ``r`` of every piece — global chunks ``j·t + r`` for ``j = 0 … f−1``, in order.

DTensor's own redistribution of such a placement changed meaning across the supported torch
releases (torch 2.11 reads a ``_StridedShard`` as an encoded shard order and refuses this one),
so the runtime moves it itself, the same way on every release, wherever it is the only
placement that splits its tensor dim (a ``_StridedShard`` that FSDP2 puts on the dp dim of a
tensor also sharded over tp, an ordering of two shards of one dim, stays DTensor's):

* :func:`unstrided` — every strided mesh dim to ``Replicate``: an all-gather of the local
  shards over that dim's group, the chunks put back in global order (``chunk j·t + r`` comes
  from rank ``r``'s block ``j``); other mesh dims keep their placements;
* :func:`restrided` — the inverse, a local selection, no communication (its backward hands
  each rank's rows back as a ``Partial`` gradient, summed once after the backward).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement, _StridedShard

__all__ = ["has_strided", "unstrided", "restrided", "full_tensor"]


def _own(placements: Sequence[Placement], m: int) -> bool:
    """Whether placement ``m`` is a ``_StridedShard`` that no other mesh dim's shard shares its
    tensor dim with (the module docstring's case, moved by hand)."""
    placement = placements[m]
    if not isinstance(placement, _StridedShard):
        return False
    return not any(i != m and isinstance(p, (Shard, _StridedShard)) and p.dim == placement.dim
                   for i, p in enumerate(placements))


def has_strided(value: object) -> bool:
    """Whether ``value`` is a DTensor with a ``_StridedShard`` placement moved by hand here."""
    return isinstance(value, DTensor) and any(_own(value.placements, m)
                                              for m in range(len(value.placements)))


def unstrided(tensor: DTensor) -> DTensor:
    """``tensor`` with each ``_StridedShard`` mesh dim made ``Replicate`` (module docstring)."""
    mesh = tensor.device_mesh
    local = tensor.to_local()
    placements: list[Placement] = list(tensor.placements)
    for m, placement in enumerate(tensor.placements):
        if not _own(tensor.placements, m):
            continue
        t, f, d = mesh.size(m), placement.split_factor, placement.dim
        pieces = [torch.empty_like(local) for _ in range(t)]
        dist.all_gather(pieces, local.contiguous(), group=mesh.get_group(m))
        blocks = [piece.chunk(f, dim=d) for piece in pieces]
        local = torch.cat([blocks[r][j] for j in range(f) for r in range(t)], dim=d)
        placements[m] = Replicate()
    return DTensor.from_local(local, mesh, placements, run_check=False, shape=tensor.shape,
                              stride=tensor.stride())


def restrided(tensor: DTensor, placements: Sequence[Placement]) -> DTensor:
    """``tensor`` (``Replicate`` on each mesh dim where ``placements`` has a ``_StridedShard``)
    placed as ``placements``; the strided dims by local selection, the rest by DTensor."""
    mesh = tensor.device_mesh
    own = [_own(placements, m) for m in range(len(placements))]
    plain = [Replicate() if mine else p for p, mine in zip(placements, own)]
    source = tensor.redistribute(mesh, plain) if tuple(plain) != tuple(tensor.placements) else tensor
    # backward: each rank's gradient is its rows in a zero full tensor, summed over the strided
    # dims (an all-gather), as DTensor's own Replicate → _StridedShard does
    local = source.to_local(grad_placements=[Partial() if mine else p for p, mine in zip(plain, own)])
    coordinate = mesh.get_coordinate() or [0] * mesh.ndim
    for m, placement in enumerate(placements):
        if not own[m]:
            continue
        t, f, d, r = mesh.size(m), placement.split_factor, placement.dim, coordinate[m]
        chunks = local.chunk(f * t, dim=d)
        local = torch.cat([chunks[j * t + r] for j in range(f)], dim=d)
    return DTensor.from_local(local, mesh, list(placements), run_check=False, shape=tensor.shape,
                              stride=tensor.stride())


def full_tensor(tensor: DTensor) -> torch.Tensor:
    """``tensor.full_tensor()``, the strided dims gathered by :func:`unstrided` first."""
    return (unstrided(tensor) if has_strided(tensor) else tensor).full_tensor()
