"""The plan's step time is the price of the placements it carries."""

from __future__ import annotations

import pytest
import torch

from fxplan.cluster_specs import Cluster
from fxplan.cost_model import ParallelConfig, estimate
from fxplan.cost_model.comm.collectives import collective_time_s
from fxplan.cost_model.comm.edge_reshard import edge_collectives
from fxplan.cost_model.parallel.tp_layout import tp_layout
from fxplan.cost_model.comm.mesh import LogicalMesh
from fxplan.api import capture
from fxplan import search
from fxplan.core.placements import DataEdge, PlacementMap, Replicate, Shard
from fxplan.inter_op.placements import IntraOpCache
from fxplan.inter_op.pricing import priced_config

MODEL = "gpt:layers=4,hidden=4096,heads=32,vocab=51200,seq=2048"
TP8 = "dp=1,tp=8,pp=1,mb=1,schedule=1f1b,zero=0,recompute=selective,sp=on"


@pytest.fixture(scope="module")
def graph():  # type: ignore[no-untyped-def]
    return capture(MODEL, batch=1, seq=2048, dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def node() -> Cluster:
    return Cluster.load("dgx-a100-80g")


@pytest.fixture(scope="module")
def solved(graph, node):  # type: ignore[no-untyped-def]
    """The solver's placements for tp=8 on one DGX node, as the search would carry them."""
    cache = IntraOpCache(graph, node)
    c = ParallelConfig.parse(TP8 + ",m=8")
    return cache.solve(8), cache.placements(c)


def test_plan_step_time_is_the_price_of_its_own_placements(graph) -> None:  # type: ignore[no-untyped-def]
    cluster = Cluster.load("dgx-a100-80g:nodes=2")
    plan = search(graph, cluster, batch=32, progress=False, constraints={"tp": 2})
    assert plan.estimate["layout"] == "intra-op", plan.estimate["layout_note"]
    assert plan.solver.status == "optimal"
    config = ParallelConfig.parse(plan.estimate["config"]).replace(placements=plan.placements)
    assert config == priced_config(plan)
    again = estimate(graph, cluster, config, batch=32)
    assert again.step_time_s == pytest.approx(plan.estimate["step_time_s"], rel=1e-12)
    # the placements shard the residual stream over tp, and the plan says so
    assert plan.sequence_parallel
    assert plan.placements.nodes["h_0_ln1"][-1] == Shard(1)
    assert plan.placements.inputs[DataEdge("h_0_attn_qkv", "h_0_ln1")][-1] == Replicate()


def test_ilp_placements_price_like_the_megatron_layout_at_tp8(graph, node, solved) -> None:  # type: ignore[no-untyped-def]
    _, placements = solved
    assert placements.sequence_parallel
    config = ParallelConfig.parse(TP8)
    default = estimate(graph, node, config, batch=8)
    priced = estimate(graph, node, config.replace(placements=placements.priced_placements()),
                      batch=8)
    assert priced.step_time_s == pytest.approx(default.step_time_s, rel=0.01)
    assert priced.breakdown["tp_comm"] == pytest.approx(default.breakdown["tp_comm"], rel=0.01)
    assert max(priced.peak_memory_gib) == pytest.approx(max(default.peak_memory_gib), rel=0.05)


def test_estimate_prices_edges_as_the_solver_does(graph, node, solved) -> None:  # type: ignore[no-untyped-def]
    """Every reshard of the solution costs in the estimate what it cost the solver."""
    solution, placements = solved
    layout = tp_layout(graph, placements.priced_placements())
    mesh = LogicalMesh(node, (8,), ("tp",))
    infos = {n.name: i for n, i in graph.nodes()}
    assert solution.reshards
    for r in solution.reshards:
        edge = next(e for e in layout.edges[r.consumer] if e.producer == r.producer)
        info = infos[r.producer]
        fwd, bwd = edge_collectives((edge.src,), (edge.dst,), (edge.consumer_split,),
                                    edge.requires_grad, info.shape,
                                    torch.empty((), dtype=info.dtype).element_size(), mesh)
        seconds = sum(collective_time_s(k, b, tuple(range(8)), node) for k, b in fwd + bwd)
        assert seconds == pytest.approx(r.time_s, rel=1e-9), str(r)


def test_a_worse_placement_costs_more(graph, node, solved) -> None:  # type: ignore[no-untyped-def]
    _, placements = solved
    best = placements.priced_placements()
    replicated = PlacementMap(
        nodes={k: v[:-1] + (Replicate(),) for k, v in best.nodes.items()},
        params={k: v[:-1] + (Replicate(),) for k, v in best.params.items()})
    config = ParallelConfig.parse(TP8.replace("sp=on", "sp=off"))
    worse = estimate(graph, node, config.replace(placements=replicated), batch=8)
    good = estimate(graph, node, ParallelConfig.parse(TP8).replace(placements=best), batch=8)
    assert worse.step_time_s > 1.5 * good.step_time_s
    assert worse.breakdown["tp_comm"] == 0.0
    assert max(worse.peak_memory_gib) > max(good.peak_memory_gib)

