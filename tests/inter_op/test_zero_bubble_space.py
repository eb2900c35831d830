"""The search offers the zero-bubble schedules where torch's split backward runs them: a
pipeline without data parallelism, recompute none (``runtime.train.pipeline.zero_bubble_refusal``)."""

from __future__ import annotations

from fxplan.inter_op.constraints import validate_constraints
from fxplan.inter_op.space import Family, options


def _schedules(family: Family) -> set[tuple[str, str]]:
    return {(str(c.schedule), c.recompute)
            for c in options(family, batch=8, layers=8, seq=64)}


def test_zero_bubble_offered_without_data_parallelism() -> None:
    offered = _schedules(Family(tp=1, pp=4, dp=1))
    split = {s for s in offered if s[0] in ("zb", "zb:2", "zbv")}
    assert {s for s, _ in split} == {"zb", "zb:2", "zbv"}
    assert {r for _, r in split} == {"none"}


def test_zero_bubble_not_offered_beside_data_parallelism() -> None:
    assert not {s for s, _ in _schedules(Family(tp=1, pp=2, dp=2))} & {"zb", "zb:2", "zbv"}


def test_constraints_name_them() -> None:
    from fxplan.core.config import Schedule

    got = validate_constraints({"schedule": ["zb", "zbv", "zb:2"]}, 8)["schedule"]
    assert got == (Schedule("zb", 1), Schedule("zbv", 2), Schedule("zb", 2))
