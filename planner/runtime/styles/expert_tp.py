"""Tensor parallelism beside expert parallelism: each routed row's expert work done once per tp group.

With ``tp > 1`` and ``ep > 1`` (Megatron-Core's expert tensor-parallel size 1) the attention and
dense layers are tensor-parallel as planned, and the experts are held whole on each EP rank
(``E/ep`` of them, replicated over ``tp``). Outside sequence parallelism the ``tp`` ranks of a
group hold the same tokens (the residual stream is replicated), so the ``S`` routed rows of a
mixture-of-experts layer are the same ``[S, h]`` on each of them. Rather than have the ``tp``
ranks send and compute the same rows ``tp`` times, tp rank ``i`` takes the rows
``⌊i·S/tp⌋ … ⌊(i+1)·S/tp⌋ − 1`` (:func:`split_rows`), dispatches them over its EP group (the
``ep`` ranks with its tp coordinate), and the expert outputs of the ``tp`` chunks are
all-gathered back to ``[S, h]`` on every tp rank (:func:`gather_rows`) before the combine,
which, like the router, runs replicated. So per tp rank the all-to-alls carry ``S/tp`` rows and
the experts compute ``S/tp`` rows, and one all-gather of the ``S·h`` outputs over tp joins the
forward (its backward takes back the rank's chunk of the replicated gradient) and one of the
``S·h`` row gradients the backward (the split's backward: each rank holds its chunk's
gradient, and the replicated residual stream needs all of them, as Megatron's
scatter-to-sequence-parallel region). The copies of an expert on the ``tp`` ranks each see one
chunk's gradient: :class:`~fxplan.runtime.styles.expert_parallel.ExpertGradSync` sums them over tp.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["chunk_bounds", "split_rows", "gather_rows"]


def chunk_bounds(rows: int, parts: int) -> list[int]:
    """``[⌊i·rows/parts⌋ for i in 0 … parts]``: part ``i`` is rows ``b_i … b_{i+1} − 1``."""
    return [i * rows // parts for i in range(parts + 1)]


def _all_gather_rows(chunk: torch.Tensor, bounds: list[int], group: dist.ProcessGroup
                     ) -> torch.Tensor:
    """The ``[bounds[-1], ·]`` rows of every rank's ``chunk`` (rank ``i``'s are rows
    ``bounds[i] … bounds[i+1] − 1``): each chunk padded to the longest, one all-gather (gloo and NCCL)."""
    parts = len(bounds) - 1
    sizes = [bounds[i + 1] - bounds[i] for i in range(parts)]
    width = max(1, max(sizes))
    padded = chunk.new_zeros((width,) + tuple(chunk.shape[1:]))
    padded[: chunk.size(0)] = chunk
    out = [torch.empty_like(padded) for _ in range(parts)]
    dist.all_gather(out, padded, group=group)
    return torch.cat([out[i][: sizes[i]] for i in range(parts)])


class _Split(torch.autograd.Function):
    """Forward: this rank's chunk of the replicated rows. Backward: every rank's chunk
    gradient all-gathered (the replicated rows' full gradient)."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, rank: int, bounds: list[int],  # type: ignore[override]
                group: dist.ProcessGroup) -> torch.Tensor:
        ctx.bounds, ctx.group = bounds, group
        return rows[bounds[rank]: bounds[rank + 1]].clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return _all_gather_rows(grad.contiguous(), ctx.bounds, ctx.group), None, None, None


class _Gather(torch.autograd.Function):
    """Forward: every rank's chunk all-gathered. Backward: this rank's chunk of the
    (replicated) gradient."""

    @staticmethod
    def forward(ctx, chunk: torch.Tensor, rank: int, bounds: list[int],  # type: ignore[override]
                group: dist.ProcessGroup) -> torch.Tensor:
        ctx.lo, ctx.hi = bounds[rank], bounds[rank + 1]
        return _all_gather_rows(chunk.contiguous(), bounds, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return grad[ctx.lo: ctx.hi].contiguous(), None, None, None


def split_rows(rows: torch.Tensor, rank: int, bounds: list[int], group: dist.ProcessGroup
               ) -> torch.Tensor:
    """Tp rank ``rank``'s chunk ``bounds[rank] … bounds[rank+1] − 1`` of the replicated
    ``rows``; the backward all-gathers the chunks' gradients (module docstring)."""
    return _Split.apply(rows, rank, bounds, group)


def gather_rows(chunk: torch.Tensor, rank: int, bounds: list[int], group: dist.ProcessGroup
                ) -> torch.Tensor:
    """Every tp rank's ``chunk`` in rank order (``[bounds[-1], ·]``, replicated); the
    backward keeps this rank's chunk of the gradient (module docstring)."""
    return _Gather.apply(chunk, rank, bounds, group)
