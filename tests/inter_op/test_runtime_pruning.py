"""The search offers only plans the runtime can apply to the model: each finalist is put to
the runtime's check (``runnable``) best first; a refused one is pruned with the runtime's
reason (kind ``RUNTIME``) and never returned, and when every finalist is refused the search
fails saying why for each."""

from __future__ import annotations

import pytest

from fxplan import search
from fxplan.api import capture_for_search
from fxplan.inter_op import search as search_graph
from fxplan.inter_op.infeasible import NoRunnablePlan
from fxplan.inter_op.reasons import RUNTIME

CLUSTER = "local-cpu:devices=4"
#: OPT in small: its attention reshapes by ``self.num_heads`` (set per rank under tp).
OPT = ("hf:opt:num_hidden_layers=2,hidden_size=32,ffn_dim=64,num_attention_heads=4,"
       "vocab_size=64,max_position_embeddings=32,word_embed_proj_dim=32,dropout=0.0,"
       "attention_dropout=0.0")


@pytest.fixture(scope="module")
def gpt():  # type: ignore[no-untyped-def]
    return capture_for_search("gpt:layers=2,hidden=32,heads=4,vocab=64,seq=8", dtype="float32")


def test_a_refused_finalist_is_pruned_with_the_runtimes_reason(gpt):
    free = search_graph(gpt, CLUSTER, batch=4, progress=False)
    asked = []

    def runnable(plan):  # refuses the plan the unchecked search returns
        asked.append(plan.config)
        return "not on this model" if plan.config == free.config else None

    plan = search_graph(gpt, CLUSTER, batch=4, progress=False, runnable=runnable)
    assert asked == [free.config, plan.config] and plan.config != free.config
    refused = [(r, d) for r, d in zip(plan.pruned, plan.pruned_detail) if d["kind"] == RUNTIME]
    assert len(refused) == 1
    assert refused[0][1]["config"] == free.config.to_string()
    assert refused[0][0] == f"{free.config.summary()}: not on this model"


def test_every_finalist_refused_is_one_error_naming_each(gpt):
    from fxplan.inter_op.driver import RUNTIME_ROUNDS

    asked = []
    with pytest.raises(NoRunnablePlan, match=r"(?s)cannot apply any of the \d+ plan\(s\).*· pp="):
        search_graph(gpt, CLUSTER, batch=4, progress=False, finalists=2,
                     runnable=lambda plan: asked.append(plan.config) or "no")
    assert 2 < len(asked) <= 2 * RUNTIME_ROUNDS          # rounds of 2 finalists, then it stops
    assert len(set(asked)) == len(asked)                   # no plan checked twice


def test_when_a_round_of_finalists_is_refused_the_next_candidates_are_checked(gpt):
    """The runtime refuses every pp > 1 plan: when the K fastest candidates all have pp > 1,
    the search prices and checks the next K (not the same ones again) and offers the first
    pp = 1 plan among them."""
    first = search_graph(gpt, CLUSTER, batch=4, progress=False, finalists=2,
                         constraints={"zero_stage": 3})
    assert first.pp > 1   # the fastest two have pp > 1: the case to test
    plan = search_graph(gpt, CLUSTER, batch=4, progress=False, finalists=2,
                        constraints={"zero_stage": 3},
                        runnable=lambda plan: "no pipeline here" if plan.pp > 1 else None)
    assert plan.pp == 1 and plan.zero_stage == 3
    refused = [r for r, d in zip(plan.pruned, plan.pruned_detail) if d["kind"] == RUNTIME]
    assert refused and all("no pipeline here" in r for r in refused)


def test_vit_under_zero3_is_offered_without_a_pipeline():
    """``hf:vit`` cannot be cut into stages (its patch embedding), and the fastest finalists
    under zero=3 all had pp=2: the search refused the model outright; the next round offers
    a pp = 1 plan."""
    pytest.importorskip("transformers")
    vit = ("hf:vit:num_hidden_layers=2,hidden_size=32,intermediate_size=64,"
           "num_attention_heads=4,image_size=16,patch_size=8,num_labels=10")
    plan = search(vit, CLUSTER, batch=4, progress=False, constraints={"zero_stage": 3})
    assert plan.pp == 1 and plan.zero_stage == 3


def test_hf_opt_tensor_parallel_plans_run_head_parallel_and_fixed_counts_are_refused():
    """OPT's attention views by ``self.num_heads``: the runtime sets the local head count per
    rank, so tp=2, dp=2 with sequence parallelism is offered (and trains like one process:
    ``tests/runtime/test_tp_head_counts.py``). A forward whose head count and widths are
    constants of the code has nothing to set: refused, naming it."""
    pytest.importorskip("transformers")
    plan = search(OPT, CLUSTER, batch=4, seq=8, progress=False,
                  constraints={"tp": 2, "dp": 2, "sequence_parallel": True})
    from fxplan.api import runtime_check
    assert runtime_check(capture_for_search(OPT, seq=8, dtype="float32"), CLUSTER)(plan) is None
    from pathlib import Path

    models = Path(__file__).resolve().parents[1] / "runtime" / "models"
    with pytest.raises(NoRunnablePlan, match=r"the forward fails with the tensor-parallel local "
                                             r"shapes .*a head count fixed in the code"):
        search(f"{models / 'nanogpt_style.py'}:build", CLUSTER, batch=4, progress=False,
               constraints={"tp": 2, "pp": 1})


def test_degrees_the_constraints_leave_free_are_reported(gpt):
    plan = search_graph(gpt, CLUSTER, batch=4, progress=False, constraints={"tp": 2})
    assert plan.tp == 2
    free = [n for n in ("pp", "dp") if getattr(plan, n) > 1]
    assert free   # tp=2 of 4 devices: pp or dp is 2
    lines = [f for f in plan.fallbacks if "chosen by the search" in f]
    assert bool(lines) == bool(free)
    for name in free:
        assert f"{name}={getattr(plan, name)}" in lines[0]
    assert not [f for f in search_graph(gpt, CLUSTER, batch=4, progress=False).fallbacks
                if "chosen by the search" in f]


def test_a_named_tp_splits_weights(gpt):
    """At hidden 32 the solver finds every placement replicated cheapest (a tp=2 plan that
    splits nothing, the step of one rank); a tp the user names splits weights: the default
    Megatron layout is kept instead, with the reason among the notes."""
    plan = search_graph(gpt, CLUSTER, batch=4, progress=False, constraints={"tp": 2})
    split = [n for n, p in plan.placements.params.items() if p[-1].is_shard()]
    assert split, plan.placements.params
    assert any("split no parameter over tp" in f for f in plan.fallbacks)
    assert not any("split no parameter over tp" in f for f in search_graph(
        gpt, CLUSTER, batch=4, progress=False, constraints={"tp": 1}).fallbacks)


def test_a_model_returning_the_last_positions_logits_is_refused_at_capture():
    """A ``forward(idx)`` that returns ``(b, 1, V)`` logits: priced as it is, it failed on
    every rank at the loss (``Expected input batch_size (8) to match target batch_size
    (256)``); capture refuses it (the trainer's loss does not fit the output) before the
    search prices anything."""
    from pathlib import Path

    from fxplan.examples.user_loss import LossShapeError
    models = Path(__file__).resolve().parents[1] / "runtime" / "models"
    with pytest.raises(LossShapeError, match=r"returns \(1, 1, 64\) for token ids of shape "
                                             r"\(1, 8\).*logits of shape \(1, 8, 'vocab'\)"):
        search(f"{models / 'nanogpt_style.py'}:build_last_position", CLUSTER, batch=4,
               progress=False)
    search(f"{models / 'nanogpt_style.py'}:build", CLUSTER, batch=4, progress=False)


def test_a_forward_trained_on_its_own_loss_is_not_offered_a_pipeline():
    """nanoGPT's ``forward(idx, targets)`` is fed the targets and trained on the loss it
    returns (as priced): a pipeline cannot cut that, so every pp > 1 plan is pruned with the
    reason, and pp = 1 plans are offered."""
    from pathlib import Path

    models = Path(__file__).resolve().parents[1] / "runtime" / "models"
    graph = capture_for_search(f"{models / 'nanogpt_style.py'}:build_smoothed", dtype="float32")
    assert graph.fed_targets
    with pytest.raises(NoRunnablePlan) as refused:
        search(graph, CLUSTER, batch=4, constraints={"pp": 2}, progress=False)
    assert "pp=2: the forward takes targets and is trained on the loss it returns, which a " \
           "pipeline cannot cut into stages" in str(refused.value)
    plan = search(graph, CLUSTER, batch=4, constraints={"pp": 1}, progress=False)
    assert plan.pp == 1


def test_plans_refused_for_one_reason_are_listed_together_with_it_said_once() -> None:
    refused = NoRunnablePlan("m", [("pp=1 tp=2 sp=off", "the reason A"),
                                   ("pp=2 tp=1", "the reason B"),
                                   ("pp=1 tp=2 sp=on", "the reason A")])
    text = str(refused)
    assert "any of the 3 plan(s)" in text and text.count("the reason A") == 1
    assert "\n  · pp=1 tp=2 sp=off\n    pp=1 tp=2 sp=on: the reason A\n  · pp=2 tp=1: the reason B\n" \
        in text
