"""Plots of a chosen plan: its pipeline timeline and its memory per stage.

A :class:`~fxplan.core.plan.Plan` carries its estimate as JSON, not the simulated timeline,
so the very configuration the plan's step time priced
(:func:`fxplan.inter_op.pricing.priced_config`) is
estimated again with :func:`cost_model.step.estimate` on the same graph and cluster
(:func:`fxplan.plan_context.simulate_plan`); that gives the timeline and the per-stage
memory breakdown the plots draw, the HTML report (:mod:`fxplan.report.html`) and the
trace (:mod:`fxplan.report.trace`). :func:`fxplan.plan_context.plan_context` captures
the graph and loads the cluster a saved plan names.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.core.plan import Plan
    from fxplan.cost_model.step.estimate import Estimate
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["plan_title", "plot_plan", "plot_simulation"]




def plan_title(plan: Plan) -> str:
    """``gpt-tiny on local-cpu:devices=4, batch 16`` and the plan's summary on a second line."""
    return f"{plan.model} on {plan.cluster}, batch {plan.batch}\n{plan.summary}"


def plot_simulation(result: Estimate, prefix: str | Path, title: str) -> tuple[Path, Path]:
    """Write ``PREFIX-timeline.png`` and ``PREFIX-memory.png`` of an estimate."""
    from fxplan.report.memory_plot import plot_memory
    from fxplan.report.timeline_plot import plot_timeline

    timeline = plot_timeline(result.timeline(), f"{prefix}-timeline.png", title=title)
    devices = ([f"{d.name} ({d.model})" for d in result.stage_plan.devices]
               if result.stage_plan is not None else None)
    memory = plot_memory([m.to_gib() for m in result.memory], f"{prefix}-memory.png",
                         title=f"peak memory per rank\n{title}", devices=devices)
    return timeline, memory


def plot_plan(plan: Plan, graph: CapturedGraph, cluster: Cluster,
              prefix: str | Path) -> tuple[Path, Path]:
    """Write ``PREFIX-timeline.png`` and ``PREFIX-memory.png`` for ``plan``; return both paths."""
    from fxplan.plan_context import simulate_plan

    return plot_simulation(simulate_plan(plan, graph, cluster), prefix, plan_title(plan))
