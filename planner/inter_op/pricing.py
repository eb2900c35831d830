"""Price a finalist with the placements it will carry.

For a finalist ``c`` the intra-op solver's placements ``π`` for its tp degree
(:class:`fxplan.inter_op.placements.IntraOpCache`) go into
``ParallelConfig.placements`` and the step simulator prices them
(:func:`cost_model.step.estimate.estimate`, :mod:`cost_model.parallel.priced_layout`): compute split as
``π`` splits it, activation memory as ``π`` shards it, tensor-parallel communication as the
reshards of ``π`` (``reshard_cost``, the function the solver priced them with). Sequence
parallelism is what ``π`` says (``c_π = c`` with ``sp`` read off ``π``).

A ``sequence_parallel`` constraint is binding: when ``π``'s sequence parallelism is not one
the constraint allows, ``(c_π, π)`` is not a candidate and the finalist is priced with the
default Megatron layout under ``c``'s own ``sp`` (which the search took from the allowed
values), recorded as a fallback with the reason. So ``plan.config.sequence_parallel`` always
satisfies the constraint and the step time prices the layout the plan carries.

The solver minimises one block's time at the captured microbatch, without the pipeline, so
its answer could in principle price worse in the full step than the cost model's default
Megatron layout ``μ``. Both are priced and the plan keeps

    argmin over {(c_π, π), (c, μ)} of (not fits, T)         ties go to the solver's π

recording which, and why, in the result's ``note`` (the driver puts it in ``Plan.estimate``
and, when ``μ`` wins, in ``Plan.fallbacks``). Nothing is chosen silently.

:func:`price_finalists` prices the ``K`` finalists in order (steps 5–6 of
:mod:`fxplan.inter_op.driver`): the ones the cost model refuses or finds over memory become
reasons, two that price to the same configuration are merged (the faster kept, the other a
reason), and the time budget, once at least one is priced, ends the pricing as a recorded
fallback. :func:`priced_config` rebuilds, from a plan, the configuration whose estimate is the
plan's step time.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Collection

from fxplan.core.config import ParallelConfig
from fxplan.core.config_error import CostModelError
from fxplan.core.placements import PlacementMap
from fxplan.core.plan import Plan
from fxplan.cost_model.step.estimate import Estimate, estimate
from fxplan.cost_model.memory.breakdown import GIB
from fxplan.cost_model.memory.headroom import MemoryHeadroom
from fxplan.core.units import time_unit
from fxplan.inter_op.placements import IntraOpCache, PlacementChoice
from fxplan.inter_op.progress import Budget
from fxplan.inter_op.reasons import DUPLICATE, MEMORY, REFUSED, Reason
from fxplan.inter_op.stage_memory import limit_text
from fxplan.inter_op.unfit import overflow

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["Finalists", "Priced", "price_finalist", "price_finalists", "priced_config",
           "INTRA_OP", "MEGATRON"]

log = logging.getLogger("fxplan.planner")

INTRA_OP, MEGATRON = "intra-op", "megatron-default"


@dataclass
class Priced:
    """A finalist as it will be planned: its configuration (``sp`` as its placements say, no
    placements of its own), its estimate, the placements the plan will carry, which layout the
    estimate priced, and why."""

    config: ParallelConfig
    est: Estimate
    placements: PlacementChoice
    layout: str
    note: str
    fallback: bool = False


def priced_config(plan: Plan) -> ParallelConfig:
    """The configuration whose estimate is ``plan``'s step time: the plan's config with its
    placements when the step time priced them (``estimate["layout"] == INTRA_OP``), else with
    the default Megatron layout (no placements)."""
    if plan.estimate.get("layout") != INTRA_OP:
        return plan.config
    return plan.config.replace(placements=plan.placements)


def _estimate(graph: CapturedGraph, cluster: Cluster, c: ParallelConfig, batch: int,
              placements: PlacementMap | None, headroom: MemoryHeadroom | None,
              state_layout: str) -> Estimate:
    return estimate(graph, cluster, c.replace(placements=placements), batch=batch,
                    memory_headroom=headroom, state_layout=state_layout)


def _key(p: Priced) -> tuple[bool, float, int]:
    return (not p.est.fits, p.est.step_time_s, 0 if p.layout == INTRA_OP else 1)


def _sp_refusal(solved: PlacementChoice, sequence_parallel: Any) -> str:
    """Why the solver's placements break the ``sequence_parallel`` constraint (``None``: no
    constraint; a bool or a collection of bools), or ``""`` when they keep it."""
    if sequence_parallel is None or not solved.priced:
        return ""
    allowed_sp = (set(sequence_parallel) if isinstance(sequence_parallel, Collection)
                  else {sequence_parallel})
    if solved.sequence_parallel in allowed_sp:
        return ""
    have = "on" if solved.sequence_parallel else "off"
    want = ", ".join(sorted("on" if v else "off" for v in allowed_sp))
    return (f"the intra-op placements have sequence parallelism {have} (they "
            f"{'shard' if solved.sequence_parallel else 'do not shard'} the replicated "
            f"activations' sequence over tp) but the constraint sequence_parallel allows "
            f"{want}")


def _tp_refusal(solved: PlacementChoice, c: ParallelConfig, tp_named: bool) -> str:
    """Why the solver's placements break a ``tp`` the user named (``tp_named``): they split
    no parameter over tp (every weight replicated: each tp rank would run the whole model on
    the same microbatch, the step of one rank, where ``tp=2`` asks for weights split over 2
    ranks); ``""`` when they split one, or tp was not named."""
    if not tp_named or c.tp == 1 or not solved.priced:
        return ""
    if any(len(p) > 1 and p[-1].is_shard() for p in solved.placements.params.values()):
        return ""
    return (f"the intra-op placements split no parameter over tp (every weight replicated), "
            f"but the constraint names tp={c.tp}: weights split over {c.tp} ranks")


def price_finalist(graph: CapturedGraph, cluster: Cluster, c: ParallelConfig, batch: int,
                   cache: IntraOpCache, *, sequence_parallel: Any = None,
                   tp_named: bool = False,
                   memory_headroom: MemoryHeadroom | None = None,
                   state_layout: str = "runtime") -> Priced:
    """The cheaper of the solver's placements and the default layout (module docstring).

    ``sequence_parallel``: the search's constraint on it (a bool or a collection of bools;
    ``None`` when unconstrained); solver placements it does not allow are not priced and the
    default layout under ``c.sequence_parallel`` is kept as a recorded fallback. ``tp_named``:
    the search's constraints name ``tp``; solver placements that split no parameter over tp
    are then not priced either, the default (Megatron) layout, which splits them, is kept.
    ``memory_headroom``: what each device must leave free for the estimate to fit;
    ``state_layout``: the model states' layout priced (:func:`~fxplan.cost_model.estimate`).
    Raises :class:`CostModelError` when the cost model refuses both."""
    options: list[Priced] = []
    errors: list[str] = []
    solved = cache.placements(c)
    refusal = _sp_refusal(solved, sequence_parallel) or _tp_refusal(solved, c, tp_named)
    if refusal:
        errors.append(refusal)
    elif solved.priced:
        c_pi = c.replace(sequence_parallel=solved.sequence_parallel)
        try:
            est = _estimate(graph, cluster, c_pi, batch, solved.priced_placements(),
                            memory_headroom, state_layout)
            options.append(Priced(c_pi, est, solved, INTRA_OP, ""))
        except CostModelError as err:
            errors.append(f"intra-op placements: {err}")
    try:
        default = cache.megatron(c) if solved.priced else solved
        est = _estimate(graph, cluster, c, batch, None, memory_headroom, state_layout)
        options.append(Priced(c, est, default, MEGATRON, ""))
    except CostModelError as err:
        errors.append(f"default layout: {err}")
    if not options:
        raise CostModelError("; ".join(errors))
    best = min(options, key=_key)
    best.note = _why(best, options, solved, errors, refusal)
    best.fallback = best.layout == MEGATRON and solved.priced
    return best


def _two_times(a: float, b: float) -> tuple[str, str]:
    """Two step times in one unit, three significant digits: ``("22.3 ms", "26.3 ms")``."""
    scale, unit = time_unit(max(a, b))
    return f"{a * scale:.3g} {unit}", f"{b * scale:.3g} {unit}"


def _why(best: Priced, options: list[Priced], solved: PlacementChoice, errors: list[str],
         refusal: str = "") -> str:
    if refusal:
        return (f"{best.config.summary()}: the default Megatron layout is kept: {refusal}; "
                f"the plan carries the Megatron layout with sequence parallelism "
                f"{'on' if best.config.sequence_parallel else 'off'}, as constrained")
    if not solved.priced:
        return ("intra-op solver not used (see Plan.fallbacks): priced with the default "
                "Megatron layout")
    other = next((o for o in options if o is not best), None)
    if other is None:
        return f"only the {best.layout} layout could be priced ({'; '.join(errors)})"
    mine, theirs = _two_times(best.est.step_time_s, other.est.step_time_s)
    if best.layout == INTRA_OP:
        return (f"priced with the intra-op placements: {mine} ≤ {theirs} for the default "
                "Megatron layout")
    if best.est.fits and not other.est.fits:
        why = "the intra-op placements would not fit in memory under the step's schedule"
    else:
        why = (f"it prices faster in the full step, {mine} against {theirs} with the intra-op "
               "placements (the solver prices one block at the captured microbatch, without "
               "the pipeline)")
    return (f"{best.config.summary()}: the plan carries the default Megatron layout, as "
            f"{why}")


@dataclass
class Finalists:
    """The finalists priced (:func:`price_finalists`): those that fit, fastest first, one per
    distinct configuration; the ones that failed (refused by the cost model or over memory)
    and the ones merged into an equal configuration, as reasons; the time-budget cut, if any."""

    priced: list[Priced] = field(default_factory=list)
    failed: list[Reason] = field(default_factory=list)
    merged: list[Reason] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)


def price_finalists(graph: CapturedGraph, cluster: Cluster, ranked: list[ParallelConfig],
                    batch: int, cache: IntraOpCache, budget: Budget, *,
                    sequence_parallel: Any = None, tp_named: bool = False,
                    memory_headroom: MemoryHeadroom | None = None,
                    state_layout: str = "runtime") -> Finalists:
    """Each of ``ranked`` (best ``T̂`` first) priced by :func:`price_finalist` (the keywords
    are its own) until ``budget`` expires with at least one priced (module docstring)."""
    done = Finalists()
    out = done.priced
    seen: dict[ParallelConfig, tuple[int, str]] = {}
    for index, c in enumerate(ranked):
        if out and budget.expired():
            text = (f"time budget {budget.seconds:g} s reached after pricing {index} of "
                    f"{len(ranked)} finalists; the best priced so far is kept")
            log.warning(text)
            done.fallbacks.append(text)
            break
        try:
            priced = price_finalist(graph, cluster, c, batch, cache,
                                    sequence_parallel=sequence_parallel, tp_named=tp_named,
                                    memory_headroom=memory_headroom,
                                    state_layout=state_layout)
        except CostModelError as err:
            done.failed.append(Reason(f"{c.summary()}: the cost model refused it: {err}",
                                      REFUSED))
            continue
        if not priced.est.fits:
            over = max(priced.est.memory, key=overflow)   # against its own device's
            worst, capacity = over.total, over.capacity
            done.failed.append(Reason(
                f"{priced.config.summary()}: simulated peak {worst / GIB:.1f} GiB > "
                f"{limit_text(capacity, over.headroom)}", MEMORY, needed_gib=worst / GIB,
                capacity_gib=(capacity - over.headroom) / GIB,
                config=priced.config.to_string(),
                layout=priced.layout))
            continue
        # One entry per configuration: two candidates can price to the same configuration
        # (one with the solver's placements, one with the default layout); the faster stays.
        key = priced.config
        if key in seen:
            index_, first = seen[key]
            kept, dropped = ((priced, out[index_]) if priced.est.step_time_s
                             < out[index_].est.step_time_s else (out[index_], priced))
            out[index_] = kept
            layouts = (f"; the {kept.layout} layout is kept ({kept.est.step_time_s:.4g} s "
                       f"≤ {dropped.est.step_time_s:.4g} s with the {dropped.layout} layout)"
                       if kept.layout != dropped.layout else "")
            done.merged.append(Reason(
                f"{c.summary()}: priced with its placements it is "
                f"{priced.config.summary()}, already a finalist (as {first}){layouts}",
                DUPLICATE))
            continue
        seen[key] = (len(out), c.summary())
        out.append(priced)
    out.sort(key=lambda p: p.est.step_time_s)
    return done
