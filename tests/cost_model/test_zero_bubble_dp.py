"""A zero-bubble pipeline beside data parallelism is priced as the runtime runs it: no DDP, the
gradients all-reduced in one pass after the step's last weight gradient, all of it exposed
(``fxplan.core.zero_bubble_dp``); with the rule off (the pricing before it) every other
configuration keeps its numbers."""

from __future__ import annotations

import pytest

from fxplan.core.config import ParallelConfig
from fxplan.core.zero_bubble_dp import after_step_refusal, reduces_after_step
from fxplan.cost_model.host import host_overhead
from fxplan.cost_model.host.host_overhead import ddp_runs
from fxplan.cost_model.step.overlap import dp_reduce_blocks, relied_overlaps

MODEL = "gpt:layers=4,hidden=128,heads=8,vocab=512,seq=64"
BATCH = 32


@pytest.fixture(scope="module")
def priced():
    from fxplan.api import capture
    from fxplan.cluster_specs import Cluster
    from fxplan.cost_model import estimate

    graph, cluster = capture(MODEL, batch=BATCH), Cluster.load("dgx-a100-80g:nodes=1")
    return lambda text: estimate(graph, cluster, ParallelConfig.parse(text), batch=BATCH)


@pytest.mark.parametrize("text", ["dp=4,pp=2,schedule=zb,zero=0", "dp=4,pp=2,schedule=zb:2",
                                  "dp=2,tp=2,pp=2,schedule=zbv", "dp=4,pp=2,schedule=zbv,zero=1",
                                  "dp=4,pp=2,schedule=dualpipev,mb=1",
                                  # the host optimizer steps after the pass
                                  "dp=4,pp=2,schedule=zb,zero=1,offload=optimizer"])
def test_the_reduction_after_the_step_blocks_and_hides_nothing(text: str) -> None:
    config = ParallelConfig.parse(text)
    assert reduces_after_step(config) and after_step_refusal(config) is None
    assert not ddp_runs(config) and dp_reduce_blocks(config)
    assert "dp_grad_reduce" not in [o.name for o in relied_overlaps(config)]


@pytest.mark.parametrize("text,why", [
    ("dp=4,pp=2,schedule=zb,zero=2", "ZeRO-2"), ("dp=4,pp=2,schedule=zbv,zero=3", "ZeRO-3"),
    ("dp=2,tp=2,pp=2,schedule=zb,zero=1", "tp=2"),
    ("dp=4,pp=2,schedule=zb,zero=3,offload=optimizer+params", "ZeRO-3"),
])
def test_what_needs_fsdp2_is_refused(text: str, why: str) -> None:
    assert why in after_step_refusal(ParallelConfig.parse(text))


@pytest.mark.parametrize("text", ["dp=1,pp=2,schedule=zb", "dp=4,pp=2,schedule=1f1b",
                                  "dp=4,pp=2,schedule=interleaved:2", "dp=8"])
def test_other_plans_are_not_concerned(text: str) -> None:
    assert not reduces_after_step(ParallelConfig.parse(text))


def test_the_exposed_sync_is_in_the_breakdown(priced) -> None:
    """pp=2 × dp=4 under zb: the critical stage's dp row is every gradient bucket's time plus
    its post-backward traffic, none of it hidden; under 1F1B, DDP hides the buckets behind
    the last backward (the same bytes), so zb's dp row is the larger."""
    zb = priced("dp=4,pp=2,schedule=zb,zero=0")
    costs, c = zb.stage_plan.costs, zb.critical_stage
    buckets = sum(t for chunk in costs.grad_buckets[c] for _, t in chunk)
    assert costs.blocks(c) and buckets > 0
    assert zb.breakdown["dp_comm"] == pytest.approx(buckets + float(costs.post[c]))
    assert "dp_grad_reduce" not in [o["name"] for o in zb.to_dict()["overlaps"]]
    hidden = priced("dp=4,pp=2,schedule=1f1b,zero=0")
    assert "dp_grad_reduce" in [o["name"] for o in hidden.to_dict()["overlaps"]]
    assert zb.breakdown["dp_comm"] > hidden.breakdown["dp_comm"]


@pytest.mark.parametrize("text,changed", [
    ("dp=1,tp=4,pp=2,schedule=zb", False), ("dp=1,tp=4,pp=2,schedule=zbv", False),
    ("dp=4,pp=2,schedule=1f1b", False), ("dp=4,pp=2,schedule=interleaved:2", False),
    ("dp=4,pp=2,schedule=zb,zero=0", True), ("dp=4,pp=2,schedule=zb,zero=1", True),
])
def test_only_zero_bubble_beside_dp_changes(priced, monkeypatch, text: str,
                                            changed: bool) -> None:
    """With the rule switched off the cost model prices as before it (DDP assumed to reduce
    inside the last backward): every configuration but a zero-bubble one with dp > 1 gets the
    same numbers, and that one a longer step."""
    now = priced(text)
    monkeypatch.setattr(host_overhead, "reduces_after_step", lambda config: False)
    before = priced(text)
    if not changed:
        assert now.step_time_s == before.step_time_s and now.breakdown == before.breakdown
    else:
        assert now.step_time_s > before.step_time_s
        assert now.breakdown["dp_comm"] > before.breakdown["dp_comm"]
