"""The inter-op search: the fastest configuration that fits, and why it won.

**Problem.** Given a captured graph, a cluster of ``N`` devices with capacity ``C`` each and a
global batch ``B``, choose ``x = (tp, pp, dp, b, schedule, zero, recompute, sp, stages)`` with
``pp·dp·tp = N`` and ``B = dp·b·m`` to

    minimise  T(x)     (the step simulator, :func:`cost_model.step.estimate.estimate`)
    s.t.      M_s(x) + H ≤ C  for every pipeline rank s    (:mod:`cost_model.memory.breakdown`; ``H``
                                  the headroom, :mod:`cost_model.memory.headroom`)

**Method**: branch and bound over an enumerated space (docs/planner.md, "The search", tells
each step in words); the state of one search is :class:`.search_state._Search`, its
ranking (steps 3–4) :mod:`.ranking`. On several device groups (:mod:`.stage_devices`) each
pipeline rank is priced and checked on its own group; the bounds take the mean free memory,
the fastest work.

1. Families ``(tp, pp, dp)`` (:mod:`.space`), invalid ones pruned with their reason.
2. Memory bound per (family, rung) (:mod:`.bounds`): ``k_z(dp)·Ψ/pp + reserved + runtime >
   C − H`` prunes the pair; each candidate starts at the lowest surviving rung (ZeRO stage,
   offload; :mod:`.offload`). Offload rungs plan-wide only in a second pass when the first
   found nothing that fits, or from the start when the ``offload`` constraint excludes
   ``none``; per pipeline rank also in the first pass with :data:`JOINT_RUNGS` (step 4).
3. Candidates (:mod:`.space`) visited in increasing order of their lower bound on ``T̂``
   — on one kind of device the pipeline bound ``(m + (p−1)/v)·W/pp``
   (:func:`.bounds.pipeline_lower_bound`), else the time bound ``m·W/pp`` — until it
   exceeds the ``K``-th best ``T̂`` or the time budget ends (once one fits); a candidate
   whose time bound reaches the ``K``-th best ``T̂`` is skipped unpriced. Visiting by the
   tighter bound finds the good candidates first, so the ``K``-th best falls sooner and
   fewer are priced; the ``K`` best are those of any visiting order (ties in ``T̂`` go to
   the earlier in the order of ``m·W/pp``).
4. Per candidate and rung: the partition DP under the memory cap (:mod:`.partition`), the
   per-rank memory by the estimate's own formula (:mod:`.stage_memory`), and the closed form
   ``T̂`` (:mod:`.surrogate`); the cheapest kept (ties → the lower rung). Unless the
   constraints name ``recompute``, a candidate's policy runs on as few layers of each stage
   as memory needs, chosen with the split (:meth:`.stage_split.StageSplits.fit_recompute`;
   its bounds are then those without recompute, the least it may cost). Each pipeline rank
   may then take its own ZeRO stage and offload for the kept split, among the rungs of the
   pass (:mod:`.stage_zero`, exact for ``T̂`` on a split); a constraint naming ``zero_stage``
   or ``offload`` keeps that one plan-wide. With :data:`.joint_rungs.JOINT_RUNGS` the split
   is chosen with those rungs, the offload rungs included in every pass
   (:mod:`.joint_rungs`): exactly for ``T̂`` by the DP over stages with each rank's
   rung, for every cap on the slowest rank's work (:mod:`.joint_split`: one chunk per rank,
   identical layers, one recompute policy on every layer); elsewhere the
   candidate is placed at every rung a rank may take and the per-rank choice runs on each
   distinct split (:mod:`.stage_zero`, "With the split"), a split whose bound
   :func:`.surrogate.split_bound` exceeds the ``K``-th best ``T̂`` not mixed. A candidate
   that fits at no plan-wide rung may still fit with a rung per rank.
   No "lowest ZeRO stage that fits" rule: a higher stage moves more bytes but may shrink the optimizer step,
   the gradient sync or the memory that forces recompute; only the model can weigh them.
5. Placements ``π``: one intra-op solve per distinct tp of the ``K`` best (:mod:`.placements`).
6. Finalists: ``min(T(x, π), T(x, μ))`` against the default Megatron layout ``μ``
   (:mod:`.pricing`); the fastest that fits wins, the next three are the runners-up.

Nothing is dropped silently: every pruned family or candidate group carries its reason with
the arithmetic (:mod:`.reasons`, :mod:`.unfit`), every fallback is logged and kept in the plan.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Mapping

from fxplan.core.config import ParallelConfig
from fxplan.cost_model.memory.headroom import DEFAULT_HEADROOM, MemoryHeadroom
from fxplan.core.plan import Plan
from fxplan.inter_op.build_plan import build_plan
from fxplan.inter_op.infeasible import NoRunnablePlan
from fxplan.inter_op.progress import Budget, PhaseTimer
from fxplan.inter_op.reasons import RUNTIME, Reason
from fxplan.inter_op.search_state import _Search

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["DEFAULT_FINALISTS", "Runnable", "run_search"]

log = logging.getLogger("fxplan.planner")

#: ``K``: candidates priced by the step simulator.
DEFAULT_FINALISTS = 8
#: Rounds of ``K`` finalists put to the runtime's check (step 7): when it refuses every one of
#: a round, the next ``K`` candidates by ``T̂`` are priced and checked, up to this many rounds.
RUNTIME_ROUNDS = 4


def free_degrees(c: ParallelConfig, constraints: Mapping[str, Any]) -> list[str]:
    """The line that reports the degrees a constrained search chose freely (``--constrain
    tp=2`` on 4 devices may bring in ``pp=2``): empty when nothing is constrained or every
    unnamed degree stayed at 1."""
    if not constraints:
        return []
    free = [f"{name}={value}" for name, value in (("tp", c.tp), ("pp", c.pp), ("dp", c.dp))
            if name not in constraints and value > 1]
    if not free:
        return []
    return [f"{c.summary()}: {', '.join(free)} chosen by the search (the constraints "
            f"{', '.join(sorted(constraints))} leave {'it' if len(free) == 1 else 'them'} "
            "free; constrain to fix)"]


#: Asked of each priced finalist, best first, before it is offered: why the runtime cannot
#: apply the plan to the model (a sentence), or ``None`` when it can.
Runnable = Callable[[Plan], "str | None"]


def run_search(graph: CapturedGraph, cluster: Cluster, *, batch: int, model: str,
               time_budget_s: float | None, progress: bool, constraints: Mapping[str, Any],
               finalists: int, timer: PhaseTimer,
               memory_headroom: MemoryHeadroom = DEFAULT_HEADROOM,
               runnable: Runnable | None = None, state_layout: str = "runtime") -> Plan:
    """Steps 1–6 on a captured graph (the public wrapper is :func:`fxplan.inter_op.search`).
    ``state_layout``: the model states' layout every candidate is priced in
    (:func:`fxplan.cost_model.memory.breakdown.adam_for`).
    ``runnable``: step 7, the runtime's check of each finalist, best first; the first it
    accepts is the plan, the ones it refuses are pruned with its reason (kind
    :data:`~fxplan.inter_op.reasons.RUNTIME`). When it refuses every finalist, the next ``K``
    candidates by ``T̂`` (those not ranked before) are priced and checked, for up to
    :data:`RUNTIME_ROUNDS` rounds in all — the fastest plans may all share what the runtime
    cannot run (pp > 1 for a model whose forward cannot be cut) while slower ones run —; when
    it refuses all of them the search fails saying why."""
    budget = Budget(time_budget_s)
    state = _Search(graph, cluster, batch, constraints, finalists, timer, budget, progress,
                    memory_headroom, state_layout)
    with timer("inter-op"):
        fams = state.families()
        ranked = state.rank(fams)
        if not ranked and state.offload_pass():
            fams = state.families()
            ranked = state.rank(fams)
        state.unfit_reasons()
    with timer("intra-op"):
        state.solve_placements(ranked)
    with timer("simulate"):
        done = state.finalists(ranked)
    if not done:
        raise state.failure(model)

    def plan_of(k: int, pruned: list[Reason]) -> Plan:
        best = done[k]
        if best.fallback:
            log.info(best.note)  # a layout decision, shown in the report with the fallbacks
        fallbacks = [*state.fallbacks, *best.placements.fallbacks,
                     *([best.note] if best.fallback else []), *free_degrees(best.config, constraints)]
        return build_plan(graph, cluster, model=model, batch=batch, best=best,
                          runners_up=done[k + 1:k + 4], pruned=pruned, fallbacks=fallbacks,
                          search_time_s=budget.elapsed(), timings=timer.rounded(),
                          visited=state.visited)

    refused: list[Reason] = []
    refusals: list[tuple[str, str]] = []   # (summary, reason) of each, for NoRunnablePlan
    checked: set[ParallelConfig] = set()   # a later round's candidate may price as an earlier
    for round_ in range(RUNTIME_ROUNDS):
        for k, candidate in enumerate(done):
            if candidate.config in checked:
                continue
            checked.add(candidate.config)
            plan = plan_of(k, [*state.pruned, *refused])
            if runnable is None:
                return plan
            with timer("runtime check"):
                why = runnable(plan)
            if why is None:
                return plan
            refused.append(Reason(f"{candidate.config.summary()}: {why}", RUNTIME,
                                  config=candidate.config.to_string()))
            refusals.append((candidate.config.summary(), why))
        if round_ + 1 == RUNTIME_ROUNDS or budget.expired():
            break
        with timer("inter-op"):
            ranked = state.next_round(fams)
        if not ranked:
            break
        with timer("intra-op"):
            state.solve_placements(ranked)
        with timer("simulate"):
            done = state.finalists(ranked)
    raise NoRunnablePlan(model, refusals)

