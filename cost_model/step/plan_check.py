"""A plan file checked against the model and cluster it will run on, before anything starts.

:meth:`fxplan.core.plan.Plan.from_dict` checks what a plan says about itself (types, degrees,
``batch = dp·mb·m``, ``mesh_shape``/``degrees`` against the config, stages contiguous from
layer 0, placement syntax, a prediction priced for the plan's own configuration). This module
checks what needs the cluster and the captured graph, re-deriving from them what can be
re-derived:

* cluster: ``pp·dp·tp`` is the cluster's device count; every ``axis_levels`` entry names one
  of the cluster's link levels (or ``-`` for an axis of size 1);
* model: the configuration is valid for the graph (:meth:`ParallelConfig.check`: heads and
  widths divisible by tp, the stages hold exactly the model's repeated blocks, the microbatch
  count for the schedule); the plan's stage ranges are those the configuration derives
  (``[Σ_{i<j} n_i, Σ_{i≤j} n_i)``); every placement names a node, producer or parameter of the
  graph and shards a dimension the tensor has.

Each refusal is a :class:`~fxplan.core.plan.PlanError` naming the field and what was expected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from fxplan.core.placements import Shard
from fxplan.core.plan import MESH_AXES, Plan, PlanError
from fxplan.cost_model.step.layer_costs import graph_segments

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["check_plan"]


def check_plan(plan: Plan, cluster: Cluster, graph: CapturedGraph | None = None, *,
               source: str = "plan") -> None:
    """Raise :class:`PlanError` unless ``plan`` runs on ``cluster`` (and, given, ``graph``)."""
    if plan.world_size != cluster.num_devices:
        raise PlanError(f"{source}: mesh pp·dp·tp = {plan.pp}·{plan.dp}·{plan.tp} = "
                        f"{plan.world_size} ranks, but cluster {cluster.name} has "
                        f"{cluster.num_devices} devices; expected a plan for "
                        f"{cluster.num_devices} (re-plan with `fxplan plan`)")
    levels = {level.name for level in cluster.levels}
    for axis, level in zip(MESH_AXES, plan.axis_levels):
        if level != "-" and level not in levels:
            raise PlanError(f"{source}: axis_levels gives {axis} the level {level!r}, expected "
                            f"one of cluster {cluster.name}'s levels ({', '.join(sorted(levels))})"
                            " or '-'")
    if graph is not None:
        _check_graph(plan, graph, source)


def _check_graph(plan: Plan, graph: CapturedGraph, source: str) -> None:
    from fxplan.core.config_error import CostModelError

    segments = graph_segments(graph)
    layers = len(segments.layers)
    config = plan.config
    if plan.pp > 1 and layers == 0:
        raise PlanError(f"{source}: pp={plan.pp} but the model has no repeated layers to split "
                        "into stages; expected pp=1")
    try:
        config.check(world_size=plan.world_size, layers=max(layers, 1), heads=segments.heads,
                     seq=segments.seq, batch=plan.batch,
                     tp_widths=segments.tp_widths if plan.tp > 1 else None)
    except CostModelError as err:
        raise PlanError(f"{source}: config {config.to_string()!r} does not fit the model: "
                        f"{err}") from None
    if plan.stages:
        expected = _stage_ranges(config.layers_per_stage(max(layers, 1)))
        found = [s.layers for s in plan.stages]
        if found != expected:
            raise PlanError(f"{source}: stages hold layer ranges "
                            f"{_ranges(found)} but the model has {layers} repeated layers and "
                            f"the config gives {_ranges(expected)}")
    _check_placements(plan, graph, source)


def _stage_ranges(counts: Iterable[int]) -> list[tuple[int, int]]:
    out, start = [], 0
    for n in counts:
        out.append((start, start + n))
        start += n
    return out


def _ranges(ranges: Iterable[tuple[int, int]]) -> str:
    return ", ".join(f"[{a},{b})" for a, b in ranges)


def _check_placements(plan: Plan, graph: CapturedGraph, source: str) -> None:
    """Every placement names something of the graph and shards a dimension it has."""
    infos = graph.infos_by_name
    shapes: dict[str, object] = {name: info.shape for name, info in infos.items()}
    placements = plan.placements
    if len(placements.axes) != 2:
        raise PlanError(f"{source}: placements.axes {list(placements.axes)}: expected the "
                        "stage mesh's two axes ['dp', 'tp']")
    entries = [(f"placements.nodes[{name!r}]", name, p, shapes)
               for name, p in placements.nodes.items()]
    entries += [(f"placements.inputs[{edge.consumer!r} ← {edge.producer!r}]", edge.producer, p,
                 shapes) for edge, p in placements.inputs.items()]
    params = {name: info.shape for name, info in graph.params.items()}
    entries += [(f"placements.params[{name!r}]", name, p, params)
                for name, p in placements.params.items()]
    for where, name, value, known in entries:
        if name not in known:
            what = "parameter" if known is params else "node"
            raise PlanError(f"{source}: {where}: the model has no {what} {name!r}; expected "
                            f"placements of this model's {what}s (re-plan for this model)")
        shape = known[name]
        ndim = len(shape) if isinstance(shape, tuple) and all(isinstance(d, int) for d in shape) \
            else None
        for placement in value:
            if (isinstance(placement, Shard) and ndim  # a scalar's S(0) is its reduction
                    and not -ndim <= placement.dim < ndim):
                raise PlanError(f"{source}: {where} shards dimension {placement.dim} of a tensor "
                                f"of shape {tuple(shape)}; expected a dimension in "
                                f"0…{ndim - 1}")
