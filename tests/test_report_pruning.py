"""``fxplan.report.pruning.group_pruned``: reasons grouped by kind, near-misses first, each
group ordered by how close its candidate came; plans without ``pruned_detail`` read from their
wording."""

from __future__ import annotations

import io

from rich.console import Console

from fxplan.core.config import ParallelConfig
from fxplan.core.plan import Plan
from fxplan.inter_op.reasons import DIVIDE, MEMORY, STAGES, TIME_BOUND
from fxplan.report.terminal import render_pruned
from fxplan.report.pruning import OTHER, group_pruned

REASONS = [
    ("tp=16: does not divide heads=24 (24 mod 16 = 8)", {"kind": DIVIDE}),
    ("tp=1, pp=32: more stages than layers (32 > 24)", {"kind": STAGES}),
    ("needs ≥ 102.4 GiB > 40 GiB at zero=0, tp=1, pp=1, dp=8 (…)",
     {"kind": MEMORY, "needed_gib": 102.4, "capacity_gib": 40.0}),
    ("12 candidates: compute lower bound m·W/pp ≥ 9.253 s ≥ the 8-th best estimate 9.238 s",
     {"kind": TIME_BOUND}),
    ("tp=2, pp=1, dp=4: 15 … variants did not fit …; the lightest of them (…) needs 40.5 GiB > "
     "40 GiB", {"kind": MEMORY, "needed_gib": 40.5, "capacity_gib": 40.0}),
    ("pp=2 dp=4 tp=1 | …: simulated peak 43.0 GiB > 40 GiB",
     {"kind": MEMORY, "needed_gib": 43.0, "capacity_gib": 40.0}),
]


def _plan(with_detail: bool, reasons=REASONS) -> Plan:  # type: ignore[no-untyped-def]
    config = ParallelConfig.parse("dp=4,tp=2,pp=1,mb=1,schedule=1f1b").resolve(16)
    return Plan(model="m", cluster="c", graph_fingerprint="g", cluster_fingerprint="f",
                batch=16, seq=None, config=config, pruned=tuple(t for t, _ in reasons),
                pruned_detail=tuple(d for _, d in reasons) if with_detail else ())


def test_groups_put_memory_near_misses_first_and_trivial_kinds_last() -> None:
    groups = group_pruned(_plan(with_detail=True))
    assert [g.kind for g in groups] == [MEMORY, TIME_BOUND, DIVIDE, STAGES]
    memory = groups[0].reasons
    # 40.5/40 before 43/40 before 102.4/40: the closest candidate first
    assert memory == (REASONS[4][0], REASONS[5][0], REASONS[2][0])
    assert sum(len(g.reasons) for g in groups) == len(REASONS)


def test_plans_without_detail_are_grouped_by_their_wording() -> None:
    with_detail = group_pruned(_plan(with_detail=True))
    from_text = group_pruned(_plan(with_detail=False))
    assert from_text == with_detail


def test_unknown_wording_is_kept_last_as_other() -> None:
    reasons = [("something a future version says", {}), REASONS[0]]
    groups = group_pruned(_plan(with_detail=False, reasons=reasons))
    assert [g.kind for g in groups] == [DIVIDE, OTHER]


def test_report_prints_every_kind_with_the_closest_first() -> None:
    out = io.StringIO()
    render_pruned(_plan(with_detail=True), Console(file=out, width=300))
    text = out.getvalue()
    assert text.index(MEMORY) < text.index(TIME_BOUND) < text.index(DIVIDE) < text.index(STAGES)
    assert text.index("40.5 GiB") < text.index("43.0 GiB") < text.index("102.4 GiB")


def test_a_plan_file_without_pruned_detail_still_loads_and_groups() -> None:
    plan = _plan(with_detail=True)
    data = plan.to_dict()
    del data["pruned_detail"]
    old = Plan.from_dict(data)
    assert old.pruned_detail == () and group_pruned(old) == group_pruned(plan)
