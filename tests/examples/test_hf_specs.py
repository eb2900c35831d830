"""``hf:`` model specs: Hugging Face models from a config, offline, on the meta device."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from fxplan.api import capture  # noqa: E402
from fxplan.examples.hf_presets import HF_PRESETS  # noqa: E402
from fxplan.examples.model_spec import ModelSpecError, canonical_spec, resolve_model  # noqa: E402

LLAMA = ("hf:llama:num_hidden_layers=2,hidden_size=64,intermediate_size=128,"
         "num_attention_heads=4,num_key_value_heads=2,vocab_size=256")
GPT2 = "hf:gpt2:n_layer=2,n_embd=64,n_head=4,vocab_size=256,n_positions=64"
BERT = ("hf:bert:num_hidden_layers=2,hidden_size=64,num_attention_heads=4,"
        "intermediate_size=128,vocab_size=256,max_position_embeddings=64")


def _numel(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied parameters once


@pytest.mark.parametrize("spec, cls, prefix", [
    (LLAMA, "LlamaForCausalLM", "model.layers"),
    (GPT2, "GPT2LMHeadModel", "transformer.h"),
    (BERT, "BertForMaskedLM", "bert.encoder.layer"),
])
def test_small_configs_capture_with_their_layers(spec, cls, prefix):
    bundle = resolve_model(spec)
    model = bundle.build()
    assert type(model).__name__ == cls and next(model.parameters()).is_meta
    graph = capture(spec, batch=2, seq=16, dtype=torch.bfloat16)
    assert graph.method == "export"
    assert [b.layers for b in graph.blocks] == [[0, 1]]
    assert graph.layer_names == {0: f"{prefix}.0", 1: f"{prefix}.1"}
    assert graph.num_params == _numel(model)
    assert graph.inputs == {"input_ids": ((2, 16), torch.int64), "labels": ((2, 16), torch.int64)}
    assert graph.info(list(graph.gm.graph.nodes)[-2]).op_class in ("loss", "view", "elementwise")
    assert graph.forward_matmul_flops > 0 and graph.saved_bytes > 0


def test_presets_are_the_published_shapes():
    assert {"llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b",
            "gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl", "bert-base",
            "bert-large"} <= set(HF_PRESETS)
    config = resolve_model("hf:llama-2-70b").config
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads, config.intermediate_size) == (8192, 80, 64, 8, 28672)
    assert _numel(resolve_model("hf:llama-2-7b").build()) == 6_738_415_616
    assert _numel(resolve_model("hf:gpt2-small").build()) == 124_439_808
    assert _numel(resolve_model("hf:bert-base").build()) == 109_514_298  # with the MLM head


def test_overrides_apply_to_presets_and_keep_types():
    config = resolve_model("hf:llama-3-8b:num_hidden_layers=2,rms_norm_eps=1e-6").config
    assert config.num_hidden_layers == 2 and config.rms_norm_eps == 1e-6
    assert config.vocab_size == 128256 and config.use_cache is False
    assert type(resolve_model("hf:bert:task=causal").build("meta")).__name__ == "BertLMHeadModel"


def test_local_config_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mistral", "hidden_size": 64,
                                "intermediate_size": 128, "num_hidden_layers": 2,
                                "num_attention_heads": 4, "num_key_value_heads": 2,
                                "vocab_size": 256, "architectures": ["MistralForCausalLM"]}))
    graph = capture(f"hf:{path}", batch=1, seq=16)
    assert [b.layers for b in graph.blocks] == [[0, 1]]  # another decoder type, no code for it
    assert canonical_spec(f"hf:{path}") == f"hf:{path.resolve()}"


@pytest.mark.parametrize("spec, expected", [
    ("hf:", "expected hf:<model_type>"),
    ("hf:not-a-model", "neither an fxplan Hugging Face preset"),
    ("hf:llama:layers=2", "'layers' is not a field of the llama config; fields include num_hidden_layers"),
    ("hf:llama:num_hidden_layers=two", "expected an integer"),
    ("hf:llama:num_hidden_layers", "is not key=value"),
    ("hf:llama:task=translate", "expected one of masked, causal, seq2seq, image"),
    ("hf:llama:task=seq2seq", "has no seq2seq head; it has: causal"),
    ("hf:llama:task=masked", "has no masked head"),
    ("hf:missing/config.json", "does not exist"),
])
def test_spec_errors_say_what_is_allowed(spec, expected):
    with pytest.raises(ModelSpecError, match=expected.replace("(", r"\(")):
        resolve_model(spec)


def test_seq_is_bounded_by_the_config():
    bundle = resolve_model(GPT2)
    assert bundle.example_inputs(1)["input_ids"].shape == (1, 64)
    with pytest.raises(ModelSpecError, match="exceeds the config's max_position_embeddings=64"):
        bundle.example_inputs(1, 65)


def test_seq_defaults_to_a_training_length_not_the_configs_maximum():
    """Mistral's config allows 131,072 positions; a plan means a training length (4096)."""
    from fxplan.examples.hf import DEFAULT_SEQ

    bundle = resolve_model("hf:mistral:num_hidden_layers=1,hidden_size=32,intermediate_size=64,"
                           "num_attention_heads=4,num_key_value_heads=2,vocab_size=64")
    assert bundle.config.max_position_embeddings == 131072
    assert bundle.example_inputs(1)["input_ids"].shape == (1, DEFAULT_SEQ) == (1, 4096)
    assert bundle.example_inputs(1, 8192)["input_ids"].shape == (1, 8192)


def test_encoder_decoder_and_image_classifier_heads():
    """T5 is built as a text-to-text model (encoder ids, decoder ids, labels); ViT as an image
    classifier (pixels and class ids below num_labels, no sequence length)."""
    t5 = resolve_model("hf:t5:num_layers=1,num_decoder_layers=1,d_model=16,d_ff=32,num_heads=2,"
                       "d_kv=8,vocab_size=64")
    assert type(t5.build("meta")).__name__ == "T5ForConditionalGeneration"
    inputs = t5.example_inputs(2, 8)
    assert list(inputs) == ["input_ids", "decoder_input_ids", "labels"]
    assert {s.shape for s in inputs.values()} == {(2, 8)} and inputs["labels"].high == 64
    vit = resolve_model("hf:vit:num_hidden_layers=1,hidden_size=16,intermediate_size=32,"
                        "num_attention_heads=2,image_size=16,patch_size=8,num_labels=10")
    assert type(vit.build("meta")).__name__ == "ViTForImageClassification"
    inputs = vit.example_inputs(2)
    assert inputs["pixel_values"].shape == (2, 3, 16, 16)
    assert (inputs["labels"].shape, inputs["labels"].high) == ((2,), 10)
    with pytest.raises(ModelSpecError, match="an image classifier has no sequence length"):
        vit.example_inputs(2, 8)


def test_file_without_model_type(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{}")
    with pytest.raises(ModelSpecError, match='has no "model_type"'):
        resolve_model(f"hf:{path}")
