"""A ``sequence_parallel`` constraint binds the plan's placements.

Sequence parallelism is read off the intra-op solver's placements; a constraint on it must
win over that reading, in both directions, and the plan's step time must price the layout the
plan carries.
"""

from __future__ import annotations

import pytest
from torch_versions import needs

from fxplan import search
from fxplan.api import capture_for_search
from fxplan.cluster_specs import Cluster
from fxplan.core.config import ParallelConfig
from fxplan.cost_model import estimate
from fxplan.core.placements import Shard
from fxplan.cost_model.parallel.megatron_layout import REPL
from fxplan.cost_model.parallel.tp_layout import tp_layout
from fxplan.cluster_specs import training_dtype
from fxplan.inter_op.placements import IntraOpCache
from fxplan.inter_op.pricing import priced_config

SMALL = "gpt:layers=2,hidden=64,heads=4,vocab=256,seq=32"
#: Wide enough that the solver shards the residual stream on the ``cpu4`` fixture's ranks.
WIDER = "gpt:layers=2,hidden=256,heads=4,vocab=256,seq=256"


def _graph(model: str, cluster: Cluster):  # type: ignore[no-untyped-def]
    return capture_for_search(model, dtype=training_dtype(cluster))


def _shards_replicated(graph, plan) -> bool:  # type: ignore[no-untyped-def]
    """Whether the plan shards an activation the Megatron layout replicates over tp."""
    layout = tp_layout(graph)
    by_name = graph.nodes_by_name
    return any(layout.state.get(name) == REPL and by_name[name].op != "placeholder"
               and p[-1].is_shard() for name, p in plan.placements.nodes.items())


def _check_priced(graph, cluster, plan, batch: int) -> None:  # type: ignore[no-untyped-def]
    """The plan's step time is the estimate of what the plan says."""
    config = priced_config(plan)
    assert config.sequence_parallel == plan.config.sequence_parallel
    again = estimate(graph, cluster, config, batch=batch)
    assert again.step_time_s == pytest.approx(plan.estimate["step_time_s"], rel=1e-12)
    assert ParallelConfig.parse(plan.estimate["config"]).sequence_parallel == \
        plan.config.sequence_parallel


@pytest.fixture(scope="module")
def dgx():  # type: ignore[no-untyped-def]
    cluster = Cluster.load("dgx-a100-80g")
    return _graph(SMALL, cluster), cluster


@pytest.fixture(scope="module")
def cpu4():  # type: ignore[no-untyped-def]
    # 4 CPU ranks whose gloo is priced by a hop latency and the idle-rank bandwidth alone (the
    # spec before gloo's CPU per step was measured): there the solver shards the sequence of
    # WIDER. With gloo's CPU (a reduce-scatter is an all-reduce, an all-gather's step costs
    # more CPU than an all-reduce's) sequence parallelism never pays on local-cpu.
    from fxplan.cluster_specs.local_cpu import (GLOO_BUS_GB_PER_S, GLOO_HOP_LATENCY_US,
                                                local_cpu_spec)

    spec = local_cpu_spec(4)
    loopback = {k: v for k, v in spec["levels"][0].items() if k != "step_cpu_us"}
    spec["levels"][0] = loopback | {"bandwidth_gb_per_s": GLOO_BUS_GB_PER_S,
                                    "latency_us": GLOO_HOP_LATENCY_US}
    cluster = Cluster.from_dict(spec, source="local-cpu:devices=4, gloo by hop latency")
    return _graph(WIDER, cluster), cluster


def test_sp_on_is_kept_when_the_solver_leaves_the_sequence_replicated(dgx) -> None:  # type: ignore[no-untyped-def]
    graph, cluster = dgx
    solved = IntraOpCache(graph, cluster).placements(ParallelConfig(dp=4, tp=2, pp=1))
    assert solved.priced and not solved.sequence_parallel   # the premise: the solver says off
    plan = search(graph, cluster, batch=8, progress=False,
                  constraints={"tp": 2, "sequence_parallel": True})
    assert plan.config.tp == 2
    assert plan.config.sequence_parallel and plan.sequence_parallel
    assert plan.estimate["layout"] == "megatron-default"
    assert any("sequence_parallel allows on" in f for f in plan.fallbacks), plan.fallbacks
    # the Megatron layout with sp shards the residual stream's sequence over tp
    assert plan.placements.nodes["h_0_ln1"][-1] == Shard(1)
    _check_priced(graph, cluster, plan, 8)


def test_sp_off_is_kept_when_the_solver_shards_the_sequence(cpu4) -> None:  # type: ignore[no-untyped-def]
    graph, cluster = cpu4
    solved = IntraOpCache(graph, cluster).placements(ParallelConfig(dp=2, tp=2, pp=1))
    assert solved.priced and solved.sequence_parallel      # the premise: the solver says on
    plan = search(graph, cluster, batch=8, progress=False,
                  constraints={"tp": 2, "sequence_parallel": False})
    assert plan.config.tp == 2
    assert not plan.config.sequence_parallel and not plan.sequence_parallel
    assert not _shards_replicated(graph, plan)
    assert any("sequence_parallel allows off" in f for f in plan.fallbacks), plan.fallbacks
    _check_priced(graph, cluster, plan, 8)


def test_sp_off_on_any_family(cpu4) -> None:  # type: ignore[no-untyped-def]
    """Without a tp constraint, sp=False holds whichever family wins."""
    graph, cluster = cpu4
    plan = search(graph, cluster, batch=8, progress=False,
                  constraints={"sequence_parallel": False})
    assert not plan.config.sequence_parallel
    assert not _shards_replicated(graph, plan)
    _check_priced(graph, cluster, plan, 8)


@needs("dtensor_view_sharding")   # its sp plans replicate 'wte': the graph rewrite runs them
def test_unconstrained_search_still_reads_sp_off_the_solver(cpu4) -> None:  # type: ignore[no-untyped-def]
    """Without the constraint the solver's sharded sequence is kept as sp=on at tp=2."""
    graph, cluster = cpu4
    plan = search(graph, cluster, batch=8, progress=False, constraints={"tp": 2})
    if plan.estimate["layout"] == "intra-op":
        assert plan.config.sequence_parallel == _shards_replicated(graph, plan)
    assert not any("sequence_parallel allows" in f for f in plan.fallbacks)
    _check_priced(graph, cluster, plan, 8)


def test_api_plan_honours_sp_off_for_dp_by_tp_and_keeps_the_headroom() -> None:
    """``fxplan.plan(..., constraints={"tp": 2, "sequence_parallel": False}, headroom=…)`` on
    4 CPU ranks, on the model whose solver placements shard the sequence: dp×tp with sp off
   , the headroom stored in the plan."""
    import fxplan
    from fxplan.examples.model_spec import resolve_model

    import torch

    model = resolve_model(WIDER).build("cpu")
    tokens = torch.randint(0, 256, (8, 256))        # WIDER: vocab 256, seq 256
    inputs = (tokens, tokens)                       # (idx, targets): the forward ends in the loss
    result = fxplan.plan(model, "local-cpu:devices=4", inputs=inputs, batch=8,
                         constraints={"tp": 2, "sequence_parallel": False}, headroom="10%")
    plan = result.plan
    assert (plan.tp, plan.dp) == (2, 2)
    assert not plan.config.sequence_parallel and not plan.sequence_parallel
    assert plan.estimate["memory_headroom"] == "10%"
