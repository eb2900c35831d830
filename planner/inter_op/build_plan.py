"""Turn the winning candidate, its estimate and the search's records into a :class:`Plan`.

Stages: virtual stage ``j`` of ``S = pp·v`` holds layers ``[Σ_{i<j} n_i, Σ_{i≤j} n_i)``, the
embedding on ``j = 0`` and the head on ``j = S−1``; it runs on pipeline rank ``j mod pp``.
Runners-up carry their step time and its delta to the winner,
``Δ = T_runner − T_best`` and ``Δ/T_best``. ``estimate["layout"]`` says which placements the
step time priced (``intra-op`` or ``megatron-default``) and ``estimate["layout_note"]`` why;
``input_placements`` holds what consumers need where it differs from their producer's output,
so ``Plan.priced_config()`` rebuilds exactly the configuration that was estimated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from fxplan.cost_model.estimate import Estimate
from fxplan.cost_model.memory import GIB
from fxplan.cost_model.mesh import LogicalMesh
from fxplan.core.plan import Plan, StageAssignment
from fxplan.inter_op.pricing import Priced
from fxplan.inter_op.space import Candidate

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["build_plan", "estimate_summary"]

AXES = ("pp", "dp", "tp")


def estimate_summary(c: Candidate, est: Estimate) -> dict[str, Any]:
    """The plan's ``estimate`` mapping: the cost model's dict plus capacity and the peak."""
    data = est.to_dict()
    data["capacity_gib"] = est.memory[0].capacity / GIB
    data["max_memory_gib"] = max(m.total for m in est.memory) / GIB
    data["stage_layers"] = list(c.stage_layers)
    return data


def _runner(runner: Priced, best: Estimate) -> dict[str, Any]:
    c, est = runner.candidate, runner.est
    delta = est.step_time_s - best.step_time_s
    return {"summary": c.summary(), "config": c.to_config_string(),
            "step_time_s": est.step_time_s, "delta_s": delta,
            "delta_pct": 100.0 * delta / best.step_time_s, "mfu": est.mfu,
            "peak_memory_gib": max(m.total for m in est.memory) / GIB, "fits": est.fits,
            "layout": runner.layout}


def _axis_levels(cluster: Cluster, c: Candidate) -> tuple[str, ...]:
    mesh = LogicalMesh(cluster, (c.pp, c.dp, c.tp), AXES)
    return tuple(mesh.axis_level(a).name if mesh.axis_size(a) > 1 else "-" for a in AXES)


def _stages(c: Candidate) -> tuple[StageAssignment, ...]:
    out, start, S = [], 0, len(c.stage_layers)
    for j, n in enumerate(c.stage_layers):
        out.append(StageAssignment(j, (start, start + n), has_embedding=j == 0,
                                   has_head=j == S - 1))
        start += n
    return tuple(out)


def build_plan(graph: CapturedGraph, cluster: Cluster, *, model: str, batch: int, best: Priced,
               runners_up: Sequence[Priced], pruned: Sequence[str], fallbacks: Sequence[str],
               search_time_s: float, timings: dict[str, float], visited: int) -> Plan:
    """The :class:`Plan` of the search's winner (module docstring)."""
    est, placements = best.est, best.placements
    summary = estimate_summary(best.candidate, est)
    summary["candidates_visited"] = visited
    summary["layout"] = best.layout
    summary["layout_note"] = best.note
    if placements.priced:
        summary["intra_op_objective_s"] = placements.objective_s
    best = best.candidate
    return Plan(
        model=model, cluster=cluster.name, graph_fingerprint=graph.fingerprint(),
        cluster_fingerprint=cluster.fingerprint(), batch=batch, seq=est.seq,
        mesh_shape=(best.pp, best.dp, best.tp), mesh_axes=AXES,
        axis_levels=_axis_levels(cluster, best), stages=_stages(best),
        schedule=best.schedule, microbatch_size=best.microbatch_size,
        num_microbatches=best.num_microbatches, zero_stage=best.zero_stage,
        recompute=(best.recompute,) * sum(best.stage_layers),
        sequence_parallel=best.sequence_parallel,
        node_placements=placements.nodes, param_placements=placements.params,
        input_placements=placements.inputs if placements.priced else {},
        estimate=summary, solver=placements.solver, search_time_s=search_time_s,
        runners_up=tuple(_runner(r, est) for r in runners_up),
        pruned=tuple(pruned), fallbacks=tuple(fallbacks), timings=timings)
