"""Turn the winning configuration, its estimate and the search's records into a :class:`Plan`.

Stages: virtual stage ``j`` of ``S = pp·v`` holds layers ``[Σ_{i<j} n_i, Σ_{i≤j} n_i)``, the
embedding on ``j = 0`` and the head on ``j = S−1``; it runs on pipeline rank ``j mod pp``.
Runners-up carry their step time and its delta to the winner,
``Δ = T_runner − T_best`` and ``Δ/T_best``. ``estimate["layout"]`` says which placements the
step time priced (``intra-op`` or ``megatron-default``) and ``estimate["layout_note"]`` why;
``Plan.placements.inputs`` holds what consumers need where it differs from their producer's
output, so :func:`fxplan.inter_op.pricing.priced_config` rebuilds exactly the configuration
that was estimated.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Sequence

from fxplan.core.config import ParallelConfig
from fxplan.core.placements import PlacementMap, Replicate
from fxplan.core.plan import MESH_AXES, Plan, StageAssignment
from fxplan.cost_model.step.estimate import Estimate
from fxplan.cost_model.parallel.expert_parallel import moe_layers
from fxplan.cost_model.memory.breakdown import GIB
from fxplan.cost_model.comm.mesh import LogicalMesh
from fxplan.cost_model.step.stage_plan import stage_ranks
from fxplan.inter_op.pricing import Priced
from fxplan.inter_op.reasons import Reason

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["build_plan", "estimate_summary", "experts_whole_over_tp", "stage_groups"]


def estimate_summary(c: ParallelConfig, est: Estimate,
                     cluster: Cluster | None = None) -> dict[str, Any]:
    """The plan's ``estimate`` mapping: the cost model's dict plus capacity and the peak, and
    with ``cluster`` the device group of each pipeline rank (:func:`stage_groups`)."""
    data = est.to_dict()
    data["capacity_gib"] = est.memory[0].capacity / GIB
    data["max_memory_gib"] = max(m.total for m in est.memory) / GIB
    data["stage_layers"] = list(c.stage_layers)
    if cluster is not None:
        data["stage_groups"] = stage_groups(cluster, c, est)
    return data


def stage_groups(cluster: Cluster, c: ParallelConfig, est: Estimate) -> list[dict[str, Any]]:
    """Per pipeline rank: its device group, device model, capacity (GiB), the precision it
    trains in with its peak (TFLOP/s), and the link levels of its own dp and tp groups (``-``
    for a degree of 1): what the report shows per group on a heterogeneous cluster."""
    out = []
    precisions = est.precisions or {}
    for s in range(c.pp):
        tp_group, dp_group = stage_ranks(c, s)
        device = cluster.device(tp_group[0])
        precision = precisions.get(device.name)
        out.append({
            "group": device.name, "model": device.model,
            "capacity_gib": est.memory[s].capacity / GIB, "precision": precision,
            "peak_tflops": device.peak_tflops.get(precision) if precision else None,
            "dp_level": cluster.group_level(dp_group).name if c.dp > 1 else "-",
            "tp_level": cluster.group_level(tp_group).name if c.tp > 1 else "-"})
    return out


def _runner(runner: Priced, best: Estimate) -> dict[str, Any]:
    c, est = runner.config, runner.est
    delta = est.step_time_s - best.step_time_s
    return {"summary": c.summary(), "config": c.to_string(),
            "step_time_s": est.step_time_s, "delta_s": delta,
            "delta_pct": 100.0 * delta / best.step_time_s, "mfu": est.mfu,
            "peak_memory_gib": max(m.total for m in est.memory) / GIB, "fits": est.fits,
            "layout": runner.layout}


def _axis_levels(cluster: Cluster, c: ParallelConfig) -> tuple[str, ...]:
    mesh = LogicalMesh(cluster, (c.pp, c.dp, c.tp), MESH_AXES)
    return tuple(mesh.axis_level(a).name if mesh.axis_size(a) > 1 else "-" for a in MESH_AXES)


def _stages(c: ParallelConfig) -> tuple[StageAssignment, ...]:
    out, start, S = [], 0, len(c.stage_layers)
    for j, n in enumerate(c.stage_layers):
        out.append(StageAssignment(j, (start, start + n), has_embedding=j == 0,
                                   has_head=j == S - 1))
        start += n
    return tuple(out)


def build_plan(graph: CapturedGraph, cluster: Cluster, *, model: str, batch: int, best: Priced,
               runners_up: Sequence[Priced], pruned: Sequence[Reason], fallbacks: Sequence[str],
               search_time_s: float, timings: dict[str, float], visited: int) -> Plan:
    """The :class:`Plan` of the search's winner (module docstring)."""
    est, placements = best.est, best.placements
    summary = estimate_summary(best.config, est, cluster)
    summary["candidates_visited"] = visited
    summary["layout"] = best.layout
    summary["layout_note"] = best.note
    if placements.priced:
        summary["intra_op_objective_s"] = placements.objective_s
    config = best.config
    return Plan(
        model=model, cluster=cluster.name, graph_fingerprint=graph.fingerprint(),
        cluster_fingerprint=cluster.fingerprint(), batch=batch, seq=est.seq, config=config,
        placements=experts_whole_over_tp(graph, config, placements.placements),
        axis_levels=_axis_levels(cluster, config),
        stages=_stages(config), estimate=summary, solver=placements.solver,
        search_time_s=search_time_s, runners_up=tuple(_runner(r, est) for r in runners_up),
        pruned=tuple(str(r) for r in pruned), pruned_detail=tuple(r.detail() for r in pruned),
        fallbacks=tuple(fallbacks), timings=timings)


def experts_whole_over_tp(graph: CapturedGraph, config: ParallelConfig,
                          placements: PlacementMap) -> PlacementMap:
    """``placements`` with every expert weight replicated over the mesh under ``ep > 1`` and
    ``tp > 1``. There each EP rank holds its ``E/ep`` experts whole on every tp rank
    (:mod:`fxplan.runtime.styles.expert_tp`, Megatron-Core's expert tensor-parallel size 1) and the
    cost model prices them so (:mod:`fxplan.cost_model.parallel.expert_parallel`), whatever split the
    intra-op solver chose for the batched products; the plan says what runs. An expert weight:
    a 3-D parameter ``[E, ·, ·]`` whose ``E`` is a mixture-of-experts layer's expert count."""
    if config.ep == 1 or config.tp == 1 or not placements.params:
        return placements
    counts = {layer.experts for layer in moe_layers(graph).values()}
    experts = {name for name, info in graph.params.items()
               if len(info.shape) == 3 and info.shape[0] in counts}
    params = {name: tuple(Replicate() for _ in value) if name in experts else value
              for name, value in placements.params.items()}
    return replace(placements, params=params)
