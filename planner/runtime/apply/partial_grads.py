"""Reduce every ``Partial`` gradient once, in one flattened all-reduce per mesh group.

Under tensor parallelism with sequence parallelism, a replicated parameter applied to a
sequence-sharded activation (the position embedding, every layer norm's weight and bias)
gets a gradient that DTensor leaves as ``Partial(sum)``: each tp rank holds the sum over its
sequence shard, and the true gradient is ``g = Σ_ranks g_r``. Every later read of such a
gradient (the clipping norm, each of AdamW's three reads of ``grad``) redistributes it
``Partial → Replicate`` anew, one all-reduce per read and per tensor.

:func:`reduce_partial_grads` runs after the backward and before clipping. It groups the
``Partial`` gradients by ``(mesh, partial mesh dims, dtype, reduce op)``, concatenates each
group's local tensors into one flat buffer, all-reduces that buffer once per partial mesh
dimension (``sum``; ``avg`` divides by the group size afterwards), and puts back, for every
parameter, a gradient with the parameter's own placements. For ``n`` Partial gradients in
``k`` groups that is ``k`` collectives (one for gpt-tiny under tp=2 sp) instead of ``n`` per
read; the values are the same sums (each element is reduced once, in the same group).

A ``Partial`` gradient whose parameter is not ``Replicate`` on the partial dimension (it
would need a reduce-scatter), or whose other placements differ from its parameter's, is
redistributed on its own — a fallback, logged.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any, Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Partial, Replicate

from fxplan.core.fallbacks import record_fallback

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.runtime.apply.sharded_module import ShardedModule

__all__ = ["reduce_partial_grads", "reduce_partial_params"]


def _flattenable(grad: DTensor, param: DTensor) -> bool:
    """``grad`` is ``Partial(sum|avg)`` only where ``param`` is ``Replicate`` and equals
    ``param``'s placements elsewhere (one reduce op over all its partial dims)."""
    ops = {p.reduce_op for p in grad.placements if isinstance(p, Partial)}
    if len(ops) != 1 or not ops <= {"sum", "avg"}:
        return False
    for g, p in zip(grad.placements, param.placements):
        if isinstance(g, Partial):
            if not isinstance(p, Replicate):
                return False
        elif g != p:
            return False
    return True


def reduce_partial_params(params: Iterable[torch.nn.Parameter]) -> int:
    """Reduce the ``Partial`` gradients of ``params`` to their parameters' placements in place
    (collective over each such gradient's mesh); returns the number of collectives issued.
    Every rank of a mesh group must pass its parameters in the same order."""
    groups: dict[tuple[Any, ...], list[torch.nn.Parameter]] = defaultdict(list)
    seen: set[int] = set()
    collectives = 0
    for param in params:
        grad = param.grad
        if id(param) in seen or not isinstance(grad, DTensor):
            continue
        seen.add(id(param))
        if not any(isinstance(p, Partial) for p in grad.placements):
            continue
        if isinstance(param, DTensor) and _flattenable(grad, param):
            dims = tuple(i for i, p in enumerate(grad.placements) if isinstance(p, Partial))
            op = grad.placements[dims[0]].reduce_op
            groups[(grad.device_mesh, dims, grad.to_local().dtype, op)].append(param)
            continue
        target = param.placements if isinstance(param, DTensor) else [Replicate()] * grad.ndim
        record_fallback(None, f"gradient {grad.placements} → {target} reduced on its own "
                        "(not a flattenable Partial → Replicate)")
        param.grad = grad.redistribute(grad.device_mesh, target)
        collectives += 1
    for (mesh, dims, dtype, op), members in groups.items():
        locals_ = [p.grad.to_local() for p in members]
        flat = torch.cat([t.reshape(-1) for t in locals_])
        for dim in dims:
            dist.all_reduce(flat, group=mesh.get_group(dim))
            collectives += 1
            if op == "avg":
                flat.div_(mesh.size(dim))
        offset = 0
        for param, local in zip(members, locals_):
            grad = param.grad
            reduced = flat[offset:offset + local.numel()].view_as(local)
            offset += local.numel()
            param.grad = DTensor.from_local(reduced, mesh, param.placements, run_check=False,
                                            shape=grad.shape, stride=grad.stride())
    return collectives


def reduce_partial_grads(sharded: "ShardedModule") -> int:
    """:func:`reduce_partial_params` over this rank's parameters (the step calls it after the
    backward, before clipping and the optimizer)."""
    return reduce_partial_params(sharded.named_parameters().values())
