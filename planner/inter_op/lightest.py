"""The lightest variant of a mesh family, by memory.

Two questions ask for it:

* the memory bound of a (family, rung) (:func:`fxplan.inter_op.bounds.memory_reason`) speaks
  of the variant lightest in activations, :func:`lightest_at`: the smallest microbatch, full
  recompute, sequence parallelism where offered, the layers split evenly (the bound holds for
  every variant; this one comes closest to it);
* the unfit reasons (:mod:`fxplan.inter_op.unfit`) and the error when nothing fits quote the
  lightest candidate the constraints allow, :func:`lightest_allowed`: at the highest allowed
  rung, with the smallest allowed microbatch, evenly split, the one whose heaviest rank
  overflows least (``M_s + H_s − C_s``, :func:`fxplan.inter_op.unfit.overflow`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from fxplan.core.config import ParallelConfig
from fxplan.cost_model.memory.breakdown import MemoryBreakdown
from fxplan.inter_op.constraints import allowed
from fxplan.inter_op.offload import Rung
from fxplan.inter_op.partition import balanced_counts
from fxplan.inter_op.unfit import overflow

__all__ = ["evenly_at", "lightest_allowed", "lightest_at"]


def evenly_at(c: ParallelConfig, rung: Rung, layers: int) -> ParallelConfig:
    """``c`` at ``rung`` with its ``layers`` split evenly over its ``pp·v`` stages."""
    return c.replace(zero_stage=rung[0], offload=rung[1],
                     stage_layers=balanced_counts(layers, c.pp * c.virtual_stages))


def lightest_at(variants: Iterable[ParallelConfig], rung: Rung,
                layers: int) -> ParallelConfig | None:
    """The variant lightest in activations among ``variants`` (a family's candidates), at
    ``rung`` and evenly split over ``layers``; ``None`` when there are none."""
    found = list(variants)
    if not found:
        return None
    best = min(found, key=lambda c: (c.microbatch_size, c.recompute != "full",
                                     not c.sequence_parallel))
    return evenly_at(best, rung, layers)


def lightest_allowed(variants: Iterable[ParallelConfig], rung: Rung | None, layers: int,
                     constraints: Mapping[str, Any],
                     worst: Callable[[ParallelConfig], MemoryBreakdown],
                     ) -> tuple[ParallelConfig, MemoryBreakdown] | None:
    """The lightest of ``variants`` the ``constraints`` allow at ``rung`` (the highest the
    family may climb; ``None``: none allowed) and ``worst(c)``, its heaviest rank's memory;
    ``None`` when the constraints allow none."""
    if rung is None:
        return None
    found = [c for c in variants
             if allowed(c.replace(zero_stage=rung[0], offload=rung[1]), constraints)]
    if not found:
        return None
    mb = min(c.microbatch_size for c in found)
    best: tuple[ParallelConfig, MemoryBreakdown] | None = None
    for c in found:
        if c.microbatch_size != mb:
            continue
        c = evenly_at(c, rung, layers)
        memory = worst(c)
        if best is None or overflow(memory) < overflow(best[1]):
            best = (c, memory)
    return best
