"""Recompute on some layers of each stage (``recompute_layers``), as the estimate prices it:
``k_j = 0`` and ``k_j = n_j`` are the whole-plan ``none`` and policy prices, and in between a
stage's backward grows by ``r`` and its saved activations fall by ``a⁰ − a^ρ`` per recomputed
layer, the per-layer numbers of :func:`~fxplan.cost_model.step.layer_costs.segment_cost`
(:mod:`fxplan.cost_model.step.stage_costs`, "Recompute per layer")."""

from __future__ import annotations

import pytest

from fxplan.api import capture
from fxplan.cluster_specs import Cluster
from fxplan.core.config import ParallelConfig
from fxplan.core.config_error import CostModelError
from fxplan.cost_model import estimate
from fxplan.cost_model.step.layer_costs import graph_segments, segment_cost

LAYERS = 4
CLUSTER = "dgx-a100-80g:nodes=1"


@pytest.fixture(scope="module")
def tiny():  # type: ignore[no-untyped-def]
    """A 4-layer GPT of hidden 256 at sequence 128 on one DGX A100 (8 GPUs)."""
    return (capture(f"gpt:layers={LAYERS},hidden=256,heads=4,vocab=1024,seq=128", batch=1),
            Cluster.load(CLUSTER))


def _price(graph, cluster, policy: str, counts: tuple[int, ...] | None,  # type: ignore[no-untyped-def]
           stages: tuple[int, ...] = (LAYERS,), dp: int = 8):
    config = ParallelConfig(dp=dp, pp=len(stages), microbatch_size=2, num_microbatches=4,
                            recompute=policy, stage_layers=stages, recompute_layers=counts)
    return estimate(graph, cluster, config, batch=dp * 8)


def _layer(graph, cluster, policy: str):  # type: ignore[no-untyped-def]
    """One layer's price under ``policy`` (all layers are one repeated block)."""
    key = graph_segments(graph).layers[0][0]
    return segment_cost(graph, key, tp=1, sequence_parallel=False, recompute=policy,
                        microbatch=2, device=cluster.device(0))


@pytest.mark.parametrize("policy", ["selective", "full"])
def test_the_ends_are_the_whole_plan_prices(tiny, policy: str) -> None:  # type: ignore[no-untyped-def]
    graph, cluster = tiny
    none, whole = _price(graph, cluster, "none", None), _price(graph, cluster, policy, None)
    assert _price(graph, cluster, policy, (LAYERS,)).step_time_s == whole.step_time_s
    one = _price(graph, cluster, policy, (1,))
    assert none.step_time_s < one.step_time_s < whole.step_time_s
    assert _price(graph, cluster, policy, (LAYERS,)).memory[0].total == whole.memory[0].total
    assert none.memory[0].activations > one.memory[0].activations > whole.memory[0].activations
    # the working set of a re-run layer comes with the first recomputed layer
    assert none.memory[0].recompute_working == 0
    assert one.memory[0].recompute_working == whole.memory[0].recompute_working > 0


@pytest.mark.parametrize("policy", ["selective", "full"])
def test_time_and_memory_are_linear_in_the_recomputed_layers(tiny, policy: str) -> None:  # type: ignore[no-untyped-def]
    """B(k) = B(0) + k·r and A(k) = A(0) − k·(a⁰ − a^ρ), with ``r``, ``a⁰``, ``a^ρ`` one
    layer's own numbers; the working set is the policy's from the first recomputed layer."""
    graph, cluster = tiny
    plain, recomputed = _layer(graph, cluster, "none"), _layer(graph, cluster, policy)
    r = recomputed.recompute_s
    saved = plain.activations.saved - recomputed.activations.saved
    assert r > 0 and saved > 0
    base = _price(graph, cluster, "none", None)
    b0 = base.stage_plan.costs.backward[0, 0, 0]
    a0 = base.memory[0].activations
    for k in range(1, LAYERS + 1):
        est = _price(graph, cluster, policy, (k,))
        assert est.stage_plan.costs.backward[0, 0, 0] == pytest.approx(b0 + k * r, rel=1e-12)
        assert est.stage_plan.costs.forward[0, 0, 0] == base.stage_plan.costs.forward[0, 0, 0]
        # one microbatch in flight at pp = 1
        assert est.memory[0].activations == pytest.approx(a0 - k * saved, rel=1e-12)
        assert est.memory[0].recompute_working == pytest.approx(
            recomputed.activations.working, rel=1e-12)
    assert base.memory[0].recompute_working == 0


def test_each_stage_is_priced_with_its_own_layers_policy(tiny) -> None:  # type: ignore[no-untyped-def]
    """pp = 2 with every layer of stage 0 recomputed and none of stage 1: stage 0 is the
    full plan's, stage 1 the plan's without recompute, time rows and memory alike."""
    graph, cluster = tiny
    stages = (2, 2)
    mixed = _price(graph, cluster, "full", (2, 0), stages, dp=4)
    full = _price(graph, cluster, "full", None, stages, dp=4)
    none = _price(graph, cluster, "none", None, stages, dp=4)
    for s, like in ((0, full), (1, none)):
        for row in ("forward", "backward"):
            assert getattr(mixed.stage_plan.costs, row)[:, s] == pytest.approx(
                getattr(like.stage_plan.costs, row)[:, s], rel=1e-12)
        assert mixed.memory[s].activations == pytest.approx(like.memory[s].activations,
                                                            rel=1e-12)
        assert mixed.memory[s].recompute_working == like.memory[s].recompute_working
    # the recomputed forward FLOPs count only stage 0's layers (Megatron's convention)
    assert none.hardware_flops < mixed.hardware_flops < full.hardware_flops


def test_recompute_layers_text_round_trips_and_refuses_what_it_cannot_mean() -> None:
    c = ParallelConfig.parse("dp=2,pp=2,recompute=full,stages=3/3,recompute_layers=2/0")
    assert c.layer_recompute(6) == ("full", "full", "none", "none", "none", "none")
    assert ParallelConfig.parse(c.to_string()) == c
    assert "recompute=full:2/0" in c.summary()
    every = c.replace(recompute_layers=(3, 3))
    assert every.recompute_layers is None and every.layer_recompute(6) == ("full",) * 6
    for text, words in (("recompute=none,stages=3/3,recompute_layers=1/0", "needs recompute="),
                        ("recompute=full,recompute_layers=1/0", "give stages"),
                        ("recompute=full,stages=3/3,recompute_layers=0/0", "recompute=none"),
                        ("recompute=full,stages=3/3,recompute_layers=4/0", "from 0 to"),
                        ("recompute=full,stages=3/3,recompute_layers=1", "1 counts for 2")):
        with pytest.raises(CostModelError, match=words):
            ParallelConfig.parse(f"dp=2,pp=2,{text}")
