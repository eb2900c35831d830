"""Parameter counts from a config alone, without building the model.

``fxplan models`` lists every preset with its size; building even a trillion-parameter model
on ``meta`` takes seconds, so the counts are written out per family from the model code
(``tests/examples/test_param_counts.py`` checks each against a built model). Tied weights are
counted once, as ``nn.Module.parameters()`` counts them.

Families (``examples/models``), with ``l`` layers, hidden size ``h``, vocabulary ``V``:

- ``gpt``: per layer ``12h² + 13h`` (QKV and projection with biases, 4h MLP with biases,
  two LayerNorms); learned positions ``s·h``; tied LM head; final LayerNorm ``2h``.
- ``moe``: as ``gpt`` with feed-forward width ``f = ffn_mult·h``: per layer ``4h² + 8h``
  (attention, two LayerNorms) plus, for a dense layer, ``2fh² + fh + h``, for an MoE layer
  (``E`` experts) the router ``hE`` and ``E·(2fh² + fh + h)``.
- ``llama``: per layer ``h·(a + 2k)·d + a·d·h + 3·h·f + 2h`` (``a`` heads, ``k`` KV heads of
  width ``d``, SwiGLU width ``f``, no biases, two RMSNorms); final RMSNorm; head untied unless
  ``tie_embeddings``.
- ``mlp``, ``convnet``: the layers as written in their modules.

Hugging Face presets (``hf:…``) of the model types ``llama``, ``gpt2``, ``bert``, ``mixtral`` and
``qwen2_moe`` are counted
as ``transformers`` builds them (``AutoModelForCausalLM``; ``AutoModelForMaskedLM`` for BERT);
other model types return ``None``.
"""

from __future__ import annotations

from typing import Any

from fxplan.examples.hf_presets import HFPreset

__all__ = ["family_params", "hf_params"]


def _gpt(c: Any) -> int:
    h = c.hidden
    return c.layers * (12 * h * h + 13 * h) + (c.vocab + c.seq) * h + 2 * h


def _moe(c: Any) -> int:
    h, f = c.hidden, c.ffn_mult * c.hidden
    ffn = 2 * f * h + f + h
    moe = c.moe_layers
    return (c.layers * (4 * h * h + 8 * h) + (c.layers - moe) * ffn
            + moe * (h * c.experts + c.experts * ffn) + (c.vocab + c.seq) * h + 2 * h)


def _attention(hidden: int, heads: int, kv_heads: int, qkv_bias: bool = False) -> int:
    """Grouped-query attention without output bias: Q, K, V (``a + 2k`` heads of ``d``), O."""
    d = hidden // heads
    return (hidden + qkv_bias) * (heads + 2 * kv_heads) * d + heads * d * hidden


def _llama_like(*, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int,
                tied: bool) -> int:
    layer = _attention(hidden, heads, kv_heads) + 3 * hidden * ffn + 2 * hidden
    return layers * layer + vocab * hidden * (1 if tied else 2) + hidden


def _llama(c: Any) -> int:
    return _llama_like(layers=c.layers, hidden=c.hidden, heads=c.heads, kv_heads=c.kv_heads,
                       ffn=c.ffn_hidden, vocab=c.vocab, tied=c.tie_embeddings)


def _linear(n_in: int, n_out: int, bias: bool = True) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _mlp(c: Any) -> int:
    wide = c.expansion * c.hidden
    block = 2 * c.hidden + _linear(c.hidden, wide) + _linear(wide, c.hidden)
    return (_linear(c.in_features, c.hidden) + c.layers * block + 2 * c.hidden
            + _linear(c.hidden, c.classes))


def _convnet(c: Any) -> int:
    def conv_bn(cin: int, cout: int, k: int) -> int:  # conv without bias, then batch norm
        return cin * cout * k * k + 2 * cout

    total, cin = conv_bn(c.in_channels, c.width, 3), c.width
    for stage in range(c.stages):
        cout = c.width * 2 ** stage
        for i in range(c.blocks_per_stage):
            stride = 2 if stage > 0 and i == 0 else 1
            total += conv_bn(cin, cout, 3) + conv_bn(cout, cout, 3)
            if stride != 1 or cin != cout:
                total += conv_bn(cin, cout, 1)
            cin = cout
    return total + _linear(cin, c.classes)


_FAMILY_COUNTS = {"gpt": _gpt, "moe": _moe, "llama": _llama, "mlp": _mlp, "convnet": _convnet}


def family_params(family: str, config: Any) -> int | None:
    """Parameters of the ``family`` model built from ``config`` (its config dataclass), or
    ``None`` for a family without a formula."""
    formula = _FAMILY_COUNTS.get(family)
    return None if formula is None else formula(config)


def _hf_llama(v: dict[str, Any]) -> int:
    heads = v["num_attention_heads"]
    return _llama_like(layers=v["num_hidden_layers"], hidden=v["hidden_size"], heads=heads,
                       kv_heads=v.get("num_key_value_heads", heads),
                       ffn=v["intermediate_size"], vocab=v["vocab_size"],
                       tied=v.get("tie_word_embeddings", False))


def _hf_gpt2(v: dict[str, Any]) -> int:
    h = v["n_embd"]
    wide = v.get("n_inner") or 4 * h
    layer = 4 * h + _linear(h, 3 * h) + _linear(h, h) + _linear(h, wide) + _linear(wide, h)
    return v["n_layer"] * layer + (v["vocab_size"] + v["n_positions"]) * h + 2 * h


def _hf_bert(v: dict[str, Any]) -> int:
    h, wide, vocab = v["hidden_size"], v["intermediate_size"], v["vocab_size"]
    embeddings = (vocab + v["max_position_embeddings"] + v.get("type_vocab_size", 2)) * h + 2 * h
    layer = 4 * _linear(h, h) + _linear(h, wide) + _linear(wide, h) + 4 * h
    mlm_head = _linear(h, h) + 2 * h + vocab  # transform, LayerNorm, decoder bias (weight tied)
    return embeddings + v["num_hidden_layers"] * layer + mlm_head


def _hf_moe(v: dict[str, Any]) -> int:
    """Mixtral and Qwen2-MoE: Llama's layer with the SwiGLU replaced, on its sparse layers, by
    a router (``E·h``) and ``E`` SwiGLU experts of width ``f_e`` (``3·h·f_e`` each); Qwen2-MoE
    adds a shared SwiGLU expert and its one-output gate, biases on Q/K/V, and keeps dense
    layers where ``(i + 1) mod decoder_sparse_step ≠ 0`` or ``i`` is in ``mlp_only_layers``."""
    h, heads = v["hidden_size"], v["num_attention_heads"]
    qwen = "num_experts" in v
    experts = v["num_experts"] if qwen else v["num_local_experts"]
    expert_ffn = v["moe_intermediate_size"] if qwen else v["intermediate_size"]
    attention = _attention(h, heads, v.get("num_key_value_heads") or heads, qkv_bias=qwen)
    sparse = h * experts + experts * 3 * h * expert_ffn
    if qwen:
        sparse += 3 * h * v["shared_expert_intermediate_size"] + h
    step, dense_only = v.get("decoder_sparse_step", 1) or 1, set(v.get("mlp_only_layers") or ())
    total = 0
    for i in range(v["num_hidden_layers"]):
        moe = (i + 1) % step == 0 and i not in dense_only
        total += attention + 2 * h + (sparse if moe else 3 * h * v["intermediate_size"])
    return total + v["vocab_size"] * h * (1 if v.get("tie_word_embeddings") else 2) + h


_HF_COUNTS = {"mixtral": _hf_moe, "qwen2_moe": _hf_moe, "llama": _hf_llama, "gpt2": _hf_gpt2, "bert": _hf_bert}


def hf_params(preset: HFPreset) -> int | None:
    """Parameters of a Hugging Face preset as ``transformers`` builds it, or ``None`` for a
    model type without a formula."""
    formula = _HF_COUNTS.get(preset.model_type)
    return None if formula is None else formula(preset.values)
