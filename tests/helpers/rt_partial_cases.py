"""Rank-pool job: the trainer's Partial-gradient reduction (:mod:`fxplan.runtime.apply.partial_grads`)
under tp=2 with sequence parallelism, against DTensor's own per-tensor redistribution."""

from __future__ import annotations

from typing import Any

from torch.distributed.tensor import DTensor, Partial

from fxplan.examples.models.lm import lm_loss
from fxplan.runtime.apply.graph import apply_plan
from fxplan.runtime.apply.partial_grads import reduce_partial_grads
from rt_plans import build_model, fixed_batch, make_plan


def _partial(grad: Any) -> bool:
    return isinstance(grad, DTensor) and any(isinstance(p, Partial) for p in grad.placements)


def partial_grads_reduced_once() -> dict[str, Any] | None:
    """One tp=2 sp backward on ranks 0–1; reduce; report (rank 0) which gradients were Partial,
    the collectives issued, the placements after, and the largest difference from
    ``grad.redistribute(param's placements)`` of each Partial gradient."""
    plan = make_plan(tp=2, sp=True, microbatch_size=4, num_microbatches=2)
    batch = fixed_batch(plan)
    sharded = apply_plan(build_model(2), plan, batch[0], ranks=[0, 1])
    if sharded is None:
        return None
    sharded.train_step(batch, lm_loss)
    named = sharded.named_parameters()
    partial = sorted(fqn for fqn, p in named.items() if _partial(p.grad))
    expected = {fqn: named[fqn].grad.redistribute(named[fqn].device_mesh, named[fqn].placements)
                .to_local().clone() for fqn in partial}
    collectives = reduce_partial_grads(sharded)
    error = max((float((named[f].grad.to_local() - expected[f]).abs().max()) for f in partial),
                default=0.0)
    return dict(
        partial=partial, collectives=collectives, error=error,
        still_partial=sorted(fqn for fqn, p in named.items() if _partial(p.grad)),
        placements_match=all(named[f].grad.placements == named[f].placements for f in partial),
        again=reduce_partial_grads(sharded),
        scale=max((float(e.abs().max()) for e in expected.values()), default=0.0),
    )
