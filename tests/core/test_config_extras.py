"""``cp``, ``ep``, ``offload`` and ``fp8`` in ``ParallelConfig``, the plan JSON and the
constraints: defaults, text forms, old plans, and the refusals of values that do not divide."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fxplan.cli.constraint_text import parse_constraints
from fxplan.core.config import ParallelConfig
from fxplan.core.config_error import CostModelError
from fxplan.core.plan import Plan
from fxplan.inter_op.constraints import ConstraintError, validate_constraints
from tests.core.test_plan import make_plan


def test_defaults_keep_the_old_text_and_new_fields_round_trip() -> None:
    c = ParallelConfig(dp=2, tp=4)
    assert (c.cp, c.ep, c.offload, c.fp8) == (1, 1, "none", False)
    assert "offload" not in c.to_string() and "fp8" not in c.summary()
    d = ParallelConfig.parse("dp=2,tp=4,zero=3,offload=optimizer+params,fp8=on")
    assert d.offload == "optimizer+params" and d.fp8
    assert ParallelConfig.parse(d.to_string()) == d
    assert d.summary().endswith("| offload=optimizer+params | fp8=on")


@pytest.mark.parametrize("text, message", [
    ("dp=2,cp=4", r"cp=4 does not divide dp=2"),
    ("dp=2,ep=4", r"ep=4 does not divide dp=2"),
    ("dp=2,offload=disk", r"offload='disk': expected one of none, optimizer"),
    ("dp=2,zero=1,offload=optimizer+params", r"offload=optimizer\+params needs zero=3"),
])
def test_bad_values_are_refused(text: str, message: str) -> None:
    with pytest.raises(CostModelError, match=message):
        ParallelConfig.parse(text)


def test_cp_splits_sequences_not_samples() -> None:
    """``batch = (dp/cp)·mb·m``: the cp ranks of a group share their samples; the sequence is
    cut into 2·cp chunks (load-balanced causal split), so 2·cp must divide it."""
    c = ParallelConfig.parse("dp=8,cp=4,mb=1")
    assert c.replicas == 2 and c.resolve(6).num_microbatches == 3
    assert ParallelConfig.parse(c.resolve(6).to_string()) == c.resolve(6)
    assert c.summary().endswith("| cp=4")
    with pytest.raises(CostModelError, match=r"\(dp/cp\)·mb = \(8/4\)·1 = 2 \(5 mod 2 = 1\)"):
        c.resolve(5)
    c.check(world_size=8, layers=2, seq=16)
    with pytest.raises(CostModelError, match="2·cp = 8 chunks.*12 mod 8 = 4"):
        c.check(world_size=8, layers=2, seq=12)


def test_plan_json_carries_cp_ep_offload_and_old_plans_load() -> None:
    plan = make_plan()
    data = json.loads(plan.to_json())
    assert data["degrees"]["cp"] == 1 and data["degrees"]["ep"] == 1
    assert data["offload"] == "none"
    old = dict(data)
    old["degrees"] = {k: v for k, v in data["degrees"].items() if k not in ("cp", "ep")}
    del old["offload"]
    assert Plan.from_dict(old) == plan
    data["offload"] = "optimizer"
    with pytest.raises(Exception, match="offload 'optimizer' disagrees"):
        Plan.from_dict(data)


def test_constraints_accept_the_new_keys() -> None:
    assert parse_constraints("cp=1,ep=1,offload=optimizer|none,fp8=true") == {
        "cp": 1, "ep": 1, "offload": ["optimizer", "none"], "fp8": True}
    assert validate_constraints({"offload": "optimizer", "fp8": False, "cp": 1}, 8)
    assert validate_constraints(parse_constraints("cp=2|4"), 8) == {"cp": [2, 4]}
    with pytest.raises(ConstraintError, match="cp=3 is not allowed.*context parallelism"):
        validate_constraints({"cp": 3}, 8)
    assert validate_constraints({"ep": 8}, 8) == {"ep": 8}     # searched (expert_parallel.py)
    with pytest.raises(ConstraintError, match="ep=3 is not allowed"):
        validate_constraints({"ep": 3}, 8)
    with pytest.raises(ConstraintError, match="offload='nvme' is not allowed"):
        validate_constraints({"offload": "nvme"}, 8)


def test_explain_alternatives_change_offload_and_fp8() -> None:
    from fxplan.report.explain import ExplainError, alternative_config

    plan = make_plan()   # pp=2 dp=2 tp=1, zero=1
    config, _ = alternative_config(plan, {"offload": "optimizer", "fp8": True})
    assert config.offload == "optimizer" and config.fp8 and config.zero_stage == 1
    with pytest.raises(ExplainError, match="optimizer\\+params needs zero=3"):
        alternative_config(plan, {"offload": "optimizer+params"})
    config, _ = alternative_config(plan, {"offload": "optimizer+params", "zero_stage": 3})
    assert config.offload == "optimizer+params"


def test_a_cp_plan_names_its_attention_exchange_and_round_trips() -> None:
    base = make_plan()
    plan = dataclasses.replace(base, config=base.config.replace(cp=2, num_microbatches=8))
    data = json.loads(plan.to_json())
    assert data["degrees"]["cp"] == 2 and data["cp_attention"] == "allgather"
    assert Plan.from_dict(data) == plan
    assert "cp_attention" not in json.loads(make_plan().to_json())
    data["cp_attention"] = "ring"
    with pytest.raises(Exception, match="cp_attention 'ring'"):
        Plan.from_dict(data)


def test_explain_keeps_dualpipev_only_with_two_microbatches_per_stage() -> None:
    """An alternative that leaves a dualpipev plan with m < 2·pp microbatches (torch's
    ScheduleDualPipeV refuses it) falls back to 1f1b, and says so."""
    from fxplan.report.explain import alternative_config

    plan = make_plan(dp=1, tp=2, zero_stage=0, schedule="dualpipev", num_microbatches=8,
                     stages=())   # pp=2, batch 16
    kept, _ = alternative_config(plan, {"microbatch_size": 4})      # m = 4 = 2·pp
    assert str(kept.schedule) == "dualpipev" and kept.num_microbatches == 4
    fell, notes = alternative_config(plan, {"microbatch_size": 8})  # m = 2
    assert str(fell.schedule) == "1f1b" and any("schedule follows: 1f1b" in n for n in notes)


def test_explain_keeps_zero_bubble_beside_dp_where_the_runtime_runs_it() -> None:
    """A zb plan asked with dp=2 keeps zb at ZeRO-0/1 (the gradients are reduced after the
    step) and falls back to 1f1b at ZeRO-3, which FSDP2 would run, saying so."""
    from fxplan.report.explain import alternative_config

    plan = make_plan(dp=1, tp=2, zero_stage=0, schedule="zb", num_microbatches=8,
                     stages=())   # pp=2, batch 16
    kept, _ = alternative_config(plan, {"dp": 2, "tp": 1})
    assert str(kept.schedule) == "zb" and kept.dp == 2
    fell, notes = alternative_config(plan, {"dp": 2, "tp": 1, "zero_stage": 3})
    assert str(fell.schedule) == "1f1b" and any("ZeRO-0/1 only" in n for n in notes)
