"""The search offers the zero-bubble schedules where torch's split backward runs them:
every recompute policy (full: whole blocks, their recompute kept for the weight pass;
selective: the attention core, recomputed once in the input-gradient pass), and beside
data parallelism only at the ZeRO stages whose gradients the runtime
all-reduces after the step (``core.zero_bubble_dp``,
``runtime.train.pipeline.zero_bubble_refusal``)."""

from __future__ import annotations

import json

from fxplan.cli.main import main
from fxplan.inter_op.constraints import validate_constraints
from fxplan.inter_op.space import Family, options

SPLIT = {"zb", "zb:2", "zbv", "dualpipev"}


def _schedules(family: Family) -> set[tuple[str, str]]:
    return {(str(c.schedule), c.recompute)
            for c in options(family, batch=8, layers=8, seq=64)}


def test_zero_bubble_offered_without_data_parallelism() -> None:
    offered = _schedules(Family(tp=1, pp=4, dp=1))
    split = {s for s in offered if s[0] in SPLIT}
    assert {s for s, _ in split} == SPLIT
    assert {r for _, r in split} == {"none", "selective", "full"}


def test_zero_bubble_offered_beside_data_parallelism() -> None:
    offered = _schedules(Family(tp=1, pp=2, dp=2))
    assert {s for s, _ in offered} & SPLIT == SPLIT
    assert {r for s, r in offered if s in SPLIT} == {"none", "selective", "full"}


def test_search_keeps_zero_bubble_beside_dp_at_the_zero_stages_that_run() -> None:
    """Held to zb on pp=2 × dp=2, the search answers at ZeRO-0 or ZeRO-1 and never at a
    stage FSDP2 would run; held to ZeRO-2/3 as well, nothing is left to offer."""
    import pytest

    import fxplan
    from fxplan.inter_op.constraints import ConstraintError

    search = lambda **c: fxplan.search(  # noqa: E731
        "llama-tiny:layers=4", "local-cpu:devices=4", batch=8, seq=8, progress=False,
        constraints={"pp": 2, "dp": 2, "schedule": "zb", **c})
    plan = search(zero_stage=[1, 2, 3])
    assert str(plan.schedule) == "zb" and plan.zero_stage == 1, plan.summary
    with pytest.raises(ConstraintError):
        search(zero_stage=[2, 3])


def test_dualpipev_offered_from_two_microbatches_per_stage() -> None:
    """torch's ScheduleDualPipeV runs m ≥ 2·pp: batch 8 on pp=4 offers it at mb=1 (m = 8),
    not at mb=2 (m = 4), where zbv is still offered."""
    by_mb = {(c.microbatch_size, str(c.schedule))
             for c in options(Family(tp=1, pp=4, dp=1), batch=8, layers=8, seq=64)}
    assert (1, "dualpipev") in by_mb and (2, "dualpipev") not in by_mb
    assert (2, "zbv") in by_mb


def test_constraints_name_them() -> None:
    from fxplan.core.schedule import Schedule

    got = validate_constraints({"schedule": ["zb", "zbv", "zb:2", "dualpipev"]}, 8)["schedule"]
    assert got == (Schedule("zb", 1), Schedule("zbv", 2), Schedule("zb", 2),
                   Schedule("dualpipev", 2))


def test_plan_constrained_to_dualpipev(capsys) -> None:  # type: ignore[no-untyped-def]
    """``fxplan plan … --constrain schedule=dualpipev`` returns a dualpipev plan for the untied
    Llama on two ranks, with the fewest microbatches it runs (2·pp) or more — or, on a torch
    without the pipelining it needs (2.11: no ``_StageMeta``), refuses in one paragraph that
    says so."""
    from fxplan.core.torch_support import torch_has

    code = main(["plan", "llama-tiny:layers=4", "--cluster", "local-cpu:devices=2",
                 "--batch", "8", "--seq", "8", "--constrain", "pp=2,schedule=dualpipev",
                 "--json"])
    if not (torch_has("pipelining_zbv") and torch_has("pipelining_dualpipev")):
        assert code == 2
        assert "schedule dualpipev needs torch.distributed.pipelining" in capsys.readouterr().err
        return
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert "dualpipev" in data["summary"], data["summary"]
    assert data["degrees"]["pp"] == 2


def test_v_shaped_schedules_are_not_offered_when_the_ends_share_a_weight() -> None:
    """zbv and dualpipev run the first and the last stage on rank 0, where the runtime cannot
    keep a tied embedding and head equal (``runtime.apply.tied.same_rank_refusal``): a model
    whose ends share a weight is offered the other schedules only, and its search never prices
    a plan the runtime would refuse for it."""
    import torch

    from fxplan.api import capture
    from fxplan.cluster_specs import Cluster
    from fxplan.inter_op.profile import ModelProfile

    family = Family(tp=1, pp=2, dp=2)
    plain = {str(c.schedule) for c in options(family, batch=8, layers=8, seq=64)}
    tied = {str(c.schedule) for c in options(family, batch=8, layers=8, seq=64, tied_ends=True)}
    assert plain - tied == {"zbv", "dualpipev"} and {"zb", "zb:2"} <= tied
    cluster = Cluster.load("dgx-a100-80g:nodes=1")
    gpt = capture("gpt:layers=4,hidden=128,heads=4,vocab=512,seq=64", batch=1,
                  dtype=torch.bfloat16)          # the zoo's GPT ties wte and the head
    llama = capture("llama:layers=4,hidden=128,heads=4,vocab=512,seq=64", batch=1,
                    dtype=torch.bfloat16)        # Llama's head is its own weight
    assert ModelProfile(gpt, cluster).tied_ends and not ModelProfile(llama, cluster).tied_ends
