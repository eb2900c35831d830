"""The overlaps an estimate relies on are the runtime's: listed by name, and where the runtime
reduces after the backward and waits (torch's REDUCE_GRAD under the multi-stage schedules
with FSDP2), nothing is hidden."""

from __future__ import annotations

import numpy as np
import pytest

from fxplan.core.config import ParallelConfig
from fxplan.cost_model.step.overlap import dp_reduce_blocks, relied_overlaps
from fxplan.cost_model.step.simulator import StageCosts, simulate_step


def _names(text: str, overlap: float = 1.0) -> list[str]:
    return [o.name for o in relied_overlaps(ParallelConfig.parse(text), overlap)]


@pytest.mark.parametrize("text,names", [
    ("dp=8", ["dp_grad_reduce"]),                                      # DDP, accumulation loop
    ("dp=4,tp=2,pp=2,schedule=1f1b,zero=2", ["dp_grad_reduce"]),       # ReduceInLastBackward
    ("dp=4,tp=2,pp=2,schedule=interleaved:2,zero=1", []),              # REDUCE_GRAD, blocking
    ("dp=4,tp=1,pp=2,schedule=interleaved:2,zero=0", ["dp_grad_reduce"]),  # DDP's reducer
    ("dp=8,zero=3", ["zero3_prefetch"]),
    ("dp=1,tp=2,pp=4,schedule=zbv", ["weight_grad_in_bubbles"]),
    ("dp=1,tp=2,pp=4,schedule=dualpipev", ["weight_grad_in_bubbles"]),   # its pairs: none
    # the cost model prices it (the runtime refuses ZeRO-1 with tp beside a zero-bubble
    # schedule and dp > 1: core.zero_bubble_dp); its dp reduction blocks, no overlap credited
    ("dp=4,tp=2,pp=2,schedule=dualpipev,zero=1", ["weight_grad_in_bubbles"]),
    ("dp=4,tp=1,pp=2,schedule=zb,zero=0", ["weight_grad_in_bubbles"]),  # reduced after the step
    ("dp=4,tp=2,pp=2,schedule=interleaved:2,zero=1,sp=on,pg_overlap=on",
     ["dp_grad_reduce", "param_gather"]),                              # priced as Megatron runs it
    ("dp=1,tp=8", []),
])
def test_relied_overlaps(text: str, names: list[str]) -> None:
    assert _names(text) == names


def test_nothing_hides_without_comm_overlap() -> None:
    assert _names("dp=8", 0.0) == [] and _names("dp=8,zero=3", 0.0) == []


def test_blocking_reduction_is_exposed_whole() -> None:
    """Four 0.1 s buckets over a 2 s last backward: hidden but the last (0.1 s) when reduced
    inside the backward, all 0.4 s when reduced after it and waited for."""
    p = 2
    forward, backward = np.zeros((4, p, 2)), np.zeros((4, p, 2))
    forward[0], backward[0] = 1.0, 2.0
    buckets = tuple(tuple(((i + 1) / 4, 0.1) for i in range(4)) for _ in range(2))
    costs = dict(forward=forward, backward=backward, grad_buckets=(buckets,) * p,
                 post=np.zeros(p), optimizer=np.zeros(p))
    inside = simulate_step(StageCosts(**costs), "interleaved", 4)
    after = simulate_step(StageCosts(**costs, dp_blocking=True), "interleaved", 4)
    assert inside.breakdown["dp_comm"] == pytest.approx(0.1)
    assert after.breakdown["dp_comm"] == pytest.approx(0.8)     # two chunks × four buckets
    assert after.step_time_s - inside.step_time_s == pytest.approx(0.7)
    assert dp_reduce_blocks(ParallelConfig.parse("dp=4,tp=2,pp=2,schedule=interleaved:2,"
                                                 "zero=1"))


def test_estimate_lists_its_overlaps() -> None:
    from fxplan.api import capture
    from fxplan.cluster_specs import Cluster
    from fxplan.cost_model import estimate

    graph = capture("gpt:layers=4,hidden=128,heads=8,vocab=512,seq=64", batch=32)
    est = estimate(graph, Cluster.load("dgx-a100-80g:nodes=1"),
                   ParallelConfig.parse("dp=4,zero=3,tp=2"), batch=32)
    assert [o["name"] for o in est.to_dict()["overlaps"]] == ["zero3_prefetch"]
