"""Module-level recompute (:mod:`fxplan.runtime.apply.recompute`): ``selective`` re-runs the
attention core in the backward and nothing else, ``full`` re-runs the whole block, and the
gradients are those without recompute."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from fxplan.runtime.apply.recompute import apply_recompute


class Block(nn.Module):
    def __init__(self, hidden: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x):
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.out(o.transpose(1, 2).flatten(2))


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _run(policy: str) -> tuple[Counter, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block())
    apply_recompute(list(model), [policy, policy])
    x = torch.randn(2, 8, 16)
    loss = model(x).square().mean()
    with Count() as backward:
        loss.backward()
    return backward.ops, [p.grad for p in model.parameters()]


def test_selective_recomputes_the_attention_core_only():
    none_ops, none_grads = _run("none")
    sel_ops, sel_grads = _run("selective")
    full_ops, full_grads = _run("full")
    sdpa = "_scaled_dot_product_flash_attention_for_cpu"
    assert none_ops[sdpa] == 0 and sel_ops[sdpa] == 2 and full_ops[sdpa] == 2
    # the projections are kept under selective (no forward addmm re-run), re-run under full
    assert sel_ops["addmm"] == none_ops["addmm"] < full_ops["addmm"]
    for a, b, c in zip(none_grads, sel_grads, full_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, c, rtol=0, atol=0)


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown recompute policy"):
        apply_recompute([nn.Linear(2, 2)], ["some"])


def _saved_bytes(policy: str, block: type = Block) -> int:
    """Bytes of the distinct storages autograd keeps for the backward of two blocks."""
    torch.manual_seed(0)
    model = nn.Sequential(block(), block())
    apply_recompute(list(model), [policy, policy])
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(torch.randn(2, 64, 16))
    return sum(seen.values())


def test_selective_keeps_what_autograd_keeps_less_the_attention_output():
    """In blocks with a fused attention call, selective recompute checkpoints that call alone
    (``AttentionCheckpoint``): the block keeps what autograd keeps without recompute, less
    the attention's own saved output and statistics — no cache of other ops' outputs, which
    torch's selective checkpoint over the block keeps for its replay."""
    from fxplan.runtime.apply.recompute import AttentionCheckpoint

    none, selective = _saved_bytes("none"), _saved_bytes("selective")
    assert selective < none, (selective, none)
    model = Block()
    apply_recompute([model], ["selective"])
    assert any(getattr(h, "__qualname__", "").startswith(AttentionCheckpoint.install.__qualname__)
               for h in model._forward_pre_hooks.values())


def test_the_module_level_leaves_a_written_out_selective_to_the_graph_rewrite():
    """Torch's selective checkpoint over a block frees none of the scores a written-out
    attention's selective recompute is priced to free, so the module level refuses such a
    plan (the graph rewrite outlines the core), under expert parallelism too (which only the
    module level runs: the plan is refused, and the search's runtime check prunes it). Under
    context parallelism the examples' GPT attention becomes one fused call per block,
    checkpointed alone like a block with a fused call of its own."""
    from rt_cp_cases import with_cp
    from rt_ep_cases import build_moe, make_ep_plan
    from rt_plans import build_model, make_plan

    from fxplan.runtime.apply.module import module_level_plan
    from fxplan.runtime.styles.tp_styles import NotExpressible

    tokens = torch.zeros(4, 16, dtype=torch.long)
    plan = make_plan(dp=2, recompute="selective")
    with pytest.raises(NotExpressible, match="make 0 such calls"):
        module_level_plan(build_model(2, attention="math"), plan, tokens)
    module_level_plan(build_model(2, attention="sdpa"), plan, tokens)
    module_level_plan(build_model(2, attention="math"), with_cp(plan, 2), tokens[:, :8])
    experts = make_ep_plan(dp=2, ep=2, recompute="selective")
    with pytest.raises(NotExpressible, match="make 0 such calls"):
        module_level_plan(build_moe(), experts, tokens)
    module_level_plan(build_moe(attention="sdpa"), experts, tokens)



def test_an_attention_call_with_dropout_counts_as_fused():
    """The CPU runs ``F.scaled_dot_product_attention`` with dropout by its composite kernel
    (no fused ATen op): the probe counts the call itself, which is what the per-call
    checkpoint wraps, so a model with attention dropout recomputes it selectively at module
    level, beside a split backward too."""
    from rt_plans import make_plan

    from fxplan.examples.model_spec import resolve_model
    from fxplan.runtime.apply.module import module_level_plan

    model = resolve_model("gpt-tiny:layers=4,attention=sdpa,dropout=0.1,seq=16").build("cpu")
    plan = make_plan(pp=2, schedule="zb", recompute="selective", num_microbatches=2, layers=4)
    decided = module_level_plan(model.train(), plan, torch.zeros(4, 16, dtype=torch.long))
    assert decided.probe.fused_attention and len(decided.probe.attention) == 4
