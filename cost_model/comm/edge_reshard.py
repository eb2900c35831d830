"""The reshards on one edge of a training graph: the tensor forward, its gradient backward.

Consumer ``v`` reads the output of producer ``u``, laid out ``src``, in the layout ``dst`` it
needs. One training step moves the tensor forward and its gradient back, per mesh axis::

    forward   reshard(src → dst)
    backward  reshard(grad(dst) → grad(src))          only when the tensor needs a gradient

    grad(dst) = P    if dst = R and v's work is split over the axis (each rank's share of v
                     yields a partial gradient of a replicated input: Megatron's f/g pair)
              = R    if dst = P
              = dst  otherwise
    grad(src) = R if src = P else src

Both directions are priced by :func:`cost_model.comm.reshard.reshard_cost`. The intra-op solver
(:class:`fxplan.intra_op.mesh_cost.MeshCost`) and :func:`cost_model.step.estimate.estimate` (for
explicit placements, :mod:`cost_model.step.layer_costs`) call these functions, so one rule prices
a placement's communication in both.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from fxplan.cost_model.comm.mesh import LogicalMesh
from fxplan.core.placements import Partial, Placement, Replicate
from fxplan.cost_model.comm.reshard import reshard_cost

__all__ = ["gradient_placements", "edge_collectives"]

#: A collective as the cost model's stage pricing takes it: ``(kind, nccl-tests bytes)``.
Event = tuple[str, float]


def _grad_of_input(placement: Placement, split: bool) -> Placement:
    if isinstance(placement, Replicate):
        return Partial() if split else Replicate()
    return Replicate() if isinstance(placement, Partial) else placement


def gradient_placements(src: Sequence[Placement], dst: Sequence[Placement],
                        consumer_split: Sequence[bool]) -> tuple[tuple[Placement, ...],
                                                                 tuple[Placement, ...]]:
    """``(grad(dst), grad(src))`` per mesh axis (module docstring): the backward reshard of an
    edge runs from the first to the second."""
    grad_dst = tuple(_grad_of_input(p, s) for p, s in zip(dst, consumer_split))
    grad_src = tuple(Replicate() if isinstance(p, Partial) else p for p in src)
    return grad_dst, grad_src


def _events(src: tuple[Placement, ...], dst: tuple[Placement, ...], shape: tuple[int, ...],
            dtype_bytes: int, mesh: LogicalMesh) -> tuple[Event, ...]:
    """The collectives of the cheapest reshard ``src → dst`` (local steps dropped; an
    ``all_gather+slice`` step is its all-gather)."""
    if src == dst:
        return ()
    steps = reshard_cost(src, dst, shape, dtype_bytes, mesh).steps
    return tuple((s.kind.partition("+")[0], float(s.nbytes)) for s in steps if s.nbytes > 0)


@lru_cache(maxsize=1 << 14)
def edge_collectives(src: tuple[Placement, ...], dst: tuple[Placement, ...],
                     consumer_split: tuple[bool, ...], requires_grad: bool,
                     shape: tuple[int, ...], dtype_bytes: int,
                     mesh: LogicalMesh) -> tuple[tuple[Event, ...], tuple[Event, ...]]:
    """``(forward, backward)`` collectives of an edge (module docstring), memoised: their
    seconds over a group of ``mesh`` sum to ``reshard_cost(...).time_s`` of each direction."""
    forward = _events(src, dst, shape, dtype_bytes, mesh)
    if not requires_grad:
        return forward, ()
    grad_dst, grad_src = gradient_placements(src, dst, consumer_split)
    return forward, _events(grad_dst, grad_src, shape, dtype_bytes, mesh)
