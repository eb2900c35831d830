"""Capture by torch.export: the same annotations as symbolic_trace, fallback when tracing
fails, nn.TransformerEncoder and torchtitan-style models, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

from fxplan.api import capture
from fxplan.examples.model_spec import resolve_model
from fxplan.passes.capture import CaptureError

MODELS = Path(__file__).parent / "models"


@pytest.mark.parametrize("spec", ["gpt-tiny", "llama-tiny"])
def test_both_methods_price_a_model_alike(spec):
    traced = capture(spec, batch=2, dtype=torch.bfloat16)
    exported = capture(spec, batch=2, dtype=torch.bfloat16, method="export")
    assert (traced.method, exported.method) == ("symbolic_trace", "export")
    assert exported.num_params == traced.num_params
    assert exported.params.keys() == traced.params.keys()  # state_dict names, ties kept
    assert exported.forward_flops == traced.forward_flops
    assert exported.forward_matmul_flops == traced.forward_matmul_flops
    for recompute in (True, False):
        assert exported.training_flops(recompute) == traced.training_flops(recompute)
    assert exported.saved_bytes == traced.saved_bytes  # dropout masks are 1 byte both ways
    assert [b.layers for b in exported.blocks] == [b.layers for b in traced.blocks] == [[0, 1]]
    assert not exported.unpriced_ops


def test_export_graph_names_parameters_by_state_dict_name():
    graph = capture("gpt-tiny", method="export")
    owned = {p for _, info in graph.nodes() for p in info.params}
    assert owned and owned <= set(graph.params)
    wq = next(n for n in graph.gm.graph.nodes if n.op == "get_attr" and n.target == "h.0.attn.qkv.weight")
    user = next(iter(wq.users))
    assert user.target is torch.ops.aten.linear.default
    assert graph.info(user).layer == 0 and graph.info(user).module_path == "h.0.attn.qkv"
    assert wq.next.next is user and wq.next.target == "h.0.attn.qkv.bias"  # before their user
    checks = [n for n in graph.gm.graph.nodes if "assert" in str(n.target) or n.target == "_guards_fn"]
    assert not checks


class Masked(nn.Module):
    """Attention written with ``torch.ones(T, T)`` inside forward: fx cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))

    def forward(self, x):
        t = x.size(1)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        for block in self.blocks:
            scores = (block(x) @ x.transpose(1, 2)).masked_fill(~mask, float("-inf"))
            x = scores.softmax(-1) @ x
        return x


def test_auto_falls_back_to_export_and_says_why():
    graph = capture(Masked(), inputs=torch.randn(2, 8, 16))
    assert graph.method == "export"
    assert "symbolic_trace failed" in graph.method_note and "torch.ones" in graph.method_note
    assert graph.summary()["method"] == "export"
    # per block: linear 2·(2·8·16)·16 + bias 2·8·16; scores and scores@x 2·(2·8·8)·16 each
    assert graph.forward_matmul_flops == 2 * (2 * 256 * 16 + 256 + 2 * (2 * 128 * 16))
    with pytest.raises(CaptureError, match=r"torch\.ones\(t, t"):
        capture(Masked(), inputs=torch.randn(2, 8, 16), method="symbolic_trace")


def test_transformer_encoder_layers_are_found():
    graph = capture(resolve_model(str(MODELS / "encoder_stack.py")), batch=2)
    assert graph.method == "export"  # nn.MultiheadAttention does not symbolic_trace
    assert [b.layers for b in graph.blocks] == [[0, 1]]
    assert [graph.layer_names[i] for i in (0, 1)] == ["encoder.layers.0", "encoder.layers.1"]
    layer = next(r for r in graph.per_layer_table() if r.layer == 0)
    assert layer.params == 4 * 64 * 64 + 4 * 64 + 2 * 4 * 64 * 64 + 4 * 64 + 64 + 4 * 64
    linears = [n for n in graph.gm.graph.nodes if n.target is torch.ops.aten.linear.default]
    assert len(linears) == 2 * 4 + 1


def test_torchtitan_style_llama_captures_with_its_module_dict_layers():
    graph = capture(resolve_model(str(MODELS / "torchtitan_llama.py")), batch=2)
    assert graph.method == "export" and "freqs_cis" in graph.method_note
    assert [b.layers for b in graph.blocks] == [[0, 1]]
    assert graph.layer_names == {0: "layers.0", 1: "layers.1"}
    assert graph.num_params == sum(p.numel() for p in resolve_model(
        str(MODELS / "torchtitan_llama.py")).build().parameters())


def test_export_refuses_leaf_modules_and_unknown_methods():
    with pytest.raises(CaptureError, match="leaf_modules need method='symbolic_trace'"):
        capture("gpt-tiny", method="export", leaf_modules=["Block"])
    with pytest.raises(CaptureError, match="not one of auto, symbolic_trace, export"):
        capture("gpt-tiny", method="dynamo")


class DataDependent(nn.Module):
    def forward(self, x):
        return x * 2 if x.sum() > 0 else x


def test_when_both_methods_fail_the_error_names_both():
    with pytest.raises(CaptureError) as err:
        capture(DataDependent(), inputs=torch.randn(4, 8))
    text = str(err.value)
    assert "control flow" in text and "torch.export failed too" in text
    assert "leaf_modules=" in text  # the fx remedies are kept
