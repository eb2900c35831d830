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
from torch_versions import dtensor_tables_of_2_13

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


@dtensor_tables_of_2_13
def test_core_aten_lowering_keeps_layers_flops_and_the_megatron_layout():
    """``method="export-core"``: export lowered to the core ATen op set (no ``aten.linear``;
    ``aten.mm`` on ``aten.t(weight)``), the same layers and matrix-product FLOPs, the sharding
    rules cover it (ops without one are listed, replicated), and the cost model's Megatron
    layout sees the weights through ``aten.t`` (the same parameters split)."""
    pytest.importorskip("transformers")
    from fxplan.cost_model.parallel.tp_layout import tp_layout
    from fxplan.sharding.api import rule_sources

    spec = ("hf:llama:num_hidden_layers=2,hidden_size=32,intermediate_size=64,"
            "num_attention_heads=4,num_key_value_heads=2,vocab_size=64,max_position_embeddings=16")
    plain = capture(spec, batch=2, seq=8, method="export")
    core = capture(spec, batch=2, seq=8, method="export-core")
    assert core.method == "export-core"
    ops = {str(n.target) for n in core.gm.graph.nodes if n.op == "call_function"}
    assert "aten.linear.default" not in ops and "aten.mm.default" in ops
    assert [b.layers for b in core.blocks] == [[0, 1]]
    assert core.forward_matmul_flops == plain.forward_matmul_flops
    assert tp_layout(core).sharded_params == tp_layout(plain).sharded_params
    assert len(tp_layout(core).column) == len(tp_layout(plain).column) > 0
    sources = rule_sources(core.gm)     # every op has a rule, DTensor's, or a listed fallback
    fallback = set(sources["fallback"])
    assert fallback <= {"aten.arange.start_step", "aten.full.default",
                        "aten.scalar_tensor.default", "aten.arange.default"}, fallback
