"""A ZeRO stage per pipeline rank (``zero_stages``): parsing, validation, the rank view, the
text forms and a plan's JSON."""

from __future__ import annotations

import pytest

from fxplan.core.config import ParallelConfig
from fxplan.core.config_error import CostModelError
from fxplan.core.plan import Plan, StageAssignment


def test_zero_stages_round_trip_and_rank_view():
    c = ParallelConfig.parse("dp=2,pp=4,mb=1,zero_stages=3/3/1/1")
    assert c.zero_stages == (3, 3, 1, 1) and c.zero_stage == 3   # zero: the highest entry
    assert [c.zero_stage_of(r) for r in range(4)] == [3, 3, 1, 1]
    assert c.rank_zero_stages == (3, 3, 1, 1)
    assert ParallelConfig.parse(c.to_string()) == c
    assert "zero_stages=3/3/1/1" in c.to_string()
    assert "| zero=3/3/1/1 |" in c.summary()
    view = c.at_pipeline_rank(2)
    assert view.zero_stage == 1 and view.zero_stages is None
    assert view.replace(zero_stages=None) == c.replace(zero_stage=1, zero_stages=None)
    # the per-microbatch reduction is a rank's rule
    assert c.at_pipeline_rank(0).reduces_every_microbatch
    assert not c.at_pipeline_rank(3).reduces_every_microbatch
    plain = ParallelConfig.parse("dp=2,pp=4,zero=1")
    assert plain.at_pipeline_rank(1) is plain and plain.rank_zero_stages == (1,) * 4
    assert plain.zero_text == "1" and c.zero_text == "3/3/1/1"


def test_equal_entries_collapse_to_the_plain_form():
    c = ParallelConfig.parse("dp=2,pp=2,zero_stages=2/2")
    assert c.zero_stages is None and c.zero_stage == 2
    assert c == ParallelConfig.parse("dp=2,pp=2,zero=2")
    assert ParallelConfig.parse("dp=2,pp=2,zero=3,zero_stages=3/1").zero_stages == (3, 1)


@pytest.mark.parametrize("text, match", [
    ("dp=2,pp=2,zero_stages=3/1/1", r"lists 3 ZeRO stages for pp=2 pipeline ranks"),
    ("dp=1,pp=2,zero_stages=3/1", r"needs dp > 1"),
    ("dp=2,pp=2,zero=1,zero_stages=3/1", r"zero=1 disagrees with zero_stages=3/1.*\(3\)"),
    ("dp=2,pp=2,zero_stages=3/4", r"expected one ZeRO stage 0, 1, 2 or 3 per pipeline rank"),
    ("dp=2,pp=2,zero_stages=3/1,offload=optimizer+params",
     r"pipeline rank 1's zero=1 is not allowed here: offload=optimizer\+params needs zero=3"),
    ("dp=2,pp=2,zero_stages=2/0,pg_overlap=on",
     r"pipeline rank 1's zero=0 is not allowed here: pg_overlap=on needs zero=1 or 2"),
])
def test_zero_stages_refusals_name_the_arithmetic(text, match):
    with pytest.raises(CostModelError, match=match):
        ParallelConfig.parse(text)


def test_rank_out_of_range_is_refused():
    c = ParallelConfig.parse("dp=2,pp=2,zero_stages=3/1")
    with pytest.raises(CostModelError, match="pipeline rank 2 is not one of the pp=2 ranks"):
        c.zero_stage_of(2)


def test_plan_carries_zero_stages_through_json_and_gives_each_rank_its_view():
    config = ParallelConfig(pp=2, dp=2, microbatch_size=2, num_microbatches=4,
                            zero_stages=(3, 1))
    plan = Plan(model="gpt-tiny", cluster="local-cpu:devices=4", graph_fingerprint="a" * 64,
                cluster_fingerprint="b" * 64, batch=16, seq=64, config=config,
                stages=(StageAssignment(0, (0, 2), has_embedding=True),
                        StageAssignment(1, (2, 4), has_head=True)))
    assert Plan.from_json(plan.to_json()) == plan
    assert "zero=3/1" in plan.summary and plan.zero_stage == 3
    assert plan.at_pipeline_rank(1).zero_stage == 1
    assert plan.at_pipeline_rank(1).stages == plan.stages
    assert plan.at_pipeline_rank(0).config.zero_stages is None
