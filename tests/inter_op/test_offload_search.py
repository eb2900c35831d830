"""Offload in the search: offered where nothing fits without it, priced by the search's closed
form, refused by a constraint, never chosen when the model fits without it
(:mod:`fxplan.inter_op.offload`)."""

from __future__ import annotations

import pytest

from fxplan.api import capture_for_search
from fxplan.cluster_specs import Cluster
from fxplan.inter_op import ConstraintError, InfeasibleError, search, search_state
from fxplan.inter_op.offload import memory_rungs
from fxplan.inter_op.progress import Budget, PhaseTimer
from fxplan.inter_op.surrogate import surrogate_step_s

ONE_V100 = "dgx1-v100-16g:v100.devices_per_node=1"


@pytest.fixture(scope="module")
def gpt17():  # type: ignore[no-untyped-def]
    return capture_for_search("gpt-1.7b", dtype="float16")   # V100s have no bf16


def test_rungs_put_offload_after_every_zero_stage() -> None:
    assert memory_rungs(8) == [(0, "none"), (1, "none"), (2, "none"), (3, "none"),
                               (1, "optimizer"), (2, "optimizer"), (3, "optimizer"),
                               (3, "optimizer+params")]
    assert memory_rungs(1) == [(0, "none"), (0, "optimizer")]
    assert memory_rungs(1, offload_ok=False) == [(0, "none")]
    assert memory_rungs(4, zero_want=3, offload_want=["none", "optimizer+params"]) == [
        (3, "none"), (3, "optimizer+params")]


def test_a_model_too_big_for_one_gpu_plans_with_offload(gpt17) -> None:  # type: ignore[no-untyped-def]
    cluster = Cluster.load(ONE_V100)
    plan = search(gpt17, cluster, batch=8, time_budget_s=60)
    assert plan.offload == "optimizer" and plan.estimate["fits"]
    assert plan.estimate["breakdown"]["offload"] > 0
    with pytest.raises(InfeasibleError):
        search(gpt17, cluster, batch=8, time_budget_s=60, constraints={"offload": "none"})


def test_offload_is_not_chosen_when_the_model_fits(gpt17) -> None:  # type: ignore[no-untyped-def]
    plan = search(gpt17, Cluster.load("dgx-a100-80g"), batch=16, time_budget_s=60)
    assert plan.offload == "none"


def test_offload_constraint_needs_the_host_side(gpt17) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConstraintError, match="does not give host_memory_gib"):
        search(gpt17, Cluster.load("h200-single"), batch=8, constraints={"offload": "optimizer"})


@pytest.fixture(scope="module")
def gpt75():  # type: ignore[no-untyped-def]
    return capture_for_search("gpt-7.5b", dtype="float16")


def test_search_closed_form_prices_the_offload(gpt75) -> None:  # type: ignore[no-untyped-def]
    """``T̂`` of an offload candidate adds the host copies and CPU step: it matches the step
    simulator's price of the same plan (it used to leave them out and rank offload layouts
    seconds too fast)."""
    cluster = Cluster.load("dgx1-v100-16g")
    plan = search(gpt75, cluster, batch=64, time_budget_s=60,
                  constraints={"offload": "optimizer"})
    state = search_state._Search(gpt75, cluster, 64, {}, 8, PhaseTimer(), Budget(None), False)
    c = plan.config
    priced = surrogate_step_s(c, state.profile.of(c), cluster)
    without = surrogate_step_s(c.replace(offload="none"), state.profile.of(c), cluster)
    assert priced == pytest.approx(plan.estimate["step_time_s"], rel=0.05)
    assert priced - without > 0.1 * priced
