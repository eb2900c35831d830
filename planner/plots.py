"""Plots of a chosen plan: its pipeline timeline and its memory per stage.

A :class:`~fxplan.core.plan.Plan` carries its estimate as JSON, not the simulated timeline,
so the very configuration the plan's step time priced
(:func:`fxplan.inter_op.pricing.priced_config`) is
estimated again with :func:`cost_model.estimate` on the same graph and cluster
(:func:`simulate_plan`); that gives the timeline and the per-stage memory breakdown the plots
draw, the HTML report (:mod:`fxplan.report_html`) and the trace (:mod:`fxplan.trace`).
:func:`plan_context` captures the graph and loads the cluster a saved plan names.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.core.plan import Plan
    from fxplan.cost_model.estimate import Estimate
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["plan_context", "plan_title", "plot_plan", "plot_simulation", "simulate_plan"]


def plan_context(plan: Plan, *, source: str = "plan") -> tuple[CapturedGraph, Cluster]:
    """The plan's model captured as the search captured it and its cluster, both checked
    against the plan's fingerprints (a plan for another model or cluster is refused)."""
    from fxplan.api import capture_for_search
    from fxplan.cluster_specs import Cluster, training_dtype

    cluster = Cluster.load(plan.cluster)
    plan.check_matches(cluster_fingerprint=cluster.fingerprint(), source=source)
    graph = capture_for_search(plan.model, seq=plan.seq, dtype=training_dtype(cluster))
    plan.check_matches(graph_fingerprint=graph.fingerprint(), source=source)
    return graph, cluster


def simulate_plan(plan: Plan, graph: CapturedGraph, cluster: Cluster) -> Estimate:
    """The estimate (with the step simulation) whose step time is the plan's, against the
    memory headroom the plan was made with (the default for a plan file without one)."""
    from fxplan.cost_model import estimate
    from fxplan.inter_op.pricing import priced_config

    return estimate(graph, cluster, priced_config(plan), batch=plan.batch, seq=plan.seq,
                    memory_headroom=plan.estimate.get("memory_headroom"))


def plan_title(plan: Plan) -> str:
    """``gpt-tiny on local-cpu:devices=4, batch 16`` and the plan's summary on a second line."""
    return f"{plan.model} on {plan.cluster}, batch {plan.batch}\n{plan.summary}"


def plot_simulation(result: Estimate, prefix: str | Path, title: str) -> tuple[Path, Path]:
    """Write ``PREFIX-timeline.png`` and ``PREFIX-memory.png`` of an estimate."""
    from fxplan.cost_model.memory_plot import plot_memory
    from fxplan.cost_model.timeline_plot import plot_timeline

    timeline = plot_timeline(result.timeline(), f"{prefix}-timeline.png", title=title)
    devices = ([f"{d.name} ({d.model})" for d in result.stage_plan.devices]
               if result.stage_plan is not None else None)
    memory = plot_memory([m.to_gib() for m in result.memory], f"{prefix}-memory.png",
                         title=f"peak memory per rank\n{title}", devices=devices)
    return timeline, memory


def plot_plan(plan: Plan, graph: CapturedGraph, cluster: Cluster,
              prefix: str | Path) -> tuple[Path, Path]:
    """Write ``PREFIX-timeline.png`` and ``PREFIX-memory.png`` for ``plan``; return both paths."""
    return plot_simulation(simulate_plan(plan, graph, cluster), prefix, plan_title(plan))
