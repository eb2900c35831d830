"""Plots of a chosen plan: its pipeline timeline and its memory per stage.

A :class:`~fxplan.core.plan.Plan` carries its estimate as JSON, not the simulated timeline,
so the very configuration the plan's step time priced
(:func:`fxplan.inter_op.pricing.priced_config`) is
estimated again with :func:`cost_model.estimate` on the same graph and cluster; that gives
the timeline and the per-stage memory breakdown the plots draw.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.core.plan import Plan
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["plot_plan"]


def plot_plan(plan: Plan, graph: CapturedGraph, cluster: Cluster,
              prefix: str | Path) -> tuple[Path, Path]:
    """Write ``PREFIX-timeline.png`` and ``PREFIX-memory.png`` for ``plan``; return both paths."""
    from fxplan.cost_model import estimate
    from fxplan.cost_model.memory_plot import plot_memory
    from fxplan.cost_model.timeline_plot import plot_timeline
    from fxplan.inter_op.pricing import priced_config

    result = estimate(graph, cluster, priced_config(plan), batch=plan.batch, seq=plan.seq)
    title = f"{plan.model} on {plan.cluster}, batch {plan.batch}\n{plan.summary}"
    timeline = plot_timeline(result.timeline(), f"{prefix}-timeline.png", title=title)
    memory = plot_memory([m.to_gib() for m in result.memory], f"{prefix}-memory.png",
                         title=f"peak memory per rank · {title}")
    return timeline, memory
