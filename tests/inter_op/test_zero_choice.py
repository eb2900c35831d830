"""The search keeps the ZeRO stage its own cost model prices cheapest, not the
lowest stage that fits: every allowed stage that fits is priced by ``T̂`` and the cheapest
kept, ties going to the lower stage."""

from __future__ import annotations

import pytest

from fxplan.api import capture_for_search
from fxplan.cluster_specs import Cluster, training_dtype
from fxplan.inter_op import search_state
from fxplan.inter_op.progress import Budget, PhaseTimer
from fxplan.inter_op.space import options
from fxplan.inter_op.surrogate import surrogate_step_s


@pytest.fixture(scope="module")
def state():  # type: ignore[no-untyped-def]
    cluster = Cluster.load("local-cpu:devices=4")
    graph = capture_for_search("gpt-tiny", dtype=training_dtype(cluster))
    return search_state._Search(graph, cluster, 16, {"dp": 4}, 8, PhaseTimer(), Budget(None), False)


def test_score_keeps_the_cheapest_fitting_zero_stage(state) -> None:  # type: ignore[no-untyped-def]
    (family, (zmin, offload)), = state.families().items()
    assert offload == "none"
    prof_ = state.profile
    checked = 0
    for c in options(family, batch=16, layers=prof_.num_layers, seq=prof_.segments.seq):
        scored = state._score(c.replace(zero_stage=zmin))
        prices = {}
        for z in range(zmin, 4):
            placed = state._partition(c.replace(zero_stage=z))
            if placed is not None:   # priced with its own layers' recompute (a placed policy
                # may recompute fewer layers than all, or none)
                prices[z] = surrogate_step_s(placed, prof_.of(placed), state.cluster)
        assert scored is not None and prices
        cheapest = min(prices, key=lambda z: (prices[z], z))
        assert scored.config.zero_stage == cheapest, (c.summary(), prices)
        assert scored.surrogate_s == prices[cheapest]
        checked += 1
    assert checked >= 3


def test_zero_constraint_still_binds(state) -> None:  # type: ignore[no-untyped-def]
    pinned = search_state._Search(state.graph, state.cluster, 16, {"dp": 4, "zero_stage": 1}, 8,
                            PhaseTimer(), Budget(None), False)
    (family, (zmin, _offload)), = pinned.families().items()
    c = next(options(family, batch=16, layers=pinned.profile.num_layers,
                     seq=pinned.profile.segments.seq))
    assert pinned._score(c.replace(zero_stage=zmin)).config.zero_stage == 1


def test_plan_is_the_model_cheapest_zero_stage(state) -> None:  # type: ignore[no-untyped-def]
    """The example (dp=4 on local-cpu:devices=4, gpt-tiny): the plan's step time is at
    most the estimate of the same configuration at any other ZeRO stage."""
    from fxplan import search
    from fxplan.cost_model import estimate
    from fxplan.inter_op.pricing import priced_config

    plan = search(state.graph, state.cluster, batch=16, progress=False, constraints={"dp": 4})
    config = priced_config(plan)
    for z in range(4):
        other = estimate(state.graph, state.cluster, config.replace(zero_stage=z), batch=16)
        assert plan.estimate["step_time_s"] <= other.step_time_s * (1 + 1e-9) or not other.fits
