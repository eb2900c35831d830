"""Context parallelism priced: K/V found (GQA unexpanded), ÷cp scaling, the exchange over the
topology (all-gather vs ring), and the estimate of a cp plan."""

from __future__ import annotations

import pytest

import fxplan
from fxplan.cluster_specs import Cluster
from fxplan.core.config import ParallelConfig
from fxplan.core.config_error import CostModelError
from fxplan.cost_model import estimate
from fxplan.cost_model.comm.collectives import collective_time_s
from fxplan.cost_model.parallel.context_parallel import (check_cp, cp_group, cp_layers, cp_segment,
                                                kv_exchange)
from fxplan.cost_model.step.layer_costs import segment_cost
from fxplan.examples.presets import PRESETS


@pytest.fixture(scope="module")
def llama():
    return fxplan.capture("llama-tiny", batch=2)


def test_kv_bytes_are_the_unexpanded_keys_and_values(llama):
    """llama-tiny has 4 query heads and 2 KV heads: the CP group exchanges K and V of the
    2 KV heads, 2·b·s·h_kv·d·4 bytes (fp32 capture)."""
    values = PRESETS["llama-tiny"].values
    head_dim = values["hidden"] // values["heads"]
    (layer,) = cp_layers(llama).values()
    seq = 64
    assert layer.kv_bytes == 2 * 2 * seq * values["kv_heads"] * head_dim * 4


def test_kv_bytes_of_a_fused_qkv_are_k_and_v_only():
    """gpt-tiny splits one fused QKV output: K and V are two thirds of it, 2·b·s·h·4 bytes
    (the split pieces are the exchanged storage, not the fused output)."""
    values = PRESETS["gpt-tiny"].values
    (layer,) = cp_layers(fxplan.capture("gpt-tiny:seq=16", batch=2)).values()
    assert layer.kv_bytes == 2 * 2 * 16 * values["hidden"] * 4


def test_segment_scales_by_one_over_cp_and_holds_the_gathered_kv(llama):
    (key,) = cp_layers(llama)
    seg = segment_cost(llama, key, tp=1, sequence_parallel=False, recompute="none",
                       microbatch=2, device=Cluster.load("local-cpu:devices=4").device(0))
    kv = 1000.0
    four = cp_segment(seg, 4, kv, "none")
    assert four.forward_s == pytest.approx(seg.forward_s / 4)
    assert four.backward_s == pytest.approx(seg.backward_s / 4)
    assert four.matmul_flops == pytest.approx(seg.matmul_flops / 4)
    assert four.output_bytes == pytest.approx(seg.output_bytes / 4)
    assert four.params == seg.params
    assert four.activations.saved == pytest.approx(seg.activations.saved / 4 + kv * 3 / 4)
    assert four.activations.working == pytest.approx(seg.activations.working / 4 + kv)
    full = cp_segment(seg, 4, kv, "full")    # full recompute rebuilds the gathered K/V
    assert full.activations.saved == pytest.approx(seg.activations.saved / 4)
    assert cp_segment(seg, 1, kv, "none") is seg


def test_segment_under_tp_overlap_scales_its_gemms_and_held_collectives(llama):
    """With sp: the GEMM seconds each tp collective pipelines with and the collectives that
    hold SMs (tp_overlap, cost_model/step/stage_costs.py) shrink with the rank's 1/cp share."""
    (key,) = cp_layers(llama)
    seg = segment_cost(llama, key, tp=2, sequence_parallel=True, recompute="none",
                       microbatch=2, device=Cluster.load("dgx-h100").device(0))
    assert seg.tp_forward_gemm_s and seg.tp_sm_backward
    two = cp_segment(seg, 2, 0.0, "none")
    assert two.tp_forward_gemm_s == pytest.approx([g / 2 for g in seg.tp_forward_gemm_s])
    assert two.tp_backward_gemm_s == pytest.approx([g / 2 for g in seg.tp_backward_gemm_s])
    assert [n for _, n in two.tp_sm_forward] == pytest.approx([n / 2 for _, n in seg.tp_sm_forward])
    assert [n for _, n in two.tp_sm_backward] == pytest.approx([n / 2 for _, n in seg.tp_sm_backward])


def test_cp_groups_take_consecutive_dp_ranks():
    assert cp_group(tuple(range(0, 16, 2)), 4) == (0, 2, 4, 6)


def test_allgather_inside_a_node_vs_across_nodes_and_the_ring():
    """The all-gather is the α-β all-gather (forward) and reduce-scatter (backward) of the
    K/V bytes; across nodes it costs far more than on NVLink. The ring hides its transfers
    under long attention (0 exposed), and is bounded below by the transfer when there is
    no attention to hide under."""
    cluster = Cluster.load("dgx-h100:nodes=2")
    kv = 512 * 2**20
    inside = kv_exchange(kv, group=tuple(range(8)), cluster=cluster, attention_s=(0.05, 0.1),
                         recompute_full=False)
    across = kv_exchange(kv, group=tuple(range(0, 16, 2)), cluster=cluster,
                         attention_s=(0.05, 0.1), recompute_full=False)
    assert inside.allgather == pytest.approx((
        collective_time_s("all_gather", kv, tuple(range(8)), cluster),
        collective_time_s("reduce_scatter", kv, tuple(range(8)), cluster)))
    assert across.allgather[0] > 1.5 * inside.allgather[0]   # 400 Gb/s IB vs NVLink
    assert inside.ring == (0.0, 0.0) and inside.cheaper == "ring"
    assert inside.priced == inside.allgather     # the runtime runs the all-gather
    bare = kv_exchange(kv, group=tuple(range(8)), cluster=cluster, attention_s=(0.0, 0.0),
                       recompute_full=True)
    one = collective_time_s("send_recv", kv / 8, (0, 1), cluster)
    assert bare.ring[0] == pytest.approx(7 * one)
    assert bare.allgather[1] == pytest.approx(bare.allgather[0] + collective_time_s(
        "reduce_scatter", kv, tuple(range(8)), cluster))


def test_estimate_of_a_cp_plan_matches_cp1_compute_and_adds_the_exchange():
    """Same tokens per rank and step at cp=2 as at cp=1 (m doubles, each microbatch is half
    the tokens): the compute and the model FLOPs agree; the K/V exchange is extra."""
    graph = fxplan.capture("gpt-tiny", batch=1)
    cluster = Cluster.load("local-cpu:devices=4")
    one = estimate(graph, cluster, ParallelConfig(dp=4), batch=16)
    two = estimate(graph, cluster, ParallelConfig(dp=4, cp=2), batch=16)
    assert two.config.num_microbatches == 2 * one.config.num_microbatches
    assert two.model_flops == pytest.approx(one.model_flops)
    assert two.breakdown["compute"] == pytest.approx(one.breakdown["compute"], rel=1e-6)
    assert two.breakdown["tp_comm"] > one.breakdown["tp_comm"]
    assert two.memory[0].activations < one.memory[0].activations
    with pytest.raises(CostModelError, match=r"2·cp = 6 chunks.*64 mod 6 = 4"):
        check_cp(graph, 3)
