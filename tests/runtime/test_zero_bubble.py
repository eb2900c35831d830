"""Zero-bubble schedules on gloo ranks: ``zbv`` and ``dualpipev`` (two stages per rank in a
V) train like one process, and so do ``zb`` and ``zbv`` beside data parallelism (ZeRO-0 and
ZeRO-1, the gradients averaged after the step: ``fxplan.runtime.train.dp_reduce``) and every
schedule with full recompute (``fxplan.passes.rewrite.split_recompute``); what torch's split
backward cannot run is refused before launch, with the reason.

(``zb`` and ``zb:2`` on the tiny GPT, alone and beside tensor parallelism, are cases of
``test_numerics.py``.)"""

from __future__ import annotations

import pytest
from rt_plans import build_model, make_plan
from rt_zoo_cases import one_process
from torch_versions import needs

from fxplan.runtime.train.pipeline import zero_bubble_refusal
from fxplan.runtime.apply.tied import same_rank_refusal

SPEC = "llama-tiny:layers=4"
BATCH, SEQ = 8, 8
TOL = 1e-5


def _searched_plan_trains_like_one_process(rank_pool, devices=2, **constraints):
    """The search, held to ``constraints`` on ``devices`` ranks, plans the untied Llama; the
    plan's losses equal one process's. Returns the plan."""
    import fxplan

    plan = fxplan.search(SPEC, f"local-cpu:devices={devices}", batch=BATCH, seq=SEQ,
                         progress=False, constraints={"pp": 2, **constraints})
    assert str(plan.schedule) == constraints["schedule"] and plan.pp == 2, plan.summary
    result = rank_pool.run("rt_zoo_cases:train", timeout=300, spec=SPEC,
                           plan_json=plan.to_json())[0]
    reference = one_process(SPEC, BATCH, SEQ)
    error = max(abs(a - b) / abs(b) for a, b in zip(result["losses"], reference))
    assert error <= TOL, (plan.summary, result, reference)
    return plan


@needs("pipelining_zbv")
def test_zbv_trains_like_one_process(rank_pool):
    """``zbv``: the V puts stages 0 and 3 on rank 0, 1 and 2 on rank 1."""
    _searched_plan_trains_like_one_process(rank_pool, schedule="zbv")


@needs("pipelining_zbv")
@needs("pipelining_dualpipev")
def test_dualpipev_trains_like_one_process(rank_pool):
    """``dualpipev`` with 2 sequences per microbatch: 4 stages in the same V and m = 8/2 = 4
    = 2·pp microbatches, the fewest torch's ScheduleDualPipeV runs (its paired
    forward-backward steps, its whole and its split backwards)."""
    plan = _searched_plan_trains_like_one_process(rank_pool, schedule="dualpipev",
                                                  microbatch_size=2)
    assert plan.num_microbatches == 4 and len(plan.stages) == 4, plan.summary


@pytest.mark.parametrize("zero", [0, 1])
def test_zb_beside_data_parallelism_trains_like_one_process(rank_pool, zero):
    """pp=2 × dp=2 under ``zb`` with m = 4 (the GPT's tied embedding and head on the two
    pipeline ranks): no DDP wraps the stages, the pass after the step averages the gradients
    (ZeRO-1: ZeroRedundancyOptimizer steps the shards); 3 SGD steps, losses and every
    parameter within the suite's relative 1e-5 of one process."""
    report = rank_pool.run("rt_cases:train_matches_reference", plan_kwargs=dict(
        pp=2, dp=2, zero=zero, schedule="zb", num_microbatches=4, microbatch_size=1))[0]
    assert not report["missing"], report
    assert report["loss_error"] <= 1e-5, report
    assert report["param_error"] <= 1e-5, report
    assert report["losses"][-1] < report["losses"][0], report


@pytest.mark.multirank
def test_zb_beside_data_and_tensor_parallelism_trains_like_one_process():
    """pp=2 × dp=2 × tp=2 with sequence parallelism under ``zb`` on eight ranks (a pool of its
    own): the pass after the step averages each DTensor gradient's local shard over dp — the
    sequence-parallel weights' Partial ones too, summed over tp afterwards."""
    from rt_pool import RankPool

    pool = RankPool(world=8)
    try:
        report = pool.run("rt_cases:train_matches_reference", timeout=600, plan_kwargs=dict(
            pp=2, dp=2, tp=2, sp=True, schedule="zb", num_microbatches=4,
            microbatch_size=1))[0]
    finally:
        pool.close()
    assert not report["missing"], report
    assert report["loss_error"] <= 1e-5, report
    assert report["param_error"] <= 1e-5, report


@needs("pipelining_zbv")
@pytest.mark.parametrize("zero", [0, 1])
def test_zbv_beside_data_parallelism_trains_like_one_process(rank_pool, zero):
    """The search, held to pp=2, dp=2, ``zbv`` and the ZeRO stage on four ranks, plans the
    untied Llama (stages 0 and 3 on one rank); its losses equal one process's."""
    plan = _searched_plan_trains_like_one_process(
        rank_pool, devices=4, schedule="zbv", dp=2, zero_stage=zero, microbatch_size=1)
    assert (plan.dp, plan.zero_stage, plan.num_microbatches) == (2, zero, 4), plan.summary


@pytest.mark.parametrize("path", ["graph", "module"])
@pytest.mark.parametrize("schedule,dp", [("zb", 1), ("zb:2", 2)])
def test_full_recompute_beside_a_split_backward_trains_like_one_process(rank_pool, schedule,
                                                                        dp, path):
    """Every block recomputed under ``zb`` (pp=2) and ``zb:2`` (pp=2 × dp=2, the gradients
    averaged after the step), on the graph-rewrite and the module-level path: the kept
    recompute (``passes.rewrite.split_recompute``) serves both passes of torch's split
    backward; 3 SGD steps, losses and every parameter within the suite's relative 1e-5 of one
    process."""
    report = rank_pool.run("rt_cases:train_matches_reference", path=path, plan_kwargs=dict(
        pp=2, dp=dp, schedule=schedule, recompute="full", num_microbatches=4,
        microbatch_size=1, layers=4))[0]
    assert report["path"] == path, report
    assert not report["missing"], report
    assert report["loss_error"] <= 1e-5, report
    assert report["param_error"] <= 1e-5, report
    assert report["losses"][-1] < report["losses"][0], report


@pytest.mark.parametrize("path", ["graph", "module"])
def test_some_blocks_recomputed_beside_a_split_backward_train_like_one_process(rank_pool, path):
    """Under ``zb`` some blocks recomputed and others not (``block_recompute``, the per-stage
    counts' form): the kept recompute beside plain blocks in one split backward."""
    report = rank_pool.run("rt_cases:train_matches_reference", path=path, plan_kwargs=dict(
        pp=2, schedule="zb", recompute="full", num_microbatches=4, microbatch_size=1,
        layers=4, block_recompute=("full", "none", "none", "full")))[0]
    assert report["path"] == path, report
    assert report["loss_error"] <= 1e-5, report
    assert report["param_error"] <= 1e-5, report


@needs("pipelining_zbv")
@needs("pipelining_dualpipev")
@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_full_recompute_in_a_v_trains_like_one_process(rank_pool, schedule):
    """The search, held to pp=2, a V-shaped schedule and full recompute, plans the untied
    Llama (``dualpipev``: 2 sequences per microbatch, m = 4 = 2·pp); its losses equal one
    process's."""
    plan = _searched_plan_trains_like_one_process(rank_pool, schedule=schedule,
                                                  recompute="full", microbatch_size=2)
    assert plan.recompute_summary == "full", plan.summary


@pytest.mark.parametrize("path", ["module", "graph"])
@pytest.mark.parametrize("schedule", ["zb", "zb:2"])
def test_selective_recompute_beside_a_split_backward_trains_like_one_process(rank_pool,
                                                                             schedule, path):
    """The search, held to pp=2, a zero-bubble schedule and selective recompute, plans the
    untied Llama; applied at module level (each call of its fused attention checkpointed on
    its own: ``runtime.apply.recompute.AttentionCheckpoint``) and as the graph rewrite (each
    block's outlined attention core checkpointed), its losses equal one process's."""
    import fxplan

    plan = fxplan.search(SPEC, "local-cpu:devices=2", batch=BATCH, seq=SEQ, progress=False,
                         constraints={"pp": 2, "schedule": schedule, "recompute": "selective"})
    assert plan.recompute_summary == "selective" and str(plan.schedule) == schedule
    result = rank_pool.run("rt_zoo_cases:train", timeout=300, spec=SPEC,
                           plan_json=plan.to_json(), path=path)[0]
    assert result["path"] == path, result
    reference = one_process(SPEC, BATCH, SEQ)
    error = max(abs(a - b) / abs(b) for a, b in zip(result["losses"], reference))
    assert error <= TOL, (plan.summary, result, reference)


def test_selective_recompute_beside_a_split_backward_checkpoints_each_attention() -> None:
    """At module level, beside a split backward, each fused attention call of a block is
    checkpointed alone and recomputed once, in the input-gradient pass (the weight pass does
    not read it), with the gradients of a plain backward; an attention written out as
    products and a softmax has no such call, and the module level refuses the plan."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
    from torch.utils._python_dispatch import TorchDispatchMode

    from fxplan.runtime.apply.recompute import apply_recompute
    from fxplan.runtime.apply.module import module_level_plan
    from fxplan.runtime.styles.tp_styles import NotExpressible

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv, self.out = nn.Linear(16, 48), nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.qkv(x).view(2, 8, 3, 2, 8).permute(2, 0, 3, 1, 4)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return x + self.out(o.transpose(1, 2).reshape(2, 8, 16))

    class Attentions(TorchDispatchMode):
        """Counts the attention kernels run forward (the backward's are not counted)."""

        def __init__(self) -> None:
            super().__init__()
            self.forward = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            name = func.__name__
            self.forward += "scaled_dot_product" in name and "backward" not in name
            return func(*args, **(kwargs or {}))

    def grads(split: bool) -> tuple[list[torch.Tensor], int]:
        torch.manual_seed(0)
        blocks = nn.ModuleList(Block() for _ in range(2))
        if split:
            apply_recompute(list(blocks), ["selective"] * 2, split_backward=True)
        x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1),
                        requires_grad=True)
        with Attentions() as counted:
            h = x
            for block in blocks:
                h = block(h)
            params = list(blocks.parameters())
            _, groups = stage_backward_input([h.square().sum()], None, [x], params)
            stage_backward_weight(params, groups)
        return [x.grad, *(p.grad for p in params)], counted.forward

    plain, once = grads(split=False)
    kept, twice = grads(split=True)
    assert (once, twice) == (2, 4)   # two blocks: their forward, and once more each in B
    for a, b in zip(plain, kept, strict=True):
        torch.testing.assert_close(a, b)

    # the tiny GPT's "math" attention: products and a softmax, no fused call
    model = build_model(4, attention="math")
    plan = make_plan(pp=2, schedule="zb", recompute="selective", num_microbatches=2, layers=4)
    with pytest.raises(NotExpressible, match="make 0 such calls"):
        module_level_plan(model, plan, torch.zeros(2, 16, dtype=torch.long))


@pytest.mark.parametrize("kwargs,why", [
    (dict(pp=2, dp=2, zero=2, schedule="zb", num_microbatches=2), "ZeRO-2"),
    (dict(pp=2, dp=2, zero=3, schedule="zb:2", num_microbatches=2, layers=4), "ZeRO-3"),
    (dict(pp=2, dp=2, tp=2, zero=1, schedule="zb", num_microbatches=2), "ZeRO-1 and tp=2"),
    (dict(pp=2, dp=2, zero=3, offload="optimizer+params", schedule="zb",
          num_microbatches=2), "ZeRO-3"),
    (dict(pp=2, dp=2, zero=2, schedule="dualpipev", num_microbatches=4, layers=4), "ZeRO-2"),
])
def test_split_backward_refusals(kwargs, why):
    """Measured on gloo ranks with torch 2.13: FSDP2 hangs — refused by name instead; ZeRO-0
    and ZeRO-1 beside dp run, and so do full and selective recompute (the latter in the graph
    rewrite: ``test_selective_recompute_beside_a_split_backward_trains_like_one_process``)."""
    assert why in zero_bubble_refusal(make_plan(**kwargs))
    for schedule in ("zb", "dualpipev"):
        for recompute in ("full", "selective"):
            assert zero_bubble_refusal(make_plan(pp=2, schedule=schedule, recompute=recompute,
                                                 num_microbatches=4, layers=4)) is None
    assert zero_bubble_refusal(make_plan(pp=2, tp=2, schedule="zb", num_microbatches=2)) is None
    assert zero_bubble_refusal(make_plan(pp=2, dp=2, schedule="1f1b", num_microbatches=2)) is None
    for zero in (0, 1):
        assert zero_bubble_refusal(make_plan(pp=2, dp=2, zero=zero, schedule="zb",
                                             num_microbatches=2)) is None
    assert zero_bubble_refusal(make_plan(pp=2, dp=2, tp=2, schedule="zb:2",
                                         num_microbatches=2, layers=4)) is None


def test_zbv_needs_the_reworked_stage_set_up(monkeypatch):
    """On a torch without it (2.11) zbv and dualpipev (the same V) are refused by name; zb
    still runs."""
    from fxplan.runtime.train import pipeline

    monkeypatch.setattr(pipeline, "torch_has", lambda feature: feature != "pipelining_zbv")
    assert "zbv needs" in pipeline.zero_bubble_refusal(
        make_plan(pp=2, schedule="zbv", num_microbatches=2, layers=4))
    assert "dualpipev needs" in pipeline.zero_bubble_refusal(
        make_plan(pp=2, schedule="dualpipev", num_microbatches=4, layers=4))
    assert pipeline.zero_bubble_refusal(make_plan(pp=2, schedule="zb", num_microbatches=2)) is None


def test_dualpipev_needs_its_schedule_class(monkeypatch):
    """A torch without ScheduleDualPipeV refuses dualpipev by name; zbv still runs."""
    from fxplan.runtime.train import pipeline

    monkeypatch.setattr(pipeline, "torch_has", lambda feature: feature != "pipelining_dualpipev")
    assert "ScheduleDualPipeV" in pipeline.zero_bubble_refusal(
        make_plan(pp=2, schedule="dualpipev", num_microbatches=4, layers=4))
    assert pipeline.zero_bubble_refusal(
        make_plan(pp=2, schedule="zbv", num_microbatches=2, layers=4)) is None


@pytest.mark.parametrize("schedule,m", [("zbv", 2), ("dualpipev", 4)])
def test_v_schedules_refuse_a_weight_tied_across_the_v(schedule, m):
    """Under zbv and dualpipev stage 0 (embedding) and the last stage (head) share rank 0,
    where the runtime cannot keep a tied weight's two copies equal; other schedules keep them
    apart."""
    v = make_plan(pp=2, schedule=schedule, num_microbatches=m, layers=4)
    assert "tied" in same_rank_refusal(v, {"wte.weight": (0, 3)})
    zb2 = make_plan(pp=2, schedule="zb:2", num_microbatches=2, layers=4)
    assert same_rank_refusal(zb2, {"wte.weight": (0, 3)}) is None


@needs("pipelining_zbv")
@needs("pipelining_dualpipev")
@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_search_never_offers_a_v_for_the_tied_gpt(schedule):
    """Held to a V schedule, a GPT whose embedding and head are tied gets no candidate, and
    the refusal says why (both ends on pipeline rank 0)."""
    import fxplan
    from fxplan.inter_op.constraints import ConstraintError

    with pytest.raises(ConstraintError, match="share a weight .a tied embedding and head"):
        fxplan.search("gpt-tiny:dropout=0,seq=16,layers=4", "local-cpu:devices=2", batch=4,
                      seq=16, progress=False, constraints={"pp": 2, "schedule": schedule})
