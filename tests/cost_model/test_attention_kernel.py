"""Attention priced as one fused (flash) kernel where the device group says so."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fxplan.api import capture
from fxplan.cluster_specs import Cluster
from fxplan.cost_model.compute.attention_kernel import (causal_fraction, fused_attention_core,
                                                prices_fused_attention)
from fxplan.cost_model.step.layer_costs import graph_segments, segment_cost
from fxplan.cost_model.parallel.tp_layout import tp_layout

SEQ, HIDDEN, HEADS = 256, 128, 4


@pytest.fixture(scope="module")
def graph():  # type: ignore[no-untyped-def]
    return capture(f"gpt:layers=2,hidden={HIDDEN},heads={HEADS},vocab=512,seq={SEQ}",
                   batch=1, seq=SEQ, dtype=torch.bfloat16)


def _devices():  # type: ignore[no-untyped-def]
    fused = Cluster.load("dgx-h100").device_groups[0]
    return fused, dataclasses.replace(fused, fused_attention=False)


def test_builtin_specs_say_whether_attention_is_fused() -> None:
    assert prices_fused_attention(Cluster.load("dgx-h100").device_groups[0])
    assert prices_fused_attention(Cluster.load("hgx-h200").device_groups[0])
    assert not prices_fused_attention(Cluster.load("dgx-a100-80g").device_groups[0])
    off = Cluster.load("dgx-h100:h100.fused_attention=false").device_groups[0]
    assert not prices_fused_attention(off)


def test_causal_fraction() -> None:
    assert causal_fraction(4096) == pytest.approx(33 / 64)
    assert causal_fraction(128) == 1.0


def test_fused_core_replaces_the_score_traffic(graph) -> None:  # type: ignore[no-untyped-def]
    segments = graph_segments(graph)
    _, names = segments.layers[0]
    fused = fused_attention_core(graph, names, tp_layout(graph))
    assert fused is not None and fused.causal
    d = HIDDEN // HEADS
    assert fused.model_flops == 4 * HEADS * SEQ * SEQ * d
    assert fused.flops == pytest.approx(fused.model_flops * causal_fraction(SEQ))
    # q, k, v (one qkv tensor) read, o written, fp32 statistics: no s×s term
    assert fused.bytes_moved == 2 * (3 * SEQ * HIDDEN + SEQ * HIDDEN) + 4 * HEADS * SEQ


def test_fused_pricing_is_faster_and_saves_no_scores(graph) -> None:  # type: ignore[no-untyped-def]
    fused_dev, unfused_dev = _devices()
    key = graph_segments(graph).layers[0][0]
    args = dict(tp=1, sequence_parallel=False, recompute="none", microbatch=1)
    fused = segment_cost(graph, key, device=fused_dev, **args)
    unfused = segment_cost(graph, key, device=unfused_dev, **args)
    assert fused.forward_s < unfused.forward_s and fused.backward_s < unfused.backward_s
    assert fused.matmul_flops == unfused.matmul_flops          # MFU counts the full square
    scores = HEADS * SEQ * SEQ * 2                                # one bf16 s×s tensor
    assert unfused.activations.saved - fused.activations.saved > scores
    assert fused.activations.saved < 40 * SEQ * HIDDEN            # O(s·h), Korthikanti's 34·s·h + stats


def test_causal_sdpa_node_skips_the_masked_tiles() -> None:
    graph = capture("llama:layers=2,hidden=64,heads=4,kv_heads=2,vocab=512,seq=512,"
                    "multiple_of=32", batch=1, seq=512, dtype=torch.bfloat16)
    segments = graph_segments(graph)
    _, names = segments.layers[0]
    fused = fused_attention_core(graph, names, tp_layout(graph))
    assert fused is not None and fused.causal
    assert fused.flops == pytest.approx(fused.model_flops * causal_fraction(512))
    assert fused.flops < fused.model_flops



def test_causal_kernel_runs_at_causal_speed(graph) -> None:  # type: ignore[no-untyped-def]
    """A causal kernel costs its executed FLOPs at CAUSAL_SPEED of the rate: the same kernel
    marked non-causal (same executed FLOPs) is faster by exactly that factor where the
    compute leg dominates."""
    from fxplan.cost_model.compute.attention_kernel import CAUSAL_SPEED
    from fxplan.cost_model.compute.op_time import op_time_s
    from fxplan.cost_model.step.layer_costs import _fused_times

    device, _ = _devices()
    _, names = graph_segments(graph).layers[0]
    core = fused_attention_core(graph, names, tp_layout(graph))
    assert core is not None and core.causal
    # s = 256 is memory-bound on an H100; with little traffic the compute leg prices it
    causal = dataclasses.replace(core, bytes_moved=core.bytes_moved / 100)
    plain = dataclasses.replace(causal, causal=False)
    info = graph.infos_by_name[causal.output]
    shard = 1 / 4096  # 4096 microbatches of the capture: a kernel far past the curve's knee
    (f_c, b_c), (f_p, b_p) = (_fused_times(k, info, device, shard) for k in (causal, plain))
    assert f_c > f_p and b_c > b_p
    launch = op_time_s("attention", 0.0, 0.0, torch.bfloat16, device)
    assert (f_p - launch) / (f_c - launch) == pytest.approx(CAUSAL_SPEED, rel=0.02)
    assert 0.85 <= CAUSAL_SPEED <= 0.95  # cuDNN … FlashAttention-3 on H100 (module docstring)


def test_a_fused_gpt_layer_saves_korthikantis_bytes_without_the_scores() -> None:
    """Priced as a flash kernel, a GPT layer in bf16 saves Korthikanti et al.'s ``34·s·b·h``
    (their ``5·a·s²·b`` is the scores, which the kernel never stores) plus the kernel's fp32
    log-sum-exp per query row and head and the two layer norms' statistics: the attention
    output ``o`` once, as the kernel's and as the projection's input (a GPU's kernel writes it
    in the layout the projection reads, where the CPU capture copies it). Selective recompute
    of that core frees only the log-sum-exp."""
    graph = capture(f"gpt:layers=2,hidden={HIDDEN},heads={HEADS},vocab=512,seq={SEQ},"
                    "dropout=0.1", batch=1, seq=SEQ, dtype=torch.bfloat16)
    key = graph_segments(graph).layers[0][0]
    fused_dev, _ = _devices()
    saved = {policy: segment_cost(graph, key, device=fused_dev, tp=1, sequence_parallel=False,
                                  recompute=policy, microbatch=1).activations.saved
             for policy in ("none", "selective")}
    lse, norm_stats = 4 * HEADS * SEQ, 2 * 2 * SEQ * 2
    assert saved["none"] == 34 * SEQ * HIDDEN + lse + norm_stats
    assert saved["selective"] == saved["none"] - lse
