"""Host-overhead and communication-overlap terms (:mod:`fxplan.cost_model.host.host_overhead`)."""

from __future__ import annotations

import numpy as np
import pytest

from fxplan.cluster_specs import Cluster
from fxplan.core.config import ParallelConfig
from fxplan.cost_model.host.host_overhead import (async_batch_s, ddp_buckets, dtensor_params,
                                             evicted_waits_s, optimizer_host_s,
                                             overlapped_buckets, pipeline_host_s,
                                             redistribute_host_s, zero3_exposed_s)
from fxplan.cost_model.memory.breakdown import (ADAM_AMP, ADAM_FP32, ADAM_MIXED, adam_for,
                                                model_state_bytes)

GATHER = [1.0, 2.0, 3.0]
SCATTER = [0.5, 0.25, 0.125]


def test_zero3_without_overlap_exposes_every_gather_and_scatter() -> None:
    fwd, bwd = zero3_exposed_s([10.0] * 3, [20.0] * 3, GATHER, SCATTER, overlap=0.0)
    assert fwd == pytest.approx(sum(GATHER))
    assert bwd == pytest.approx(sum(GATHER) + sum(SCATTER))


def test_zero3_with_overlap_hides_all_but_the_first_gather_and_last_scatter() -> None:
    fwd, bwd = zero3_exposed_s([10.0] * 3, [20.0] * 3, GATHER, SCATTER, overlap=1.0)
    assert fwd == pytest.approx(GATHER[0])
    assert bwd == pytest.approx(GATHER[-1] + SCATTER[0])


def test_zero3_with_overlap_exposes_what_compute_cannot_cover() -> None:
    # forward: AG_1 = 2 behind f_0 = 0.5 → 1.5 exposed, AG_2 = 3 behind f_1 = 0.5 → 2.5
    fwd, _ = zero3_exposed_s([0.5] * 3, [100.0] * 3, GATHER, SCATTER, overlap=1.0)
    assert fwd == pytest.approx(1.0 + 1.5 + 2.5)
    half, _ = zero3_exposed_s([100.0] * 3, [100.0] * 3, GATHER, SCATTER, overlap=0.5)
    assert half == pytest.approx(1.0 + 0.5 * (2.0 + 3.0))


def test_buckets_keep_their_readiness_only_as_far_as_they_overlap() -> None:
    buckets = ((0.25, 4.0), (1.0, 2.0))
    assert overlapped_buckets(buckets, 1.0) == buckets
    assert overlapped_buckets(buckets, 0.0) == ((1.0, 4.0), (1.0, 2.0))
    assert sorted(overlapped_buckets(buckets, 0.25)) == sorted(
        ((0.25, 1.0), (1.0, 0.5), (1.0, 3.0), (1.0, 1.5)))


def test_dtensor_parameters_follow_the_runtime() -> None:
    def config(**kw: int) -> ParallelConfig:
        return ParallelConfig(**{"dp": 1, "tp": 1, "pp": 1, **kw})

    assert not dtensor_params(config(dp=4))
    assert not dtensor_params(config(dp=4, zero_stage=1))           # ZeroRedundancyOptimizer
    assert dtensor_params(config(dp=4, zero_stage=2))               # FSDP2
    assert dtensor_params(config(dp=4, zero_stage=3))
    assert dtensor_params(config(tp=2))
    assert dtensor_params(config(dp=2, tp=2, zero_stage=1))         # ZeRO-1 as FSDP2


def test_local_cpu_prices_host_work_and_no_overlap() -> None:
    cpu = Cluster.load("local-cpu:devices=2").device_groups[0]
    assert cpu.comm_overlap == 0.0
    assert optimizer_host_s(28, cpu.host, dtensor=True) > optimizer_host_s(28, cpu.host,
                                                                     dtensor=False) > 0


def test_gpu_specs_keep_their_overlap_and_no_host_terms() -> None:
    gpu = Cluster.load("dgx-a100-80g").device_groups[0]
    assert gpu.comm_overlap == 1.0
    assert gpu.host is None
    assert optimizer_host_s(100, gpu.host, dtensor=True) == 0.0
    assert redistribute_host_s(100, gpu.host) == 0.0


def test_each_tp_collective_pays_dtensors_redistribution_on_local_cpu() -> None:
    import fxplan
    from fxplan.cli.constraint_text import parse_constraints

    cpu = Cluster.load("local-cpu:devices=2").device_groups[0]
    assert cpu.host.dtensor_redistribute_us > 0
    assert redistribute_host_s(3, cpu.host) == pytest.approx(3 * cpu.host.dtensor_redistribute_us * 1e-6)

    def tp_row(cluster: str) -> float:
        plan = fxplan.search("gpt-tiny", cluster, batch=16, progress=False,
                             constraints=parse_constraints("tp=2,sp=on,recompute=none"))
        return plan.estimate["breakdown"]["tp_comm"]

    # the same plan with the term off: the tp row differs by a whole number of collectives,
    # at least the layout's 2 + 2 per layer forward and backward (gpt-tiny: 2 layers)
    extra = tp_row("local-cpu:devices=2") - tp_row("local-cpu:devices=2,cpu.dtensor_redistribute_us=0")
    count = extra / redistribute_host_s(1, cpu.host)
    assert count == pytest.approx(round(count), abs=1e-6) and round(count) >= 16


def test_fp32_adam_moves_four_byte_weights_with_the_same_total_state() -> None:
    assert adam_for("fp32") is ADAM_FP32 and adam_for("bf16", "megatron") is ADAM_MIXED
    assert adam_for("fp32", "megatron") is ADAM_FP32 and adam_for("bf16") is ADAM_AMP
    fp32 = model_state_bytes(1000, 1, 0, ADAM_FP32)
    mixed = model_state_bytes(1000, 1, 0, ADAM_MIXED)
    assert (fp32.params, fp32.grads, fp32.optimizer) == (4000, 4000, 8000)
    assert fp32.total == mixed.total


@pytest.fixture(scope="module")
def tiny():  # type: ignore[no-untyped-def]
    import torch

    from fxplan.api import capture

    return capture("gpt:layers=2,hidden=64,heads=4,vocab=256,seq=32", batch=1,
                   dtype=torch.float32)


def _estimate(graph, text: str, devices: int = 2):  # type: ignore[no-untyped-def]
    from fxplan.cost_model import estimate

    cluster = Cluster.load(f"local-cpu:devices={devices}")
    return estimate(graph, cluster, ParallelConfig.parse(text), batch=8)


def test_no_overlap_exposes_the_whole_gradient_sync_and_every_zero3_gather(tiny) -> None:  # type: ignore[no-untyped-def]
    from fxplan.cost_model.comm.collectives import collective_time_s

    cluster = Cluster.load("local-cpu:devices=2")
    dp = _estimate(tiny, "dp=2,mb=4")
    whole = collective_time_s("all_reduce", 4 * tiny.num_params, range(2), cluster)
    # one bucket per segment: at least the whole gradient's bandwidth term is exposed
    assert dp.breakdown["dp_comm"] >= 0.9 * whole
    z3 = _estimate(tiny, "dp=2,mb=4,zero=3")
    gather = collective_time_s("all_gather", 4 * tiny.num_params, range(2), cluster)
    assert z3.breakdown["zero_comm"] >= 2 * 0.9 * gather  # forward and backward gathers


def test_tensor_parallel_pays_dtensor_dispatch(tiny) -> None:  # type: ignore[no-untyped-def]
    tp = _estimate(tiny, "tp=2,mb=8")
    dp = _estimate(tiny, "dp=2,mb=4")
    # per-op DTensor dispatch and DTensor optimizer steps make tp's host work dominate here
    assert tp.breakdown["compute"] > dp.breakdown["compute"]
    assert tp.breakdown["optimizer"] > dp.breakdown["optimizer"]


def test_zero1_without_tp_prices_ddp_and_an_async_batch_of_broadcasts(tiny) -> None:  # type: ignore[no-untyped-def]
    from fxplan.cost_model.comm.collectives import collective_time_s

    cluster = Cluster.load("local-cpu:devices=2")
    cpu = cluster.device_groups[0]
    z0 = _estimate(tiny, "dp=2,mb=4")
    z1 = _estimate(tiny, "dp=2,mb=4,zero=1")
    tensors = len({p.tied_to or name for name, p in tiny.params.items()})
    one = collective_time_s("broadcast", 4.0, range(2), cluster)  # latency of one collective
    # ZeRO-0's all-reduce, then one rendezvous and a queued broadcast per further tensor
    extra = z1.breakdown["dp_comm"] - z0.breakdown["dp_comm"]
    assert extra >= 0.9 * (one + (tensors - 1) * cpu.host.queued_collective_us * 1e-6)
    # on 4 ranks (3 hops per broadcast) cheaper than every broadcast meeting the others, each
    # a blocking wait with its cache refill (measured on 4 pinned ranks of 2 cores: each
    # further one 816–823 µs against 1075–1171 for one alone,
    # benchmarks/data/queued_collective_2026-11-25_e1334ce.json)
    four = Cluster.load("local-cpu:devices=4")
    extra4 = (_estimate(tiny, "dp=4,mb=2,zero=1", 4).breakdown["dp_comm"]
              - _estimate(tiny, "dp=4,mb=2", 4).breakdown["dp_comm"])
    meeting = (collective_time_s("broadcast", 4.0, range(4), four)
               + four.device_groups[0].host.switch_refill_us * 1e-6)
    assert extra4 < 0.9 * tensors * meeting


def test_async_batch_pays_one_rendezvous_and_queued_collectives() -> None:
    # t_1 + Σ_{i≥2} (t_i − ℓ_i + q)
    assert async_batch_s([3.0, 2.0, 2.0], [1.0, 1.0, 1.0], 0.5) == pytest.approx(6.0)
    assert async_batch_s([3.0, 2.0, 2.0], [1.0, 1.0, 1.0], 0.0) == pytest.approx(7.0)
    assert async_batch_s([], [], 0.5) == 0.0


def test_ddp_buckets_pack_gradients_up_to_the_cap() -> None:
    mib = 2.0**20
    grads = [(0.25, 0.3 * mib), (0.5, 0.3 * mib), (0.75, 0.6 * mib), (0.9, 20 * mib),
             (1.0, 10 * mib)]
    # first bucket closes once it reaches 1 MiB, the next ones at 25 MiB; the rest at the end
    assert ddp_buckets(grads, 25.0) == ((0.75, 1.2 * mib), (1.0, 30 * mib))
    assert ddp_buckets(grads, 0.0) == tuple(grads)                   # GPU specs: per segment


def test_local_cpu_reduces_a_small_model_in_one_ddp_bucket(tiny) -> None:  # type: ignore[no-untyped-def]
    from fxplan.cost_model.comm.collectives import collective_time_s

    cluster = Cluster.load("local-cpu:devices=2")
    assert cluster.device_groups[0].ddp_bucket_mib == 25.0
    assert Cluster.load("dgx-a100-80g").device_groups[0].ddp_bucket_mib == 0.0
    unique = sum(p.numel for name, p in tiny.params.items() if not p.tied_to)
    dp = _estimate(tiny, "dp=2,mb=4")
    # one all-reduce of the whole gradient (< 1 MiB), exposed after the backward (ω = 0),
    # the trainer's 4-byte loss all-reduce (cost_model.step_scalars) and DDP's broadcast of
    # the buffers, one per dtype, all in the dp row
    from fxplan.cost_model.host.host_overhead import ddp_buffer_bytes

    buffers = [(n, float(b.numel() * b.element_size()), str(b.dtype))
               for n, b in tiny.gm.named_buffers()]
    layers = list(tiny.layer_names.values())
    broadcasts = ddp_buffer_bytes(buffers, layers, layers, first=True)
    assert dp.breakdown["dp_comm"] == pytest.approx(
        collective_time_s("all_reduce", 4 * unique, range(2), cluster)
        + collective_time_s("all_reduce", 4.0, range(2), cluster)
        + sum(collective_time_s("broadcast", b, range(2), cluster) for b in broadcasts))


def test_ddp_host_work_is_charged_only_where_ddp_runs(tiny) -> None:  # type: ignore[no-untyped-def]
    from fxplan.cost_model.host.host_overhead import ddp_host_s, ddp_runs

    def config(**kw: int) -> ParallelConfig:
        return ParallelConfig(**{"dp": 1, "tp": 1, "pp": 1, **kw})

    assert ddp_runs(config(dp=2)) and ddp_runs(config(dp=2, zero_stage=1))
    assert not any(ddp_runs(c) for c in (config(), config(dp=2, zero_stage=2),
                                         config(dp=2, tp=2), config(tp=2)))
    cpu = Cluster.load("local-cpu:devices=2").device_groups[0]
    assert cpu.host.ddp_step_us > 0 and cpu.host.ddp_tensor_us > 0
    assert ddp_host_s(28, Cluster.load("dgx-a100-80g").device_groups[0].host) == 0.0
    tensors = len({p.tied_to or name for name, p in tiny.params.items()})
    off = "local-cpu:devices=2,cpu.ddp_step_us=0,cpu.ddp_tensor_us=0"
    from fxplan.cost_model import estimate

    def optimizer(text: str, cluster: str) -> float:
        return estimate(tiny, Cluster.load(cluster), ParallelConfig.parse(text),
                        batch=8).breakdown["optimizer"]

    assert optimizer("dp=2,mb=4", "local-cpu:devices=2") - optimizer("dp=2,mb=4", off) == \
        pytest.approx(ddp_host_s(tensors, cpu.host), rel=1e-6)
    assert optimizer("dp=2,mb=4,zero=2", "local-cpu:devices=2") == \
        optimizer("dp=2,mb=4,zero=2", off)


def test_ddp_buffer_bytes_one_broadcast_per_dtype_on_the_stage_holding_the_buffer() -> None:
    # gpt-tiny's buffers: the positions (outside the layers) and one causal mask per layer
    from fxplan.cost_model.host.host_overhead import ddp_buffer_bytes

    buffers = [("positions", 512.0, "torch.int64"), ("h.0.attn.future", 4096.0, "torch.bool"),
               ("h.1.attn.future", 4096.0, "torch.bool")]
    layers = ["h.0", "h.1"]
    assert ddp_buffer_bytes(buffers, layers, layers, first=True) == (512.0, 8192.0)
    assert ddp_buffer_bytes(buffers, layers, ["h.0"], first=True) == (512.0, 4096.0)
    assert ddp_buffer_bytes(buffers, layers, ["h.1"], first=False) == (4096.0,)
    assert ddp_buffer_bytes([], layers, layers, first=True) == ()


def test_first_touch_adds_the_saved_activations_pages_to_the_forward(tiny) -> None:  # type: ignore[no-untyped-def]
    # local-cpu: every segment's forward carries A / MiB · first_touch_us_per_mib, A its saved
    # bytes; a recomputed forward the bytes the policy no longer keeps; 0 on the GPU specs
    from fxplan.cluster_specs import local_cpu
    from fxplan.cost_model.host.host_overhead import first_touch_s
    from fxplan.cost_model.step.layer_costs import graph_segments, segment_cost

    cpu = Cluster.load("local-cpu:devices=1").device_groups[0]
    assert cpu.host.first_touch_us_per_mib == pytest.approx(
        local_cpu.REFAULT_FRACTION * 256 * local_cpu.FIRST_TOUCH_PAGE_US, rel=1e-3)
    assert first_touch_s(2**20, cpu.host) == pytest.approx(cpu.host.first_touch_us_per_mib * 1e-6)
    assert Cluster.load("dgx-a100-80g").device_groups[0].host is None
    off = Cluster.load("local-cpu:devices=1,cpu.first_touch_us_per_mib=0").device_groups[0]
    key = graph_segments(tiny).layers[0][0]

    def seg(device, recompute="none"):  # type: ignore[no-untyped-def]
        return segment_cost(tiny, key, tp=1, sequence_parallel=False, recompute=recompute,
                            microbatch=4, device=device)

    on, bare = seg(cpu), seg(off)
    assert on.activations.saved > 0
    assert on.forward_s - bare.forward_s == pytest.approx(
        first_touch_s(on.activations.saved, cpu.host), rel=1e-9)
    assert on.backward_s == bare.backward_s
    full, full_bare = seg(cpu, "full"), seg(off, "full")
    assert full.recompute_s - full_bare.recompute_s == pytest.approx(
        first_touch_s(on.activations.saved - full.activations.saved, cpu.host), rel=1e-9)


def test_view_nodes_pay_their_dispatch_on_local_cpu_only(tiny) -> None:  # type: ignore[no-untyped-def]
    # a view node runs no kernel (the roofline prices it 0) but costs the host view_op_us
    # forward and view_backward_op_us backward; 0 on the GPU specs
    from fxplan.cost_model.step.layer_costs import graph_segments, segment_cost

    cpu = Cluster.load("local-cpu:devices=1").device_groups[0]
    assert cpu.host.view_op_us > 0 and cpu.host.view_backward_op_us > 0
    gpu = Cluster.load("dgx-a100-80g").device_groups[0]
    assert gpu.host is None
    off = Cluster.load("local-cpu:devices=1,cpu.view_op_us=0,cpu.view_backward_op_us=0"
                       ).device_groups[0]
    key, names = graph_segments(tiny).layers[0]
    views = sum(tiny.infos_by_name[n].op_class == "view" for n in names)
    assert views > 0

    def seg(device):  # type: ignore[no-untyped-def]
        return segment_cost(tiny, key, tp=1, sequence_parallel=False, recompute="none",
                            microbatch=4, device=device)

    assert seg(cpu).forward_s - seg(off).forward_s == pytest.approx(
        views * cpu.host.view_op_us * 1e-6, rel=1e-9)
    assert seg(cpu).backward_s - seg(off).backward_s == pytest.approx(
        views * cpu.host.view_backward_op_us * 1e-6, rel=1e-9)


def test_waits_refill_the_caches_where_the_core_has_other_work(tiny) -> None:  # type: ignore[no-untyped-def]
    """On time-shared cores a blocking collective pays ``switch_refill_us`` where the waiting
    rank's core has another rank with work: every wait of a single-stage plan (tp
    collectives, dp reductions, scalars, buffer broadcasts), and with pipeline stages only
    the tp collectives beside another data-parallel replica."""
    from fxplan.cost_model import estimate

    refill = 500.0
    on = Cluster.load(f"local-cpu:devices=4,cpu.switch_refill_us={refill}")
    off = Cluster.load("local-cpu:devices=4,cpu.switch_refill_us=0")
    device = on.device_groups[0]
    assert evicted_waits_s(3, device.host, True) == pytest.approx(3 * refill * 1e-6)
    assert evicted_waits_s(3, device.host, False) == 0.0

    def row(cluster: Cluster, text: str, name: str) -> float:
        return estimate(tiny, cluster, ParallelConfig.parse(text), batch=8).breakdown.get(
            name, 0.0)

    def tp_collectives(text: str) -> int:
        priced = estimate(tiny, on, ParallelConfig.parse(text), batch=8)
        return sum(len(seg.tp_forward) + len(seg.tp_backward)
                   for chunk in priced.stage_plan.chunks[0] for seg in chunk)

    # one refill per tp collective the critical stage waits in: beside another replica, and
    # in one tp group over the node (its core-mates run the same step)
    for text in ("dp=2,tp=2,mb=4", "tp=4,mb=8"):
        extra = row(on, text, "tp_comm") - row(off, text, "tp_comm")
        assert tp_collectives(text) >= 4 and extra == pytest.approx(
            tp_collectives(text) * refill * 1e-6)
    # a single stage's data-parallel waits pay too (buffer broadcast, reduction, scalars)
    assert row(on, "dp=4,mb=2", "dp_comm") - row(off, "dp=4,mb=2", "dp_comm") >= \
        3 * refill * 1e-6
    # pipeline stages: the ranks beside run another stage, no tp group has a replica beside
    assert row(on, "pp=2,tp=2,mb=2", "tp_comm") == pytest.approx(row(off, "pp=2,tp=2,mb=2",
                                                                       "tp_comm"))
    assert row(on, "pp=2,dp=2,mb=2", "dp_comm") == pytest.approx(row(off, "pp=2,dp=2,mb=2",
                                                                       "dp_comm"))
    # GPU specs: nothing
    assert Cluster.load("dgx-a100-80g").device_groups[0].host is None


def test_pipeline_runtime_host_work_per_microbatch_and_step(tiny) -> None:  # type: ignore[no-untyped-def]
    """With ``pp > 1`` each chunk's forward and backward carry half of
    ``pipeline_microbatch_us`` and each stage's step ``pipeline_step_us``; one stage: none."""
    from fxplan.cost_model import estimate

    per_microbatch, per_step = 300.0, 900.0
    on = Cluster.load(f"local-cpu:devices=2,cpu.pipeline_microbatch_us={per_microbatch},"
                      f"cpu.pipeline_step_us={per_step}")
    off = Cluster.load("local-cpu:devices=2,cpu.pipeline_microbatch_us=0,"
                       "cpu.pipeline_step_us=0")
    assert pipeline_host_s(on.device_groups[0].host) == pytest.approx(
        (per_microbatch / 2 * 1e-6, per_microbatch / 2 * 1e-6, per_step * 1e-6))

    def costs(cluster: Cluster, text: str):  # type: ignore[no-untyped-def]
        return estimate(tiny, cluster, ParallelConfig.parse(text), batch=8).stage_plan.costs

    with_, without = costs(on, "pp=2,mb=2"), costs(off, "pp=2,mb=2")
    assert (with_.forward[0] - without.forward[0]) == pytest.approx(
        per_microbatch / 2 * 1e-6 * np.ones_like(with_.forward[0]))
    assert (with_.backward[0] - without.backward[0]) == pytest.approx(
        per_microbatch / 2 * 1e-6 * np.ones_like(with_.backward[0]))
    assert with_.optimizer - without.optimizer == pytest.approx(per_step * 1e-6 * np.ones(2))
    one_stage = costs(on, "dp=2,mb=4"), costs(off, "dp=2,mb=4")
    assert one_stage[0].forward == pytest.approx(one_stage[1].forward)
    assert one_stage[0].optimizer == pytest.approx(one_stage[1].optimizer)
    # GPU specs: nothing
    gpu = Cluster.load("dgx-a100-80g").device_groups[0]
    assert gpu.host is None and pipeline_host_s(gpu.host) == (0.0, 0.0, 0.0)
