"""The overlaps a plan was priced with that the runtime does not run are fallback lines
(``ShardedModule.fallbacks``, the launch report), not only a log warning."""

from __future__ import annotations

import dataclasses

from rt_plans import make_plan

from fxplan.runtime.apply.graph import unrun_overlaps


def _with(plan, **config):  # type: ignore[no-untyped-def]
    return dataclasses.replace(plan, config=dataclasses.replace(plan.config, **config))


def test_each_unrun_overlap_is_one_fallback_line() -> None:
    assert unrun_overlaps(make_plan(dp=2, zero=1)) == []
    gather = unrun_overlaps(_with(make_plan(dp=2, zero=1), param_gather_overlap=True))
    assert len(gather) == 1 and gather[0].startswith("[overlap] the plan was priced with pg_overlap=on")
    assert "gathers them after the optimizer step" in gather[0]
    both = unrun_overlaps(_with(make_plan(dp=2, tp=2, zero=1, sp=True), tp_comm_overlap=True,
                                param_gather_overlap=True))
    assert [line.split(" (")[0] for line in both] == [
        "[overlap] the plan was priced with tp_overlap=on",
        "[overlap] the plan was priced with pg_overlap=on"]
