"""Search constraints (``inter_op.constraints``): invalid values are user errors that name the
allowed ones; constraints that exclude everything, or leave nothing that fits, say so."""

from __future__ import annotations

import pytest

from fxplan import search
from fxplan.core.errors import UserError
from fxplan.inter_op import ConstraintError, InfeasibleError


@pytest.mark.parametrize("constraints, match", [
    ({"tp": 3}, r"tp=3 is not allowed; tp takes 1, 2, 4, 8"),
    ({"zero_stage": 5}, r"zero_stage=5 is not allowed; zero_stage takes 0, 1, 2, 3"),
    ({"zero_stage": (1, 5)}, r"zero_stage=5 is not allowed"),
    ({"schedule": "interleaved:3"}, r"schedule takes 1f1b, gpipe, interleaved:2"),
    ({"recompute": "some"}, r"recompute takes none, selective, full"),
    ({"sequence_parallel": 1}, r"sequence_parallel takes True, False"),
    ({"microbatch_size": 0}, r"microbatch_size takes positive integers"),
    ({"tensor": 2}, r"unknown constraints \['tensor'\]; allowed keys: tp, pp, dp"),
])
def test_invalid_constraints_are_user_errors(gpt17, constraints, match) -> None:  # type: ignore[no-untyped-def]
    graph, cluster = gpt17
    with pytest.raises(ConstraintError, match=match) as info:
        search(graph, cluster, batch=512, progress=False, constraints=constraints)
    assert isinstance(info.value, UserError) and "more devices" not in str(info.value)


def test_constraints_that_exclude_every_candidate_say_so(gpt17) -> None:  # type: ignore[no-untyped-def]
    graph, cluster = gpt17
    with pytest.raises(ConstraintError, match="exclude every candidate"):
        search(graph, cluster, batch=512, progress=False, constraints={"microbatch_size": 32})


def test_infeasible_under_constraints_says_relax_them(gpt17) -> None:  # type: ignore[no-untyped-def]
    graph, _ = gpt17
    with pytest.raises(InfeasibleError) as info:
        search(graph, "dgx-a100-80g", batch=128, progress=False,
               constraints={"zero_stage": 0, "pp": 1, "tp": 1, "recompute": "none",
                            "microbatch_size": 16})
    text = str(info.value)
    assert "allowed by the constraints" in text and "Relax the constraints" in text
    assert "zero=0" in text and "more devices: about" not in text
