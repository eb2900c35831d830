"""A saved plan's context: its model captured as the search captured it, its cluster, and
the estimate whose step time is the plan's (what the reports, plots, traces and exports
re-price and draw).

A :class:`~fxplan.core.plan.Plan` carries its estimate as JSON, not the simulated timeline, so
the very configuration the plan's step time priced
(:func:`fxplan.inter_op.pricing.priced_config`) is estimated again on the same graph and
cluster (:func:`simulate_plan`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.core.plan import Plan
    from fxplan.cost_model.step.estimate import Estimate
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["plan_context", "simulate_plan"]


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
    memory headroom the plan was made with (the default for a plan file without one), its
    model states in the layout it was priced in (:attr:`~fxplan.core.plan.Plan.state_layout`)."""
    from fxplan.cost_model import estimate
    from fxplan.inter_op.pricing import priced_config

    return estimate(graph, cluster, priced_config(plan), batch=plan.batch, seq=plan.seq,
                    memory_headroom=plan.estimate.get("memory_headroom"),
                    state_layout=plan.state_layout)
