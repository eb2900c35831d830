"""Head-parallel attention whose forward reshapes by head counts stored on the module
(:mod:`fxplan.runtime.styles.tp_head_counts`): the local counts found and checked on one
process, tp plans of such a model trained like one process (sp on and off), and the forms that
cannot be split by head group refused with their reason: a fused q/k/v projection split by
size (nanoGPT's ``c_attn``), counts that do not divide by tp, a count fixed in the code."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from fxplan import search
from fxplan.api import capture_for_search
from fxplan.examples.model_spec import resolve_model
from fxplan.inter_op.infeasible import NoRunnablePlan
from fxplan.runtime.apply.build import meta_parameters
from fxplan.runtime.apply.module import module_level_plan
from fxplan.runtime.styles.tp_head_counts import local_head_counts
from fxplan.runtime.styles.tp_styles import NotExpressible
from rt_zoo_cases import one_process

MODELS = Path(__file__).resolve().parent / "models"
SPEC = f"{MODELS / 'head_count_style.py'}:build"
BATCH, TOL = 4, 1e-5

#: nanoGPT's own attention: one fused ``c_attn`` split by ``self.n_embd``, heads viewed by
#: ``self.n_head`` with the head size from the input's full width.
NANOGPT = """
import torch
from torch import nn
from torch.nn import functional as F

class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.n_head, self.n_embd = 4, 32
        self.c_attn = nn.Linear(32, 96)
        self.c_proj = nn.Linear(32, 32)
    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (z.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = CausalSelfAttention()
        self.c_fc, self.c_out = nn.Linear(32, 64), nn.Linear(64, 32)
    def forward(self, x):
        x = x + self.attn(x)
        return x + self.c_out(F.gelu(self.c_fc(x)))

class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(64, 32)
        self.h = nn.ModuleList(Block() for _ in range(2))
        self.lm_head = nn.Linear(32, 64, bias=False)
    def forward(self, idx):
        x = self.wte(idx)
        for block in self.h:
            x = block(x)
        return self.lm_head(x)

def build():
    return GPT(), torch.zeros(4, 8, dtype=torch.long)
"""


def _plan(spec: str, devices: int, **constraints):  # type: ignore[no-untyped-def]
    return search(capture_for_search(spec, dtype="float32"), f"local-cpu:devices={devices}",
                  batch=BATCH, constraints=constraints, progress=False)


def test_the_local_counts_are_found_and_the_forward_checked():
    plan = _plan(SPEC, 2, tp=2, pp=1)
    with meta_parameters():
        model = resolve_model(SPEC).build("cpu")
    decided = module_level_plan(model, plan, (torch.zeros(BATCH, 8, dtype=torch.long),))
    assert decided.head_counts == {f"h.{i}.attn": {"n_head": 2, "n_kv_head": 1, "n_embd": 16}
                                   for i in range(2)}
    assert model.h[0].attn.n_head == 4   # set on the ranks' modules only, not here
    with pytest.raises(NotExpressible, match=r"Attention 'h.0.attn': n_kv_head=2 heads do not "
                                             r"divide by tp=4"):
        local_head_counts(model, decided.styles, 4)


def test_a_fused_projection_split_by_size_is_refused_with_its_reason(tmp_path):
    path = tmp_path / "nanogpt.py"
    path.write_text(textwrap.dedent(NANOGPT))
    with pytest.raises(NoRunnablePlan) as refused:
        _plan(f"{path}:build", 2, tp=2, pp=1)
    assert "nor can its head counts be set per rank: CausalSelfAttention 'h.0.attn': its " \
           "projection 'c_attn' has 96 outputs, not 4·8 (its heads × head size): a fused q/k/v " \
           "projection split by size" in str(refused.value)


#: OPT in small: its attention views by ``self.num_heads`` (HF's ``OPTAttention``).
OPT = ("hf:opt:num_hidden_layers=2,hidden_size=32,ffn_dim=64,num_attention_heads=4,"
       "vocab_size=64,max_position_embeddings=32,word_embed_proj_dim=32,dropout=0.0,"
       "attention_dropout=0.0")


@pytest.mark.parametrize("spec, seq, sp", [(SPEC, None, False), (SPEC, None, True),
                                           (OPT, 8, True), ("llama-tiny:layers=2", 8, False)])
def test_tp_plans_train_like_one_process(rank_pool, spec, seq, sp):
    """tp=2 × dp=2 with the attention's weights split over tp; OPT with sequence parallelism
    is the plan that once trained to a wrong loss (its tied embedding and head); the zoo's
    Llama views by ``self.heads``/``self.kv_heads`` (it ran as the graph rewrite before)."""
    if spec.startswith("hf:"):
        pytest.importorskip("transformers")
    plan = search(capture_for_search(spec, seq=seq, dtype="float32"), "local-cpu:devices=4",
                  batch=BATCH, seq=seq, progress=False,
                  constraints=dict(tp=2, pp=1, dp=2, sequence_parallel=sp))
    assert plan.tp == 2 and plan.sequence_parallel == sp
    split = [n for n, p in plan.placements.params.items() if p[-1].is_shard()]
    assert any(n.endswith(("q.weight", "q_proj.weight", "wq.weight")) for n in split), split
    result = rank_pool.run("rt_zoo_cases:train", timeout=300, spec=spec,
                           plan_json=plan.to_json())[0]
    assert result["path"] == "module", result
    reference = one_process(spec, BATCH, seq)
    error = max(abs(a - b) / abs(b) for a, b in zip(result["losses"], reference))
    assert error <= TOL, (result["losses"], reference, result["fallbacks"])
