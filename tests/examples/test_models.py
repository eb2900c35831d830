"""The example models are real models: they run forward and backward on CPU tensors."""

from __future__ import annotations

import pytest
import torch

from fxplan.examples.model_spec import resolve_model
from fxplan.examples.models.gpt import GPT, GPTConfig
from fxplan.examples.models.llama import LlamaConfig


def _real_inputs(bundle, batch: int) -> dict[str, torch.Tensor]:
    out = {}
    for name, spec in bundle.example_inputs(batch).items():
        if spec.dtype.is_floating_point:
            out[name] = torch.randn(spec.shape, dtype=spec.dtype)
        else:
            high = getattr(bundle.config, "vocab", None) or getattr(bundle.config, "classes")
            out[name] = torch.randint(0, high, spec.shape)
    return out


@pytest.mark.parametrize("spec", ["gpt-tiny", "gpt-tiny:attention=sdpa", "llama-tiny",
                                  "mlp-small", "convnet-small"])
def test_tiny_models_train_on_cpu(spec):
    torch.manual_seed(0)
    bundle = resolve_model(spec)
    model = bundle.build(device="cpu")
    inputs = _real_inputs(bundle, batch=2)
    loss = model(**inputs)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    no_targets = {k: v for k, v in inputs.items() if k != "targets"}
    logits = model(**no_targets)
    assert logits.shape[0] == 2


def test_gpt_math_and_sdpa_attention_agree():
    torch.manual_seed(0)
    math_model = GPT(GPTConfig(layers=2, hidden=32, heads=4, vocab=64, seq=16, dropout=0.0))
    sdpa_model = GPT(GPTConfig(layers=2, hidden=32, heads=4, vocab=64, seq=16, dropout=0.0,
                               attention="sdpa"))
    sdpa_model.load_state_dict(math_model.state_dict())
    tokens = torch.randint(0, 64, (3, 16))
    torch.testing.assert_close(math_model(tokens), sdpa_model(tokens), rtol=1e-4, atol=1e-5)
    # shorter sequences use the top-left corner of the causal mask
    torch.testing.assert_close(math_model(tokens[:, :5]), sdpa_model(tokens[:, :5]),
                               rtol=1e-4, atol=1e-5)


def test_gpt_is_causal_and_head_is_tied():
    torch.manual_seed(0)
    model = GPT(GPTConfig(layers=1, hidden=32, heads=4, vocab=64, seq=16, dropout=0.0))
    assert model.lm_head.weight is model.wte.weight
    tokens = torch.randint(0, 64, (1, 16))
    changed = tokens.clone()
    changed[0, 10] = (tokens[0, 10] + 1) % 64
    a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])  # the future does not leak back
    assert not torch.allclose(a[:, 10:], b[:, 10:])


@pytest.mark.parametrize("kwargs, message", [
    (dict(hidden=100, heads=3), "hidden=100 is not divisible by heads=3 (100 / 3 = 33.33)"),
    (dict(layers=0), "layers must be a positive integer"),
    (dict(dropout=1.5), "dropout must be in [0, 1)"),
    (dict(attention="flash"), "attention must be one of 'math', 'sdpa'"),
])
def test_gpt_config_errors_show_the_arithmetic(kwargs, message):
    with pytest.raises(ValueError) as err:
        GPTConfig(**kwargs)
    assert message in str(err.value)


def test_llama_config_defaults_and_gqa_check():
    config = LlamaConfig()
    assert (config.kv_heads, config.ffn_hidden, config.head_dim) == (32, 11008, 128)
    with pytest.raises(ValueError, match=r"heads=32 is not divisible by kv_heads=5"):
        LlamaConfig(kv_heads=5)
