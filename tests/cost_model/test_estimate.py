"""``cost_model.step.estimate``: the surface, its accounting, and the effects each part of a
configuration must have (``fxplan estimate`` itself: ``tests/cli/test_estimate.py``)."""

from __future__ import annotations

import json

import pytest
import torch

from fxplan.cluster_specs import Cluster
from fxplan.core.placements import Partial, PlacementMap, Replicate, Shard
from fxplan.cost_model import CostModelError, Estimate, ParallelConfig, estimate
from fxplan.cost_model.parallel.megatron_layout import REPL, SHARD
from fxplan.cost_model.parallel.tp_layout import tp_layout
from fxplan.api import capture

SPEC = "gpt:layers=8,hidden=256,heads=8,vocab=1024,seq=128"
BATCH = 64


@pytest.fixture(scope="module")
def graph():  # type: ignore[no-untyped-def]
    return capture(SPEC, batch=1, dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    return Cluster.load("dgx-a100-80g:nodes=2")


def run(graph, cluster, text: str, batch: int = BATCH) -> Estimate:  # type: ignore[no-untyped-def]
    return estimate(graph, cluster, ParallelConfig.parse(text), batch=batch)


def test_result_surface(graph, cluster) -> None:  # type: ignore[no-untyped-def]
    e = run(graph, cluster, "dp=4,tp=2,pp=2,mb=2,schedule=interleaved:2,zero=1,recompute=selective,sp=on")
    data = e.to_dict()
    for key in ("step_time_s", "tflops_per_device", "mfu", "peak_memory_gib", "fits", "breakdown",
                "memory_breakdown_gib", "tokens_per_s", "samples_per_s"):
        assert key in data
    assert len(data["peak_memory_gib"]) == 2 and data["fits"] is True
    assert sum(e.breakdown.values()) == pytest.approx(e.step_time_s)
    assert e.config.num_microbatches == BATCH // (4 * 2)
    assert json.loads(json.dumps(data)) == data
    events = e.timeline()
    assert len(events) == 2 * 2 * 2 * e.config.num_microbatches   # stages × chunks × F/B × m
    assert all(ev.end > ev.start >= 0 for ev in events)


def test_flops_follow_megatron_convention(graph, cluster) -> None:  # type: ignore[no-untyped-def]
    full = run(graph, cluster, "dp=16,mb=4,recompute=full")
    none = run(graph, cluster, "dp=16,mb=4,recompute=none")
    assert full.hardware_flops == pytest.approx(graph.training_flops(recompute=True) * BATCH)
    assert none.hardware_flops == none.model_flops == pytest.approx(graph.training_flops(False) * BATCH)
    peak = cluster.device(0).peak("bf16") * 1e12
    assert full.mfu == pytest.approx(full.model_flops / (16 * full.step_time_s * peak))
    assert full.step_time_s > none.step_time_s


def test_tensor_parallel_communication(graph, cluster) -> None:  # type: ignore[no-untyped-def]
    assert run(graph, cluster, "dp=16").breakdown["tp_comm"] == 0
    tp = run(graph, cluster, "dp=2,tp=8").breakdown["tp_comm"]
    sp = run(graph, cluster, "dp=2,tp=8,sp=on").breakdown["tp_comm"]
    assert tp > 0
    assert sp == pytest.approx(tp, rel=0.5)  # reduce-scatter + all-gather move what all-reduce does


def test_data_parallel_sync_overlaps_backward(graph, cluster) -> None:  # type: ignore[no-untyped-def]
    from fxplan.cost_model.comm.collectives import collective_time_s

    e = run(graph, cluster, "dp=16,mb=1")
    whole = collective_time_s("all_reduce", e.optimizer.grad_bytes * graph.num_params, range(16),
                              cluster)
    assert 0 <= e.breakdown["dp_comm"] < whole


def test_zero3_gathers_weights(graph, cluster) -> None:  # type: ignore[no-untyped-def]
    z0 = run(graph, cluster, "dp=16,zero=0")
    z3 = run(graph, cluster, "dp=16,zero=3")
    assert z3.breakdown["zero_comm"] > 0 == z0.breakdown["zero_comm"]
    assert z3.memory[0].optimizer == pytest.approx(z0.memory[0].optimizer / 16)


def test_zero2_reduce_scatters_in_every_microbatch_backward(graph, cluster) -> None:  # type: ignore[no-untyped-def]
    """ZeRO-2 keeps only its gradient shard, so with m > 1 each backward reduce-scatters
    (ParallelConfig.reduces_every_microbatch, as the runtime does): priced per microbatch in
    the ZeRO row, without ZeRO-3's gathers; with m = 1 the one reduction is the last
    backward's gradient buckets."""
    from fxplan.cost_model.step.overlap import relied_overlaps

    once = run(graph, cluster, "dp=16,mb=4,zero=2")      # m = 1
    every = run(graph, cluster, "dp=16,mb=1,zero=2")     # m = 4
    zero3 = run(graph, cluster, "dp=16,mb=1,zero=3")
    zero1 = run(graph, cluster, "dp=16,mb=1,zero=1")
    assert once.config.num_microbatches == 1 and every.config.num_microbatches == 4
    assert once.breakdown["zero_comm"] == 0 < every.breakdown["zero_comm"]
    assert zero1.breakdown["zero_comm"] == 0
    assert every.breakdown["zero_comm"] < zero3.breakdown["zero_comm"]   # no re-gathers
    assert every.config.reduces_every_microbatch and not zero1.config.reduces_every_microbatch
    texts = {o.name: o.mechanism for o in relied_overlaps(every.config)}
    assert "every microbatch's backward" in texts["dp_grad_reduce"]
    texts = {o.name: o.mechanism for o in relied_overlaps(zero1.config)}
    assert "the last microbatch's backward" in texts["dp_grad_reduce"]


def test_pipeline_bubble_shrinks_with_microbatches(graph, cluster) -> None:  # type: ignore[no-untyped-def]
    few = run(graph, cluster, "dp=4,pp=4,mb=4,schedule=1f1b")
    many = run(graph, cluster, "dp=4,pp=4,mb=1,schedule=1f1b")
    gpipe = run(graph, cluster, "dp=4,pp=4,mb=1,schedule=gpipe")
    assert few.breakdown["bubble"] / few.step_time_s > many.breakdown["bubble"] / many.step_time_s
    assert max(gpipe.peak_memory_gib) > max(many.peak_memory_gib)
    assert many.breakdown["p2p"] > 0


def test_explicit_placements_reproduce_the_default_layout(graph, cluster) -> None:  # type: ignore[no-untyped-def]
    layout = tp_layout(graph)
    placements = {}
    for name, state in layout.state.items():
        if name in layout.row:
            placements[name] = (Shard(0), Partial())
        elif state == SHARD:
            placements[name] = (Shard(0), Shard(2))
        elif state == REPL:
            placements[name] = (Shard(0), Replicate())
    default = run(graph, cluster, "dp=2,tp=8")
    explicit = estimate(graph, cluster, ParallelConfig(dp=2, tp=8, placements=PlacementMap(placements)),
                        batch=BATCH)
    assert explicit.step_time_s == pytest.approx(default.step_time_s)
    assert explicit.peak_memory_gib == pytest.approx(default.peak_memory_gib)


def test_invalid_inputs(graph, cluster) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CostModelError, match="tp=16 does not divide heads=8"):
        run(graph, cluster, "dp=1,tp=16")
    with pytest.raises(CostModelError, match="captured at seq=128"):
        estimate(graph, cluster, ParallelConfig(dp=16), batch=BATCH, seq=256)
