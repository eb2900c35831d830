"""Expert parallelism priced: MoE layers found, all-to-alls over the topology, memory split."""

from __future__ import annotations

import math

import pytest

import fxplan
from fxplan.cluster_specs import Cluster
from fxplan.core.config import ParallelConfig
from fxplan.core.config_error import CostModelError
from fxplan.cost_model import estimate
from fxplan.cost_model.comm.collectives import collective_time_s
from fxplan.cost_model.parallel.expert_parallel import (alltoall_seconds, check_ep, ep_groups,
                                               expert_work, model_states, moe_layers)
from fxplan.cost_model.memory.breakdown import ADAM_MIXED, model_state_bytes
from fxplan.examples.models.moe import MoEConfig, expert_capacity
from fxplan.examples.presets import PRESETS


@pytest.fixture(scope="module")
def tiny():
    return fxplan.capture("moe-tiny", batch=2)


def test_moe_layers_found_with_their_dispatch(tiny):
    layers = moe_layers(tiny)
    assert len(layers) == 1   # both layers share one block signature
    layer = next(iter(layers.values()))
    c = MoEConfig(**PRESETS["moe-tiny"].values)
    slots = c.experts * expert_capacity(2 * c.seq, c.experts, c.top_k, c.capacity_factor)
    assert layer.experts == c.experts
    assert layer.dispatch_bytes == layer.combine_bytes == slots * c.hidden * 4   # fp32 capture
    assert {name.rsplit(".", 1)[1] for name in layer.expert_params} == {"w1", "b1", "w2", "b2"}
    assert moe_layers(fxplan.capture("gpt-tiny", batch=1)) == {}


def test_ep_groups_take_consecutive_dp_ranks():
    dp_group = tuple(range(0, 16, 2))   # tp=2: dp ranks stride 2
    assert ep_groups(dp_group, 4) == ((0, 2, 4, 6), (0, 8))
    assert ep_groups(dp_group, 1) == ((0,), dp_group)


def test_routed_rows_capped_at_capacity(tiny):
    """ρ = min(1, k·T / (E·C)): moe-tiny's capture (T = 2·64 tokens, k = 2, E = 4, c = 1.25:
    C = 80) routes 256 of its 320 slots; at c = 0.5 (C = 32) the capacity is the cap; the
    expert nodes are the two batched products and what lies between them and the output bias."""
    layer = next(iter(moe_layers(tiny).values()))
    assert layer.routed == pytest.approx(256 / 320)
    ops = [str(tiny.nodes_by_name[n].target).split(" of ")[0] for n in layer.expert_nodes]
    assert len(layer.expert_nodes) == 5 and sum("bmm" in o for o in ops) == 2, ops
    low = fxplan.capture("moe-tiny:capacity_factor=0.5", batch=2)
    assert next(iter(moe_layers(low).values())).routed == 1.0


def test_alltoall_inside_a_node_vs_across_nodes(tiny):
    """On 25 Gb/s Ethernet between nodes the all-to-all crossing nodes costs far more than
    one inside a node's NVLink; each direction is two α-β all-to-alls of the routed rows
    (``ρ`` of the captured dispatch), the forward one more of the ``E`` counts."""
    cluster = Cluster.load("aws-p3-v100:nodes=2")
    layer = next(iter(moe_layers(tiny).values()))
    group = tuple(range(8))
    inside = alltoall_seconds(layer, scale=64, tp=1, ep_group=group, cluster=cluster,
                              recompute_full=False)
    across = alltoall_seconds(layer, scale=64, tp=1, ep_group=tuple(range(16)),
                              cluster=cluster, recompute_full=False)
    one = collective_time_s("all_to_all", layer.dispatch_bytes * 64 * 0.8, group, cluster)
    counts = collective_time_s("all_to_all", 8.0 * 4, group, cluster)
    assert inside[0] == pytest.approx(2 * one + counts) and inside[1] == pytest.approx(2 * one)
    assert across[0] > 10 * inside[0]
    full = alltoall_seconds(layer, scale=64, tp=1, ep_group=group, cluster=cluster,
                            recompute_full=True)
    assert full[1] == pytest.approx(full[0] + inside[1])


def test_alltoall_under_tensor_parallelism(tiny):
    """tp = 2 (runtime.expert_tp): each tp rank sends half the routed rows, and the outputs
    (forward) and row gradients (backward) are all-gathered over tp."""
    cluster = Cluster.load("aws-p3-v100:nodes=2")
    layer = next(iter(moe_layers(tiny).values()))
    ep_group, tp_group = (0, 2, 4, 6), (0, 1)
    got = alltoall_seconds(layer, scale=64, tp=2, ep_group=ep_group, cluster=cluster,
                           recompute_full=False, tp_group=tp_group)
    rows = layer.dispatch_bytes * 64 * 0.8
    half = collective_time_s("all_to_all", rows / 2, ep_group, cluster)
    counts = collective_time_s("all_to_all", 8.0 * 4, ep_group, cluster)
    gather = collective_time_s("all_gather", rows, tp_group, cluster)
    assert got[0] == pytest.approx(counts + 2 * half + gather)
    assert got[1] == pytest.approx(2 * half + gather)


def test_expert_work_as_priced_and_as_run(tiny):
    """The runtime computes and saves ``ρ/tp`` of the captured expert work per rank, whatever
    the layout priced (the Megatron layout splits moe-tiny's experts over tp: its router is
    a column-parallel linear by the dataflow rule, and what follows it is split)."""
    device = Cluster.load("local-cpu:devices=4").device(0)
    layer = next(iter(moe_layers(tiny).values()))
    one = expert_work(tiny, layer, tp=1, sequence_parallel=False, microbatch=2, device=device)
    two = expert_work(tiny, layer, tp=2, sequence_parallel=False, microbatch=2, device=device)
    assert one.runtime_saved == pytest.approx(0.8 * one.priced_saved) and one.priced_saved > 0
    assert two.priced_saved == pytest.approx(one.priced_saved / 2)
    assert two.runtime_saved == pytest.approx(one.runtime_saved / 2)
    assert one.runtime_forward < one.priced_forward and one.runtime_backward < one.priced_backward
    assert two.runtime_forward < one.runtime_forward


def test_expert_states_sharded_over_their_replicas():
    psi, experts = 1000.0, 600.0 / 4   # local counts, experts already 1/ep
    for zero in (0, 1, 2, 3):
        got = model_states(psi, experts, dp=8, ep=4, zero_stage=zero).total
        want = (model_state_bytes(psi - experts, 8, zero).total
                + model_state_bytes(experts, 2, zero).total)
        assert got == pytest.approx(want)
    # ZeRO-3: the experts' states are Ψ_e/dp with or without EP
    with_ep = model_states(400 + 150, 150, dp=8, ep=4, zero_stage=3).total
    without = model_state_bytes(400 + 600, 8, 3).total
    assert with_ep == pytest.approx(without)


def test_estimate_with_ep(tiny):
    cluster = Cluster.load("local-cpu:devices=4")
    base = ParallelConfig(dp=4, tp=1, pp=1, microbatch_size=2)
    e1 = estimate(tiny, cluster, base, batch=8, optimizer=ADAM_MIXED)
    e2 = estimate(tiny, cluster, base.replace(ep=2), batch=8, optimizer=ADAM_MIXED)
    # ep = 1 computes every capacity slot, ep = 2 the routed rows only (ρ = 0.8 here)
    assert e2.breakdown["compute"] < e1.breakdown["compute"]
    assert e2.breakdown["tp_comm"] > e1.breakdown["tp_comm"] == 0
    layer = next(iter(moe_layers(tiny).values()))
    expert_numel = sum(tiny.params[n].numel for n in layer.expert_params) * 2  # two layers
    saved = e1.memory[0].params - e2.memory[0].params
    # the optimizer's 16-bit weights (ADAM_MIXED.param_bytes), half the experts
    assert saved == pytest.approx(ADAM_MIXED.param_bytes * expert_numel / 2)
    assert e2.config.to_string().endswith(",ep=2")


def test_ep_refused_where_it_cannot_apply(tiny):
    cluster = Cluster.load("local-cpu:devices=4")
    dense = fxplan.capture("gpt-tiny", batch=1)
    with pytest.raises(CostModelError, match="needs a mixture of experts"):
        estimate(dense, cluster, ParallelConfig(dp=4, ep=2), batch=8)
    with pytest.raises(CostModelError, match="does not divide dp=4"):
        ParallelConfig(dp=4, ep=3)
    odd = fxplan.capture("moe-tiny:experts=6", batch=1)
    with pytest.raises(CostModelError, match="ep=4 does not divide the 6 experts"):
        check_ep(odd, 4)
    assert ParallelConfig.parse("dp=4,tp=1,pp=1,mb=1,ep=2").ep == 2
    assert math.isclose(ParallelConfig(dp=4, ep=4).ep, 4)


def test_experts_whole_per_ep_rank_under_tensor_parallelism(tiny):
    """A rank holds E/ep whole experts whatever the tp layout (runtime.expert_tp); its
    segment's expert time is the runtime's ρ/tp share."""
    from fxplan.cost_model.parallel.expert_parallel import ep_segment
    from fxplan.cost_model.step.layer_costs import segment_cost

    device = Cluster.load("local-cpu:devices=4").device(0)
    key, layer = next(iter(moe_layers(tiny).items()))
    seg = segment_cost(tiny, key, tp=2, sequence_parallel=False, recompute="none",
                       microbatch=2, device=device)
    work = expert_work(tiny, layer, tp=2, sequence_parallel=False, microbatch=2, device=device)
    got = ep_segment(seg, layer, 2, work)
    for name in layer.expert_params:
        assert got.params[name] == tiny.params[name].numel / 2
    assert got.forward_s == pytest.approx(seg.forward_s - work.priced_forward
                                          + work.runtime_forward)
    assert got.activations.saved == pytest.approx(seg.activations.saved - work.priced_saved
                                                  + work.runtime_saved)


def test_zero1_with_ep_is_priced_as_the_fsdp2_it_runs_as():
    """ZeRO-1 with ep > 1 runs as FSDP2 (the expert weights are DTensors), not as DDP with
    ZeroRedundancyOptimizer's broadcasts: priced so."""
    from fxplan.cost_model.step.dp_reductions import zero1_broadcasts

    dense = ParallelConfig(dp=4, tp=1, pp=1, microbatch_size=2, zero_stage=1)
    assert zero1_broadcasts(dense) and not dense.shards_params_with_fsdp
    experts = dense.replace(ep=2)
    assert experts.shards_params_with_fsdp and not zero1_broadcasts(experts)
