"""An offload per pipeline rank (``offload_stages``): parsing, validation, the rank view, the
text forms and a plan's JSON (as ``zero_stages`` for the ZeRO stage)."""

from __future__ import annotations

import pytest

from fxplan.core.config import ParallelConfig
from fxplan.core.config_error import CostModelError
from fxplan.core.plan import Plan, StageAssignment


def test_offload_stages_round_trip_and_rank_view():
    c = ParallelConfig.parse("dp=2,pp=4,zero=3,offload_stages=optimizer+params/optimizer/none/none")
    assert c.offload_stages == ("optimizer+params", "optimizer", "none", "none")
    assert c.offload == "optimizer+params"   # offload: the highest entry
    assert [c.offload_of(r) for r in range(4)] == list(c.offload_stages)
    assert c.rank_offloads == c.offload_stages and c.per_rank
    assert ParallelConfig.parse(c.to_string()) == c
    assert "offload_stages=optimizer+params/optimizer/none/none" in c.to_string()
    assert "| offload=optimizer+params/optimizer/none/none" in c.summary()
    view = c.at_pipeline_rank(1)
    assert view.offload == "optimizer" and view.offload_stages is None and view.zero_stage == 3
    assert view == c.uniform(3, "optimizer")
    assert c.at_pipeline_rank(3).offload == "none"
    plain = ParallelConfig.parse("dp=2,pp=4,zero=3,offload=optimizer")
    assert plain.at_pipeline_rank(1) is plain and not plain.per_rank
    assert plain.offload_text == "optimizer" and plain.rank_offloads == ("optimizer",) * 4


def test_with_zero_stages_each_rank_takes_both():
    c = ParallelConfig.parse("dp=2,pp=2,zero_stages=3/1,offload_stages=optimizer+params/none")
    assert (c.zero_stage, c.offload) == (3, "optimizer+params")
    assert c.at_pipeline_rank(1) == c.uniform(1, "none")
    assert ParallelConfig.parse(c.to_string()) == c


def test_equal_entries_collapse_to_the_plain_form():
    c = ParallelConfig.parse("dp=2,pp=2,zero=2,offload_stages=optimizer/optimizer")
    assert c.offload_stages is None and c.offload == "optimizer"
    assert c == ParallelConfig.parse("dp=2,pp=2,zero=2,offload=optimizer")
    assert ParallelConfig.parse("dp=2,pp=2,zero=2,offload_stages=none/none").offload == "none"
    # offload given as the highest entry is accepted
    assert ParallelConfig.parse("dp=2,pp=2,zero=2,offload=optimizer,"
                                "offload_stages=optimizer/none").offload_stages == ("optimizer",
                                                                                    "none")


@pytest.mark.parametrize("text, match", [
    ("dp=2,pp=2,zero=2,offload_stages=optimizer", r"lists 1 offload policies for pp=2"),
    ("dp=2,pp=2,zero=2,offload_stages=optimizer/disk",
     r"expected one offload policy \(none, optimizer, optimizer\+params\) per pipeline rank"),
    ("dp=2,pp=2,zero=3,offload=optimizer,offload_stages=optimizer+params/none",
     r"offload=optimizer disagrees with offload_stages=optimizer\+params/none.*"
     r"optimizer\+params\); leave offload out"),
    ("dp=2,pp=2,zero_stages=3/1,offload_stages=none/optimizer+params",
     r"zero_stages=3/1, offload_stages=none/optimizer\+params: pipeline rank 1's zero=1 with "
     r"offload=optimizer\+params is not allowed here: offload=optimizer\+params needs zero=3"),
    ("dp=2,pp=2,zero=2,offload_stages=optimizer+params/none",
     r"offload=optimizer\+params needs zero=3"),
])
def test_offload_stages_refusals_say_what_was_wrong(text, match):
    with pytest.raises(CostModelError, match=match):
        ParallelConfig.parse(text)


def test_rank_out_of_range_is_refused():
    c = ParallelConfig.parse("dp=2,pp=2,zero=3,offload_stages=optimizer/none")
    with pytest.raises(CostModelError, match="pipeline rank 2 is not one of the pp=2 ranks"):
        c.offload_of(2)


def test_plan_carries_offload_stages_through_json_and_gives_each_rank_its_view():
    config = ParallelConfig(pp=2, dp=2, microbatch_size=2, num_microbatches=4, zero_stage=3,
                            offload_stages=("optimizer+params", "none"))
    plan = Plan(model="gpt-tiny", cluster="local-cpu:devices=4", graph_fingerprint="a" * 64,
                cluster_fingerprint="b" * 64, batch=16, seq=64, config=config,
                stages=(StageAssignment(0, (0, 2), has_embedding=True),
                        StageAssignment(1, (2, 4), has_head=True)))
    assert Plan.from_json(plan.to_json()) == plan
    assert "offload=optimizer+params/none" in plan.summary and plan.offload == "optimizer+params"
    assert plan.at_pipeline_rank(1).offload == "none"
    assert plan.at_pipeline_rank(0).config.offload_stages is None
