"""The planner rediscovers textbook strategies (single process; no mesh is instantiated).

- pure data parallelism for a small model on fast devices with no memory pressure;
- ZeRO sharding once replicated optimizer state no longer fits (16 B/param · 7.5 G > 80 GiB);
- Megatron column/row tensor parallelism inside a node for a wide model;
- pipeline parallelism across the 25 Gb/s inter-node link of ``aws-p3-v100``, tensor
  parallelism kept on NVLink inside the node.
"""

from __future__ import annotations

import pytest

from fxplan.cluster_specs import Cluster
from fxplan.core.placements import Shard
from fxplan import search
from fxplan.api import capture_for_search
from fxplan.cluster_specs import training_dtype


def _plan(model: str, cluster_spec: str, batch: int, **kwargs):  # type: ignore[no-untyped-def]
    cluster = Cluster.load(cluster_spec)
    graph = capture_for_search(model, dtype=training_dtype(cluster))
    return cluster, search(graph, cluster, batch=batch, progress=False, **kwargs)


def test_small_model_gets_pure_data_parallelism() -> None:
    _, plan = _plan("gpt:layers=4,hidden=512,heads=8,vocab=8192,seq=512", "dgx-a100-80g", 64)
    assert (plan.dp, plan.tp, plan.pp) == (8, 1, 1), plan.summary
    # the ZeRO stage is the one the cost model prices cheapest, not "the lowest that fits"
    # (tests/inter_op/test_zero_choice.py)
    assert plan.estimate["fits"]
    assert plan.estimate["max_memory_gib"] < 0.5 * plan.estimate["capacity_gib"]


def test_zero_when_replicated_optimizer_state_does_not_fit() -> None:
    _, plan = _plan("gpt-7.5b", "dgx-a100-80g", 64)
    assert plan.zero_stage >= 1, plan.summary
    assert plan.estimate["fits"]
    reasons = [r for r in plan.pruned if "zero=0" in r and "tp=1, pp=1" in r]
    assert reasons and "> 76.0 GiB (80 GiB less 4.0 GiB headroom)" in reasons[0], plan.pruned[:5]


def test_wide_model_gets_megatron_tensor_parallelism_inside_a_node() -> None:
    # Weights replicated over dp (ZeRO ≤ 2): with ZeRO-3 allowed the cost model prices fully
    # sharded data parallelism (dp=8, its gathers hidden behind these wide layers) about 3 %
    # faster, and the search keeps the model's cheapest ZeRO stage (test_zero_choice.py).
    cluster, plan = _plan("gpt:layers=4,hidden=12288,heads=96,vocab=51200,seq=2048",
                          "dgx-a100-80g", 16, constraints={"zero_stage": [0, 1, 2]})
    assert 1 < plan.tp <= cluster.devices_per_node(), plan.summary
    levels = dict(zip(plan.mesh_axes, plan.axis_levels))
    assert levels["tp"] == cluster.device(0).intra_node_level
    params = plan.placements.params
    tp_entries = {p[plan.placements.axis("tp")] for p in params.values()}
    assert {Shard(0), Shard(1)} <= tp_entries, "column (S(0)) and row (S(1)) parallel weights"
    column = [n for n, p in params.items() if p[-1] == Shard(0) and "fc1" in n]
    row = [n for n, p in params.items() if p[-1] == Shard(1) and "fc2" in n]
    assert column and row


def test_pipeline_across_the_slow_link_of_aws_p3_v100() -> None:
    cluster, plan = _plan("gpt-1.7b", "aws-p3-v100:nodes=4", 64)
    levels = dict(zip(plan.mesh_axes, plan.axis_levels))
    network = cluster.levels[-1].name
    assert plan.pp > 1 and levels["pp"] == network, plan.summary
    assert plan.tp <= cluster.devices_per_node() and levels["tp"] != network, plan.summary
    assert plan.estimate["fits"]


@pytest.mark.parametrize("axis", ["tp"])
def test_tensor_parallelism_across_the_slow_link_is_slower(axis: str) -> None:
    """The alternative the textbook rejects, priced by the same model: tp=16 straddles nodes."""
    _, best = _plan("gpt-1.7b", "aws-p3-v100:nodes=4", 64)
    _, forced = _plan("gpt-1.7b", "aws-p3-v100:nodes=4", 64, constraints={axis: 8, "pp": 1})
    assert forced.estimate["step_time_s"] > best.estimate["step_time_s"]
