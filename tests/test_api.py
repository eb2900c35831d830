"""``fxplan.plan``: plan-and-report without torch.distributed, apply with it."""

from __future__ import annotations

import logging

from fxplan.core.plan import Plan
from rt_plans import build_model, fixed_batch, make_plan
from torch_versions import needs


def test_without_distributed_returns_the_plan_with_a_message(caplog):
    from fxplan import plan as plan_api
    from fxplan.api import PlanResult

    plan = make_plan(dp=2)
    tokens, _ = fixed_batch(plan)
    with caplog.at_level(logging.INFO, logger="fxplan.api"):
        result = plan_api(build_model(2), "local-cpu:devices=2", inputs=(tokens,),
                          batch=plan.batch, plan=plan)
    assert isinstance(result, PlanResult)
    assert result.plan is plan and result.module is None and result.status == "not-distributed"
    assert not result.applied
    assert "torch.distributed is not initialised" in result.message
    assert result.message in caplog.messages


def test_without_plan_it_searches(capsys):
    from fxplan import plan as plan_api

    tokens = fixed_batch(make_plan(dp=2, microbatch_size=4))[0]
    result = plan_api(build_model(2), "local-cpu:devices=2", inputs=(tokens,), batch=8)
    assert isinstance(result.plan, Plan) and result.plan.world_size <= 2
    assert "reported, not applied" in result.message
    assert capsys.readouterr().err == ""  # the library logs; it does not print


def test_with_distributed_returns_a_sharded_module(rank_pool):
    results = rank_pool.run("rt_cases:api_applies_plan")
    assert results[2] is None and results[3] is None
    assert results[0]["type"] == "ShardedModule" and results[0]["loss"] == results[1]["loss"]


def test_path_picks_how_the_plan_is_applied(rank_pool):
    """``path=`` reaches ``apply_plan``: ``graph`` runs the graph rewrite, ``module`` the
    user's module, with the same loss."""
    graph = rank_pool.run("rt_cases:api_applies_plan", path="graph")[0]
    module = rank_pool.run("rt_cases:api_applies_plan", path="module")[0]
    assert graph["path"] == "graph" and module["path"] == "module"
    assert abs(graph["loss"] - module["loss"]) <= 1e-5 * abs(module["loss"])


def test_unknown_path_is_refused():
    import pytest

    from fxplan import plan as plan_api
    from fxplan.api import ApiArgumentError

    plan = make_plan(dp=2)
    with pytest.raises(ApiArgumentError, match="path='modules'"):
        plan_api(build_model(2), "local-cpu:devices=2", inputs=(fixed_batch(plan)[0],),
                 batch=plan.batch, plan=plan, path="modules")


@needs("dtensor_view_sharding")
def test_tp_passes_alone(rank_pool):
    report = rank_pool.run("rt_cases:tp_passes_alone")[0]
    assert report["error"] <= 1e-5 and report["plain_output"] and report["qkv_sharded"], report
    assert report["reshards"] > 0, report


@needs("dtensor_view_sharding")
def test_a_planned_node_missing_from_the_program_is_a_reported_fallback(rank_pool):
    results = rank_pool.run("rt_cases:unknown_node_is_a_fallback")
    report = results[0]
    lines = [f for f in report["fallbacks"] if "no_such_node" in f]
    assert len(lines) == 1 and lines[0].startswith("[insert-reshards] 1 planned node"), report
    assert any("no_such_node" in m for m in report["logged"]), report
    assert report["printed"].count("fallback: [insert-reshards]") == 1, report["printed"]
    assert all(r["printed"] == "" for r in results[1:]), results


def _gpt_plan_for_this_module(**changes):
    import dataclasses

    from fxplan.cluster_specs import Cluster
    from fxplan.api import _capture

    model = build_model(2)
    plan = make_plan(dp=2)
    tokens, _ = fixed_batch(plan)
    graph = _capture(model, Cluster.load("local-cpu:devices=2"), (tokens,))
    fields = dict(model=type(model).__name__, graph_fingerprint=graph.fingerprint())
    return model, dataclasses.replace(plan, **{**fields, **changes}), tokens


def test_a_given_plan_for_another_graph_is_refused():
    import pytest

    from fxplan import plan as plan_api
    from fxplan.core.plan import PlanError

    model, plan, tokens = _gpt_plan_for_this_module()
    assert plan_api(model, "local-cpu:devices=2", inputs=(tokens,), batch=plan.batch,
                    plan=plan).plan is plan
    model, plan, tokens = _gpt_plan_for_this_module(graph_fingerprint="0" * 64)
    with pytest.raises(PlanError, match=r"compared with the GPT module.*made for model 'GPT'"):
        plan_api(model, "local-cpu:devices=2", inputs=(tokens,), batch=plan.batch, plan=plan)


def test_search_captures_in_the_training_dtype(monkeypatch):
    import fxplan.inter_op
    from fxplan.cluster_specs import Cluster
    from fxplan import plan as plan_api

    seen = {}

    def fake_search(graph, cluster, **kwargs):
        seen["dtype"] = graph.dtype
        raise RuntimeError("stop")

    monkeypatch.setattr(fxplan.inter_op, "search", fake_search)
    tokens = fixed_batch(make_plan(dp=2, microbatch_size=4))[0]
    cluster = "dgx-a100-80g"
    try:
        plan_api(build_model(2), cluster, inputs=(tokens,), batch=8)
    except RuntimeError:
        pass
    expected = fxplan.cluster_specs.training_dtype(Cluster.load(cluster))
    assert str(seen["dtype"]) == f"torch.{expected}" == "torch.bfloat16"


def test_schedule_is_built_once_per_equal_loss_function(monkeypatch):
    import fxplan.runtime.apply.sharded_module as sm

    built = []
    monkeypatch.setattr(sm, "build_schedule", lambda *args: built.append(args[-1]) or object())

    class Mesh:
        def __getitem__(self, axis):
            return type("Group", (), {"get_group": lambda self: None})()

    class Losses:
        def loss(self, output, target):
            return output

    sharded = sm.ShardedModule.__new__(sm.ShardedModule)
    sharded.plan, sharded.mesh, sharded.stages, sharded.stage_io = None, Mesh(), [], []
    sharded.device, sharded._schedule_for = None, None
    losses = Losses()
    first = sharded._schedule(losses.loss)
    assert sharded._schedule(losses.loss) is first  # a new bound method each time, equal
    assert len(built) == 1
    sharded._schedule(lambda output, target: output)
    assert len(built) == 2
