"""Each rewrite pass alone, in one process: same values as the model, named errors."""

from __future__ import annotations

import pytest
import torch

from fxplan.passes.rewrite.base import (PassError, PassInternalError, PassManager, PassResult,
                                        RewritePass, record_fallback)
from fxplan.passes.rewrite.emit import emit_program
from fxplan.passes.rewrite.layers import OutlineLayers
from fxplan.passes.rewrite.recompute import Recompute
from fxplan.passes.rewrite.stages import SplitStages
from fxplan.passes.tracer import trace_model
from rt_plans import build_model, fixed_batch, make_plan


def _outlined(layers: int = 2, attention: str = "math"):
    model = build_model(layers, attention=attention)
    return model, OutlineLayers()(trace_model(model, 1), None)


def test_outline_layers_keeps_values_and_ties():
    model, result = _outlined()
    assert result.changed
    gm = result.module
    children = [n for n, _ in gm.named_children() if n in ("embed", "layer_0", "layer_1", "head")]
    assert children == ["embed", "layer_0", "layer_1", "head"]
    tokens, _ = fixed_batch(make_plan())
    torch.testing.assert_close(gm(tokens), model(tokens), rtol=0, atol=0)
    shared = {id(p) for p in gm.embed.parameters()} & {id(p) for p in gm.head.parameters()}
    assert len(shared) == 1  # the tied embedding / LM head stays one Parameter
    assert not OutlineLayers()(gm, None).changed


@pytest.mark.parametrize("schedule,pp", [("1f1b", 2), ("interleaved:2", 2)])
def test_split_stages_chain_to_the_model(schedule, pp):
    model, result = _outlined(layers=4)
    plan = make_plan(pp=pp, schedule=schedule, layers=4, num_microbatches=2)
    tokens, _ = fixed_batch(plan)
    program = SplitStages((tokens[:2],))(result.module, plan).module
    assert program.num_stages == pp * plan.virtual_stages
    torch.testing.assert_close(program(tokens), model(tokens), rtol=0, atol=0)
    assert program.stage_io[0].inputs[0].dtype == torch.int64
    assert tuple(program.stage_io[-1].outputs[0].shape) == (2, 16, 512)


def test_split_stages_refuses_stages_that_do_not_tile():
    import dataclasses

    from fxplan.core.plan import PlanError, StageAssignment

    _, result = _outlined()
    plan = make_plan(pp=2, num_microbatches=2)
    overlapping = (StageAssignment(0, (0, 1), True), StageAssignment(1, (0, 2), has_head=True))
    with pytest.raises(PlanError, match="contiguous"):  # a Plan refuses them when made …
        dataclasses.replace(plan, stages=overlapping)
    object.__setattr__(plan, "stages", overlapping)  # … and the pass, should one get through
    with pytest.raises(PassError, match=r"^\[split-stages\].*do not tile"):
        SplitStages((torch.zeros(2, 16, dtype=torch.long),))(result.module, plan)


@pytest.mark.parametrize("policy,attention", [("full", "math"), ("selective", "math"),
                                              ("selective", "sdpa")])
def test_recompute_same_gradients(policy, attention):
    model, result = _outlined(attention=attention)
    reference = build_model(2, attention=attention)
    plan = make_plan(recompute=policy)
    out = Recompute()(result.module, plan)
    assert out.changed
    if policy == "selective":
        assert any(n.startswith("attn_core_") for n, _ in out.module.layer_0.named_children())
    tokens, targets = fixed_batch(plan)
    for net in (out.module, reference):
        torch.nn.functional.cross_entropy(net(tokens).flatten(0, 1), targets.flatten()).backward()
    grads = {n: p.grad for n, p in reference.named_parameters()}
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, grads[name], rtol=1e-6, atol=1e-7)


def test_pass_manager_names_the_failing_pass():
    class Broken(RewritePass):
        name = "broken-pass"

        def run(self, gm, plan):
            self.at = "node 'view_3'"
            raise KeyError("boom")

    class Refuses(RewritePass):
        name = "refusing-pass"

        def run(self, gm, plan):
            raise self.error("cannot do that", "view_3")

    class Nothing(RewritePass):
        name = "nothing"

        def run(self, gm, plan):
            return PassResult(gm, False)

    _, result = _outlined()
    manager = PassManager([Nothing()])
    assert not manager.run(result.module, make_plan()).changed
    assert manager.history == [("nothing", False)]
    with pytest.raises(PassError, match=r"^\[refusing-pass\] node 'view_3': cannot do that"):
        PassManager([Refuses()]).run(result.module, make_plan())
    # a bug is not a user error: not a PassError/UserError, names pass and node, keeps the cause
    from fxplan.core.errors import UserError

    with pytest.raises(PassInternalError, match=r"^\[broken-pass\] internal error at node "
                       r"'view_3': KeyError") as info:
        PassManager([Broken()]).run(result.module, make_plan())
    assert not isinstance(info.value, UserError)
    assert isinstance(info.value.__cause__, KeyError) and info.value.__cause__.__traceback__


def test_emit_program_annotates_placements():
    model = build_model(2)
    plan = make_plan(pp=2, tp=2, sp=True, num_microbatches=2)
    text = emit_program(model, plan)
    assert text.startswith("# fxplan program — pp=2 dp=1 tp=2")
    assert "# stage 1 (pp rank 1): layer_1, head" in text
    assert "h.0.attn.qkv.weight" in text and "RS(0)" in text
    assert "# planned S(0)S(1)" in text
    assert "def embed(self" in text and "same code as the first block" in text


def test_record_fallback_logs_and_keeps_each_line_once(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    lines: list[str] = []
    with caplog.at_level(logging.WARNING, logger="fxplan.runtime"):
        assert record_fallback(lines, "[x] a runs as b")
        assert not record_fallback(lines, "[x] a runs as b")      # a repeat: neither kept nor logged
        assert record_fallback(lines, "[y] c runs as d")
        assert record_fallback(None, "[z] logged only")
    assert lines == ["[x] a runs as b", "[y] c runs as d"]
    assert caplog.messages == [f"fxplan runtime fallback: {line}" for line in
                               ("[x] a runs as b", "[y] c runs as d", "[z] logged only")]
