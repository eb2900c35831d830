"""Parameter and FLOP counts of captured GPTs against Megatron's formulas (within 1 %), and
capture of GPT-3 175B and a 1T model on fake tensors (benchmarks/capture_time.py times it).

    P = 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h))
    training FLOPs with recompute = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))
"""

from __future__ import annotations

import pytest
import torch

from fxplan.examples.model_spec import resolve_model
from fxplan.api import capture

BATCH = 2
PRESETS = ["gpt-1.7b", "gpt-39.1b", "gpt3-175b", "gpt-1t"]


@pytest.fixture(scope="module")
def captured():
    return {name: capture(name, batch=BATCH, dtype=torch.bfloat16) for name in PRESETS}


def _megatron(config, batch):
    l, h, V, s = config.layers, config.hidden, config.vocab, config.seq
    params = 12 * l * h**2 * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))
    flops = 96 * batch * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
    return params, flops


@pytest.mark.parametrize("name", PRESETS)
def test_params_and_training_flops_match_megatron(captured, name):
    graph = captured[name]
    params, flops = _megatron(resolve_model(name).config, BATCH)
    assert graph.num_params == pytest.approx(params, rel=0.01)
    assert graph.training_flops(recompute=True) == pytest.approx(flops, rel=0.01)


def test_training_flop_convention(captured):
    """3× the forward matrix products, plus the layers' forward again with recompute."""
    graph = captured["gpt-1.7b"]
    fwd = graph.forward_matmul_flops
    head = sum(r.matmul_flops for r in graph.per_layer_table() if r.layer is None)
    assert graph.training_flops(recompute=False) == 3 * fwd
    assert graph.training_flops(recompute=True) == 4 * fwd - head
    assert graph.forward_flops > fwd  # elementwise work is counted in the forward total


def test_large_models_capture_on_fake_tensors(captured):
    for name, expected in (("gpt3-175b", 174.6e9), ("gpt-1t", 1008.0e9)):
        graph = captured[name]
        assert graph.num_params == pytest.approx(expected, rel=0.001)
        assert len(graph.blocks) == 1 and graph.blocks[0].count == resolve_model(name).config.layers
        assert graph.capture_seconds > 0
        # parameters stay on meta: nothing was allocated
        assert all(p.device.type == "meta" for p in graph.gm.parameters())


def test_sdpa_and_math_attention_count_the_same_matmuls():
    math = capture("gpt-tiny", batch=2)
    sdpa = capture("gpt-tiny:attention=sdpa", batch=2)
    assert math.forward_matmul_flops == sdpa.forward_matmul_flops
    assert any(i.op_class == "attention" for _, i in sdpa.nodes())
