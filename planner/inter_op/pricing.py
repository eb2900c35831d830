"""Price a finalist with the placements it will carry.

For a finalist ``c`` the intra-op solver's placements ``π`` for its tp degree
(:class:`fxplan.inter_op.placements.IntraOpCache`) go into
``ParallelConfig.placements`` and the step simulator prices them
(:func:`cost_model.estimate.estimate`, :mod:`cost_model.priced_layout`): compute split as
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

:func:`priced_config` rebuilds, from a plan, the configuration whose estimate is the plan's
step time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Collection

from fxplan.core.config import CostModelError, ParallelConfig
from fxplan.core.placements import PlacementMap
from fxplan.core.plan import Plan
from fxplan.cost_model.estimate import Estimate, estimate
from fxplan.cost_model.memory_headroom import MemoryHeadroom
from fxplan.cost_model.plotting import time_unit
from fxplan.inter_op.placements import IntraOpCache, PlacementChoice, megatron_placements

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["Priced", "price_finalist", "priced_config", "INTRA_OP", "MEGATRON"]

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
              placements: PlacementMap | None, headroom: MemoryHeadroom | None) -> Estimate:
    return estimate(graph, cluster, c.replace(placements=placements), batch=batch,
                    memory_headroom=headroom)


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


def price_finalist(graph: CapturedGraph, cluster: Cluster, c: ParallelConfig, batch: int,
                   cache: IntraOpCache, *, sequence_parallel: Any = None,
                   memory_headroom: MemoryHeadroom | None = None) -> Priced:
    """The cheaper of the solver's placements and the default layout (module docstring).

    ``sequence_parallel``: the search's constraint on it (a bool or a collection of bools;
    ``None`` when unconstrained); solver placements it does not allow are not priced and the
    default layout under ``c.sequence_parallel`` is kept as a recorded fallback.
    ``memory_headroom``: what each device must leave free for the estimate to fit.
    Raises :class:`CostModelError` when the cost model refuses both."""
    options: list[Priced] = []
    errors: list[str] = []
    solved = cache.placements(c)
    refusal = _sp_refusal(solved, sequence_parallel)
    if refusal:
        errors.append(refusal)
    elif solved.priced:
        c_pi = c.replace(sequence_parallel=solved.sequence_parallel)
        try:
            est = _estimate(graph, cluster, c_pi, batch, solved.priced_placements(),
                            memory_headroom)
            options.append(Priced(c_pi, est, solved, INTRA_OP, ""))
        except CostModelError as err:
            errors.append(f"intra-op placements: {err}")
    try:
        default = megatron_placements(graph, c) if solved.priced else solved
        est = _estimate(graph, cluster, c, batch, None, memory_headroom)
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
