"""Zero-bubble schedules on gloo ranks: ``zbv`` (two stages per rank in a V) trains like one
process; what torch's split backward cannot run is refused before launch, with the reason.

(``zb`` and ``zb:2`` on the tiny GPT, alone and beside tensor parallelism, are cases of
``test_numerics.py``.)"""

from __future__ import annotations

import pytest
from rt_plans import make_plan
from rt_zoo_cases import one_process
from torch_versions import needs

from fxplan.runtime.train.pipeline import zero_bubble_refusal
from fxplan.runtime.apply.tied import same_rank_refusal

SPEC = "llama-tiny:layers=4"
BATCH, SEQ = 8, 8
TOL = 1e-5


@needs("pipelining_zbv")
def test_zbv_trains_like_one_process(rank_pool):
    """The search, held to ``zbv`` on two ranks, plans the untied Llama; its losses equal
    one process's (the V puts stages 0 and 3 on rank 0, 1 and 2 on rank 1)."""
    import fxplan

    plan = fxplan.search(SPEC, "local-cpu:devices=2", batch=BATCH, seq=SEQ, progress=False,
                         constraints={"pp": 2, "schedule": "zbv"})
    assert str(plan.schedule) == "zbv" and plan.pp == 2, plan.summary
    result = rank_pool.run("rt_zoo_cases:train", timeout=300, spec=SPEC,
                           plan_json=plan.to_json())[0]
    reference = one_process(SPEC, BATCH, SEQ)
    error = max(abs(a - b) / abs(b) for a, b in zip(result["losses"], reference))
    assert error <= TOL, (plan.summary, result, reference)


@pytest.mark.parametrize("kwargs,why", [
    (dict(pp=2, schedule="zb", recompute="full", num_microbatches=2), "recompute=full"),
    (dict(pp=2, schedule="zb", recompute="selective", num_microbatches=2),
     "recompute=selective"),
    (dict(pp=2, dp=2, schedule="zb", num_microbatches=2), "dp=2"),
    (dict(pp=2, dp=2, zero=3, schedule="zb:2", num_microbatches=2, layers=4), "dp=2"),
])
def test_split_backward_refusals(kwargs, why):
    """Measured on gloo ranks with torch 2.13: the checkpoint's recompute fails in the weight
    pass, DDP's gradients come out wrong, FSDP2 hangs — each refused by name instead."""
    assert why in zero_bubble_refusal(make_plan(**kwargs))
    assert zero_bubble_refusal(make_plan(pp=2, tp=2, schedule="zb", num_microbatches=2)) is None
    assert zero_bubble_refusal(make_plan(pp=2, dp=2, schedule="1f1b", num_microbatches=2)) is None


def test_zbv_needs_the_reworked_stage_set_up(monkeypatch):
    """On a torch without it (2.11) zbv is refused by name; zb still runs."""
    from fxplan.runtime.train import pipeline

    monkeypatch.setattr(pipeline, "torch_has", lambda feature: feature != "pipelining_zbv")
    assert "zbv needs" in pipeline.zero_bubble_refusal(
        make_plan(pp=2, schedule="zbv", num_microbatches=2, layers=4))
    assert pipeline.zero_bubble_refusal(make_plan(pp=2, schedule="zb", num_microbatches=2)) is None


def test_zbv_refuses_a_weight_tied_across_the_v():
    """Under zbv stage 0 (embedding) and the last stage (head) share rank 0, where the
    runtime cannot keep a tied weight's two copies equal; other schedules keep them apart."""
    zbv = make_plan(pp=2, schedule="zbv", num_microbatches=2, layers=4)
    assert "tied" in same_rank_refusal(zbv, {"wte.weight": (0, 3)})
    zb2 = make_plan(pp=2, schedule="zb:2", num_microbatches=2, layers=4)
    assert same_rank_refusal(zb2, {"wte.weight": (0, 3)}) is None


@needs("pipelining_zbv")
def test_search_never_offers_zbv_for_the_tied_gpt():
    import fxplan
    from fxplan.inter_op.infeasible import NoRunnablePlan

    with pytest.raises(NoRunnablePlan, match="tied"):
        fxplan.search("gpt-tiny:dropout=0,seq=16,layers=4", "local-cpu:devices=2", batch=4,
                      seq=16, progress=False, constraints={"pp": 2, "schedule": "zbv"})
