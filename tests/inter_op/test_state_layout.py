"""The layout of the model states a search prices (``state_layout``): the runtime's by default
(fp32 parameters as masters, 4 + 4 + 8 B, fp32 reductions), Megatron-LM's on request
(2 + 2 + 12 B); the plan records it and its re-pricing reads it back."""

from __future__ import annotations

import pytest

from fxplan.cluster_specs import Cluster, training_dtype
from fxplan.core.errors import UserError

MODEL, CLUSTER, BATCH = "gpt:layers=4,hidden=512,heads=8,vocab=4096,seq=512", "dgx-a100-80g", 32
#: a configuration whose model states differ between the layouts (ZeRO-1 at tp = 1)
HELD = {"dp": 8, "tp": 1, "pp": 1, "zero_stage": 1}


@pytest.fixture(scope="module")
def plans():  # type: ignore[no-untyped-def]
    from fxplan.api import capture_for_search
    from fxplan.inter_op import search

    cluster = Cluster.load(CLUSTER)
    graph = capture_for_search(MODEL, dtype=training_dtype(cluster))
    return graph, cluster, {layout: search(graph, cluster, batch=BATCH, progress=False,
                                           constraints=HELD, **({} if layout == "runtime" else
                                                                {"state_layout": layout}))
                            for layout in ("runtime", "megatron")}


def test_the_plan_records_its_layout_and_prices_its_bytes(plans) -> None:  # type: ignore[no-untyped-def]
    from fxplan.cost_model import estimate
    from fxplan.inter_op.pricing import priced_config

    graph, cluster, by_layout = plans
    for layout, plan in by_layout.items():
        assert plan.estimate["state_layout"] == layout
        names = {"runtime": "adam-amp", "megatron": "adam-mixed"}
        assert plan.estimate["optimizer"] == names[layout]
        again = estimate(graph, cluster, priced_config(plan), batch=BATCH, state_layout=layout)
        assert again.step_time_s == pytest.approx(plan.estimate["step_time_s"], rel=1e-12)
    runtime, megatron = (by_layout[k].estimate["memory_breakdown_gib"][0]
                         for k in ("runtime", "megatron"))
    # ZeRO-1, dp = 8: 8 + 8/8 B per parameter against 4 + 12/8
    states = [m["params"] + m["grads"] + m["optimizer"] for m in (runtime, megatron)]
    assert states[0] / states[1] == pytest.approx((8 + 8 / 8) / (4 + 12 / 8), rel=1e-9)


def test_a_plan_is_repriced_in_its_layout(plans) -> None:  # type: ignore[no-untyped-def]
    from fxplan.plan_context import simulate_plan

    graph, cluster, by_layout = plans
    plan = by_layout["megatron"]
    assert simulate_plan(plan, graph, cluster).step_time_s == pytest.approx(
        plan.estimate["step_time_s"], rel=1e-12)


def test_a_plan_file_without_a_layout_is_repriced_in_megatrons(plans) -> None:  # type: ignore[no-untyped-def]
    """A plan file whose estimate names no layout was written when every estimate took
    Megatron-LM's: re-priced in it, it gives back the step time and memory it carries."""
    import json

    from fxplan.core.plan import Plan
    from fxplan.plan_context import simulate_plan

    graph, cluster, by_layout = plans
    data = json.loads(by_layout["megatron"].to_json())
    for key in ("state_layout", "optimizer"):
        del data["estimate"][key]
    old = Plan.from_json(json.dumps(data))
    assert old.state_layout == "megatron"
    again = simulate_plan(old, graph, cluster)
    assert again.step_time_s == pytest.approx(old.estimate["step_time_s"], rel=1e-12)
    assert again.peak_memory_gib == pytest.approx(old.estimate["peak_memory_gib"], rel=1e-12)


def test_an_unknown_layout_is_refused_in_one_sentence(plans) -> None:  # type: ignore[no-untyped-def]
    from fxplan.inter_op import search

    graph, cluster, _ = plans
    with pytest.raises(UserError, match="state_layout='deepspeed': expected one of runtime, "
                                        "megatron"):
        search(graph, cluster, batch=BATCH, progress=False, state_layout="deepspeed")
