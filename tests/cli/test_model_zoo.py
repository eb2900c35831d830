"""The model zoo: models nobody here wrote, in tiny configurations, each captured (its
graph's parameters adding up to the model's), searched on 4 CPU devices under data, tensor
and pipeline parallelism, ZeRO-3 and no constraint, and every plan the search returns trained
two SGD steps on 4 gloo ranks, its losses equal to one process's (fp32, relative 1e-5, the
tolerance of the numerics tests). Beside the language models: a timm-style image classifier
(image in, class scores out, the default loss against class ids), nanoGPT's own
``forward(idx, targets)`` whose loss (label-smoothed) is not the default (fed the targets and
trained on the loss it returns, as it is priced), an attention that reshapes by head counts
stored on the module (``view(b, t, self.n_head, self.head_dim)``, grouped-query; head-parallel
with the local counts set per rank), an encoder-decoder user file
(its inputs a dict in another order than its forward's parameters, bound by name at capture and
at launch, and its own ``loss(outputs, batch)``), Hugging Face T5 (text to text) and ViT (image
classification). More Hugging Face types (GPT-NeoX, Phi-3, Qwen2, Gemma 2,
Mistral, Falcon, OLMo 2, GPT-2, DeepSeek-V3 with dense first layers) are captured and searched
under the same five, every plan put to the runtime's check, without a launch. A plan the
runtime cannot run is never returned: the search either offers a plan that trains right or
refuses, naming why (``NoRunnablePlan``).

Shared work: one capture per model (``capture_for_search``, fp32) serves its five searches;
one reference per model; the plans the five searches return are trained once each (the same
plan twice is trained once). Runs on the session's rank pool (no torchrun per plan)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fxplan.api import capture_for_search
from fxplan.api import search
from fxplan.inter_op.infeasible import NoRunnablePlan
from fxplan.passes.analyses.params import unique_numel
from rt_zoo_cases import one_process

MODELS = Path(__file__).resolve().parents[1] / "runtime" / "models"
CLUSTER = "local-cpu:devices=4"
BATCH, SEQ = 4, 8
TOL = 1e-5

#: Tiny configurations (vocabulary 64, hidden 32, 4 heads, 2 layers, dropout off).
ZOO = {
    "hf-llama": "hf:llama:num_hidden_layers=2,hidden_size=32,intermediate_size=64,"
                "num_attention_heads=4,num_key_value_heads=2,vocab_size=64,"
                "max_position_embeddings=16",
    "hf-opt": "hf:opt:num_hidden_layers=2,hidden_size=32,ffn_dim=64,num_attention_heads=4,"
              "vocab_size=64,max_position_embeddings=32,word_embed_proj_dim=32,dropout=0.0,"
              "attention_dropout=0.0",
    "nanogpt-style": f"{MODELS / 'nanogpt_style.py'}:build",
    "nanogpt-own-loss": f"{MODELS / 'nanogpt_style.py'}:build_smoothed",
    "head-count-style": f"{MODELS / 'head_count_style.py'}:build",
    "titan-style": f"{MODELS / 'titan_style.py'}:build",
    "hf-bloom": "hf:bloom:n_layer=2,hidden_size=32,n_head=4,vocab_size=64,hidden_dropout=0.0,"
                "attention_dropout=0.0",
    "timm-style": f"{MODELS / 'timm_style.py'}:build",
    "seq2seq-style": f"{MODELS / 'seq2seq_style.py'}:build",
    "hf-t5": "hf:t5:num_layers=2,num_decoder_layers=2,d_model=32,d_ff=64,num_heads=4,d_kv=8,"
             "vocab_size=64,dropout_rate=0.0",
    "hf-vit": "hf:vit:num_hidden_layers=2,hidden_size=32,intermediate_size=64,"
              "num_attention_heads=4,image_size=16,patch_size=8,num_labels=10,"
              "hidden_dropout_prob=0.0,attention_probs_dropout_prob=0.0",
}
#: Models without a sequence length to set: user files fix their own shapes, images have none.
NO_SEQ = ("timm-style", "seq2seq-style", "nanogpt-style", "nanogpt-own-loss", "head-count-style",
          "titan-style", "hf-vit")
_COMMON = "hidden_size=32,num_attention_heads=4,vocab_size=64,max_position_embeddings=32"
#: More model types, captured and searched (every plan put to the runtime's check on one
#: process), not launched: CI's time.
SEARCHED = {
    "gpt_neox": f"hf:gpt_neox:num_hidden_layers=2,{_COMMON},intermediate_size=64",
    "phi3": f"hf:phi3:num_hidden_layers=2,{_COMMON},intermediate_size=64,"
            "num_key_value_heads=4,pad_token_id=0",
    "qwen2": f"hf:qwen2:num_hidden_layers=2,{_COMMON},intermediate_size=64,num_key_value_heads=2",
    "gemma2": f"hf:gemma2:num_hidden_layers=2,{_COMMON},intermediate_size=64,"
              "num_key_value_heads=2,head_dim=8",
    "mistral": f"hf:mistral:num_hidden_layers=2,{_COMMON},intermediate_size=64,"
               "num_key_value_heads=2",
    "falcon": "hf:falcon:num_hidden_layers=2,hidden_size=32,num_attention_heads=4,vocab_size=64",
    "olmo2": f"hf:olmo2:num_hidden_layers=2,{_COMMON},intermediate_size=64,num_key_value_heads=4",
    "gpt2": "hf:gpt2:n_layer=2,n_embd=32,n_head=4,vocab_size=64,n_positions=32",
    "deepseek_v3": "hf:deepseek_v3:num_hidden_layers=7,first_k_dense_replace=3,hidden_size=32,"
                   "intermediate_size=64,moe_intermediate_size=16,n_routed_experts=4,"
                   "num_experts_per_tok=2,n_shared_experts=1,num_attention_heads=4,"
                   "num_key_value_heads=4,vocab_size=64,q_lora_rank=16,kv_lora_rank=16,"
                   "qk_rope_head_dim=4,qk_nope_head_dim=4,v_head_dim=8,n_group=1,topk_group=1",
}
#: The searches: the ``--constrain`` each stands for.
KINDS = {"dp": {"tp": 1, "pp": 1}, "tp": {"tp": 2}, "pp": {"pp": 2},
         "zero3": {"zero_stage": 3}, "default": {}}


def _captured(spec: str, seq: int | None = SEQ):  # type: ignore[no-untyped-def]
    """The model captured for the search at fp32, its graph's parameters checked against the
    model's own (every parameter read, none twice, none foreign)."""
    graph = capture_for_search(spec, seq=seq, dtype="float32")
    read = {p for _, info in graph.nodes() for p in info.params}
    assert unique_numel(sorted(read), graph.params) == graph.num_params == \
        sum(p.numel() for p in graph.module.parameters())
    return graph


@pytest.mark.parametrize("name", sorted(SEARCHED))
def test_every_model_type_is_captured_whole_and_searched_to_a_runnable_plan(name):
    """Each search returns a plan the runtime's check accepted, or refuses naming why; the
    model's default (unconstrained) search returns a plan."""
    pytest.importorskip("transformers")
    graph = _captured(SEARCHED[name])
    outcome = {}
    for kind, constraints in KINDS.items():
        try:
            plan = search(graph, CLUSTER, batch=BATCH, seq=SEQ, constraints=constraints,
                          progress=False)
            outcome[kind] = plan.summary
        except NoRunnablePlan as refused:
            assert kind != "default", str(refused)
            outcome[kind] = "refused"
    print(f"\n{name}: " + "; ".join(f"{k}: {v}" for k, v in outcome.items()))


@pytest.mark.multirank
@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_plan_the_search_returns_trains_like_one_process(name, rank_pool):
    if ZOO[name].startswith("hf:"):
        pytest.importorskip("transformers")
    seq = None if name in NO_SEQ else SEQ
    graph = _captured(ZOO[name], seq)
    reference = one_process(ZOO[name], BATCH, seq)
    trained: dict[str, list[float]] = {}
    outcome: dict[str, str] = {}
    for kind, constraints in KINDS.items():
        try:
            plan = search(graph, CLUSTER, batch=BATCH, seq=seq, constraints=constraints,
                          progress=False)
        except NoRunnablePlan as refused:
            outcome[kind] = f"refused: {str(refused).splitlines()[1][:120]}"
            continue
        split = [n for n, p in plan.placements.params.items() if p[-1].is_shard()]
        if "tp" in constraints and plan.tp > 1:
            assert split, f"{name}: tp={plan.tp} named, yet no weight is split over tp"
        key = plan.to_json()
        if key not in trained:
            result = rank_pool.run("rt_zoo_cases:train", timeout=300, spec=ZOO[name],
                                   plan_json=key)[0]
            trained[key] = result["losses"]
        losses = trained[key]
        error = max(abs(a - b) / abs(b) for a, b in zip(losses, reference))
        outcome[kind] = f"{plan.summary}, {len(split)} weights split over tp, error {error:.1e}"
        assert error <= TOL, (name, kind, plan.summary, losses, reference)
    print(f"\n{name}: " + "; ".join(f"{k}: {v}" for k, v in outcome.items()))
    assert trained, f"{name}: no search returned a plan ({outcome})"
