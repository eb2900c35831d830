"""Hugging Face presets: the published configs of common models, as config values (no weights).

Each preset is a ``model_type`` and the fields that fix the model's shapes, copied from the
models' ``config.json`` files on the Hugging Face hub (``meta-llama/Llama-2-7b-hf``,
``meta-llama/Meta-Llama-3-8B``, ``openai-community/gpt2``…, ``google-bert/bert-base-uncased``);
fields that do not change a shape (rotary base, norm epsilon, initialiser range) keep the
``transformers`` defaults. ``fxplan graph hf:llama-2-7b:num_hidden_layers=2`` overrides any
field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["HFPreset", "HF_PRESETS"]


@dataclass(frozen=True)
class HFPreset:
    """A ``transformers`` model type and the config values that differ from its defaults."""

    model_type: str
    values: dict[str, Any] = field(default_factory=dict)
    description: str = ""


def _llama(hidden: int, ffn: int, layers: int, heads: int, kv_heads: int, vocab: int,
           positions: int, name: str) -> HFPreset:
    return HFPreset("llama", dict(hidden_size=hidden, intermediate_size=ffn,
                                  num_hidden_layers=layers, num_attention_heads=heads,
                                  num_key_value_heads=kv_heads, vocab_size=vocab,
                                  max_position_embeddings=positions,
                                  tie_word_embeddings=False), name)


def _gpt2(hidden: int, layers: int, heads: int, name: str) -> HFPreset:
    return HFPreset("gpt2", dict(n_embd=hidden, n_layer=layers, n_head=heads, vocab_size=50257,
                                 n_positions=1024), name)


def _bert(hidden: int, layers: int, heads: int, name: str) -> HFPreset:
    return HFPreset("bert", dict(hidden_size=hidden, num_hidden_layers=layers,
                                 num_attention_heads=heads, intermediate_size=4 * hidden,
                                 vocab_size=30522, max_position_embeddings=512), name)


def _moe(model_type: str, name: str, **values: Any) -> HFPreset:
    return HFPreset(model_type, dict(values, tie_word_embeddings=False), name)


#: ``name → HFPreset``, used as ``hf:<name>[:key=value,...]``.
HF_PRESETS: dict[str, HFPreset] = {
    "llama-2-7b": _llama(4096, 11008, 32, 32, 32, 32000, 4096, "Llama-2 7B"),
    "llama-2-13b": _llama(5120, 13824, 40, 40, 40, 32000, 4096, "Llama-2 13B"),
    "llama-2-70b": _llama(8192, 28672, 80, 64, 8, 32000, 4096, "Llama-2 70B (GQA, 8 KV heads)"),
    "llama-3-8b": _llama(4096, 14336, 32, 32, 8, 128256, 8192, "Llama-3 8B (GQA, 8 KV heads)"),
    "llama-3-70b": _llama(8192, 28672, 80, 64, 8, 128256, 8192, "Llama-3 70B (GQA, 8 KV heads)"),
    # meta-llama/Llama-3.1-8B config.json: Llama-3 8B's shapes with a 128k-token context
    "llama-3.1-8b": _llama(4096, 14336, 32, 32, 8, 128256, 131072,
                           "Llama-3.1 8B (GQA, 8 KV heads, 128k context)"),
    # mistralai/Mixtral-8x7B-v0.1 and Qwen/Qwen1.5-MoE-A2.7B config.json
    "mixtral-8x7b": _moe("mixtral", "Mixtral 8x7B (8 experts, top-2; 46.7B)", hidden_size=4096,
                         intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=32000,
                         max_position_embeddings=32768, num_local_experts=8,
                         num_experts_per_tok=2),
    "qwen1.5-moe-a2.7b": _moe("qwen2_moe", "Qwen1.5-MoE-A2.7B (60 experts, top-4, a shared "
                              "expert; 14.3B)", hidden_size=2048, intermediate_size=5632,
                              num_hidden_layers=24, num_attention_heads=16,
                              num_key_value_heads=16, vocab_size=151936,
                              max_position_embeddings=8192, num_experts=60,
                              num_experts_per_tok=4, moe_intermediate_size=1408,
                              shared_expert_intermediate_size=5632, decoder_sparse_step=1),
    "gpt2-small": _gpt2(768, 12, 12, "GPT-2 small (124M)"),
    "gpt2-medium": _gpt2(1024, 24, 16, "GPT-2 medium (355M)"),
    "gpt2-large": _gpt2(1280, 36, 20, "GPT-2 large (774M)"),
    "gpt2-xl": _gpt2(1600, 48, 25, "GPT-2 XL (1.5B)"),
    "bert-base": _bert(768, 12, 12, "BERT base (uncased, 110M)"),
    "bert-large": _bert(1024, 24, 16, "BERT large (uncased, 340M)"),
}
