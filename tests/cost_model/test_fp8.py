"""``cost_model.compute.fp8``: linear layers priced at the FP8 peak with their casts, the transient
FP8 copies in memory, and FP8 refused on devices without an FP8 peak."""

from __future__ import annotations

import pytest
import torch

from fxplan.api import capture
from fxplan.cluster_specs import Cluster
from fxplan.cost_model import CostModelError, ParallelConfig, estimate
from fxplan.cost_model.compute.op_time import node_time_s
from fxplan.cost_model.compute.fp8 import CAST_BYTES, FP8_GEMM_EFFICIENCY, converted, fp8_node_time_s

WIDE = "gpt:layers=2,hidden=4096,heads=32,vocab=51200,seq=2048"


@pytest.fixture(scope="module")
def graph():  # type: ignore[no-untyped-def]
    return capture(WIDE, batch=1, dtype=torch.bfloat16)


def test_only_linear_layers_convert(graph) -> None:  # type: ignore[no-untyped-def]
    infos = [info for _, info in graph.nodes()]
    linears = [i for i in infos if converted(i)]
    assert linears and all(i.op_class == "matmul" and i.params for i in linears)
    assert not any(converted(i) for i in infos if i.op_class == "attention")


def test_a_linear_runs_at_the_fp8_peak_plus_its_casts(graph) -> None:  # type: ignore[no-untyped-def]
    device = Cluster.load("dgx-h100").device(0)
    info = max((i for _, i in graph.nodes() if converted(i)), key=lambda i: i.flops)
    fp8 = fp8_node_time_s(info, device, shard_factor=1, backward=False)
    bf16 = node_time_s(info, device, shard_factor=1)
    gemm = node_time_s(info, device, shard_factor=1, dtype="float8_e4m3fn") / FP8_GEMM_EFFICIENCY
    cast = CAST_BYTES * info.bytes_read / 2 / (device.memory_bandwidth_gb_per_s * 1e9)
    assert fp8 == pytest.approx(gemm + cast, rel=0.3)   # the memory curve's efficiency < 1
    assert gemm < bf16 * 0.6 and fp8 < bf16


def test_fp8_step_is_faster_and_keeps_the_states(graph) -> None:  # type: ignore[no-untyped-def]
    cluster = Cluster.load("dgx-h100")
    config = ParallelConfig(dp=8, microbatch_size=1, zero_stage=1)
    bf16 = estimate(graph, cluster, config, batch=16)
    fp8 = estimate(graph, cluster, config.replace(fp8=True), batch=16)
    assert fp8.step_time_s < bf16.step_time_s
    a, b = bf16.memory[0], fp8.memory[0]
    assert (a.params, a.grads, a.optimizer, a.activations) == \
        (b.params, b.grads, b.optimizer, b.activations)
    assert b.recompute_working > a.recompute_working   # the transient 1-byte copies
    assert fp8.model_flops == bf16.model_flops


def test_fp8_needs_an_fp8_peak(graph) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CostModelError, match="A100-SXM4-80GB lists no fp8 peak"):
        estimate(graph, Cluster.load("dgx-a100-80g"), ParallelConfig(dp=8, fp8=True), batch=16)
