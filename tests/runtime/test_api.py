"""``planner.plan``: plan-and-report without torch.distributed, apply with it."""

from __future__ import annotations

from planner.plan_spec import Plan
from rt_plans import build_model, fixed_batch, make_plan


def test_without_distributed_returns_the_plan_with_a_message(capsys):
    from planner import plan as plan_api

    plan = make_plan(dp=2)
    tokens, _ = fixed_batch(plan)
    result = plan_api(build_model(2), "local-cpu:devices=2", inputs=(tokens,),
                          batch=plan.batch, plan=plan)
    assert result is plan
    assert "torch.distributed is not initialised" in capsys.readouterr().err


def test_without_plan_it_searches(capsys):
    from planner import plan as plan_api

    tokens = fixed_batch(make_plan(dp=2, microbatch_size=4))[0]
    result = plan_api(build_model(2), "local-cpu:devices=2", inputs=(tokens,), batch=8)
    assert isinstance(result, Plan) and result.world_size <= 2
    assert "reported, not applied" in capsys.readouterr().err


def test_with_distributed_returns_a_sharded_module(rank_pool):
    results = rank_pool.run("rt_cases:api_applies_plan")
    assert results[2] is None and results[3] is None
    assert results[0]["type"] == "ShardedModule" and results[0]["loss"] == results[1]["loss"]


def test_tp_passes_alone(rank_pool):
    report = rank_pool.run("rt_cases:tp_passes_alone")[0]
    assert report["error"] <= 1e-5 and report["plain_output"] and report["qkv_sharded"], report
    assert report["reshards"] > 0, report
