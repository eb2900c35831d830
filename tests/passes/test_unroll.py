"""Export of a deep model from its first three layers: the rebuilt graph is the graph of the
whole model (names, targets, arguments, shapes, module stacks, code), and models whose layers
differ by index are exported whole, with the reason in the capture's note."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from fxplan.api import capture
from fxplan.examples.model_spec import resolve_model
from fxplan.passes.capture import _name_inputs
from fxplan.passes.exporter import export_graph
from fxplan.passes.unroll import UNROLLED

MODELS = Path(__file__).parent / "models"

TINY = {
    "llama": "hf:llama:num_hidden_layers=7,hidden_size=64,intermediate_size=128,"
             "num_attention_heads=4,num_key_value_heads=2,vocab_size=128",
    "gpt2": "hf:gpt2:n_layer=7,n_embd=64,n_head=4,vocab_size=128,n_positions=64",
    "bert": "hf:bert:num_hidden_layers=7,hidden_size=64,intermediate_size=128,"
            "num_attention_heads=4,vocab_size=128,max_position_embeddings=64",
    # its attention lifts constants numbered across the model (lifted_tensor_2 in layer 1,
    # lifted_tensor_4 in layer 2): the same by value, so its layers repeat
    "falcon": "hf:falcon:num_hidden_layers=7,hidden_size=64,num_attention_heads=4,"
              "vocab_size=128",
}


def _described(gm: torch.fx.GraphModule) -> list[tuple]:
    """Everything a later pass reads off a node, arguments by name."""
    rows = []
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        rows.append((node.op, node.name, str(node.target),
                     repr(torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.name)),
                     tuple(val.shape) if isinstance(val, torch.Tensor) else None,
                     repr(node.meta.get("nn_module_stack", {}))))
    return rows


def _both(model: nn.Module, inputs: dict) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    return export_graph(model, inputs, unroll=True), export_graph(model, inputs, unroll=False)


@pytest.mark.parametrize("name", sorted(TINY))
def test_unrolled_export_is_the_whole_models_graph(name):
    bundle = resolve_model(TINY[name])
    model = bundle.build(device="meta")
    layers_before = [id(m) for m in model.modules()]
    inputs = _name_inputs(model, bundle.example_inputs(1, 16), allow_var_kwargs=True)
    unrolled, whole = _both(model, inputs)
    assert UNROLLED in unrolled.meta and UNROLLED not in whole.meta
    assert _described(unrolled) == _described(whole)
    assert unrolled.code == whole.code
    assert unrolled.state_dict().keys() == whole.state_dict().keys()
    for key, value in whole.state_dict().items():
        assert unrolled.state_dict()[key].shape == value.shape
    assert [id(m) for m in model.modules()] == layers_before  # the model is given back whole


def test_nn_transformer_encoder_unrolls():
    sys.path.insert(0, str(MODELS))
    try:
        from encoder_stack import EncoderLM
    finally:
        sys.path.remove(str(MODELS))
    model = EncoderLM(layers=8)
    inputs = {"tokens": torch.zeros(2, 16, dtype=torch.long)}
    unrolled, whole = _both(model, inputs)
    assert "encoder.layers: layers 0-2 traced, 3-7 repeated" in unrolled.meta[UNROLLED]
    assert _described(unrolled) == _described(whole)


def test_capture_reports_the_repetition_and_finds_every_layer():
    graph = capture(TINY["llama"], seq=16)
    assert graph.method == "export"
    assert "model.layers: layers 0-2 traced, 3-6 repeated from layer 2" in graph.method_note
    assert [b.layers for b in graph.blocks] == [list(range(7))]


class _Alternating(nn.Module):
    """Even layers add, odd layers multiply: layer i differs by its index."""

    def __init__(self, layers: int = 7):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(8, 8)) for _ in range(layers))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x) + x if i % 2 == 0 else layer(x) * x
        return self.head(x)


class _AllHidden(nn.Module):
    """Returns every layer's output: the head reads early layers."""

    def __init__(self, layers: int = 7):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(layers))

    def forward(self, x):
        hidden = []
        for layer in self.layers:
            x = layer(x)
            hidden.append(x)
        return torch.stack(hidden).sum(0)


@pytest.mark.parametrize("model, why", [(_Alternating(), "differ"),
                                        (_AllHidden(), "reads an early layer")])
def test_layers_that_differ_are_exported_whole(model, why):
    inputs = {"x": torch.zeros(2, 8)}
    unrolled = export_graph(model, inputs, unroll=True)
    whole = export_graph(model, inputs, unroll=False)
    assert unrolled.meta[UNROLLED].startswith("all layers traced (not repeated:")
    assert why in unrolled.meta[UNROLLED]
    assert _described(unrolled) == _described(whole)
    assert len(model.layers) == 7


def test_shallow_models_are_exported_whole_without_a_note():
    model = _Alternating(layers=4)
    gm = export_graph(model, {"x": torch.zeros(2, 8)})
    assert UNROLLED not in gm.meta
    assert sum(n.op == "get_attr" and n.target.endswith(".weight") for n in gm.graph.nodes) == 5


#: DeepSeek-V3 in small: three dense layers, then mixture-of-experts layers of one class.
DEEPSEEK_V3 = ("hf:deepseek_v3:num_hidden_layers=8,first_k_dense_replace=3,hidden_size=64,"
               "intermediate_size=128,moe_intermediate_size=32,n_routed_experts=4,"
               "num_experts_per_tok=2,n_shared_experts=1,num_attention_heads=4,"
               "num_key_value_heads=4,vocab_size=128,q_lora_rank=32,kv_lora_rank=16,"
               "qk_rope_head_dim=8,qk_nope_head_dim=8,v_head_dim=16,n_group=1,topk_group=1")


def test_layers_that_change_kind_move_the_cut_past_the_change():
    """Layers 0-2 dense, 3-7 experts: the copy is made from an expert layer, and the graph
    reads every expert (the old cut copied dense layer 2 into layers 3-7)."""
    pytest.importorskip("transformers")
    bundle = resolve_model(DEEPSEEK_V3)
    model = bundle.build(device="meta")
    inputs = _name_inputs(model, bundle.example_inputs(1, 16), allow_var_kwargs=True)
    unrolled, whole = _both(model, inputs)
    assert unrolled.meta[UNROLLED] == "model.layers: layers 0-5 traced, 6-7 repeated from layer 5"
    assert _described(unrolled) == _described(whole)
    graph = capture(DEEPSEEK_V3, seq=16)
    read = {p for _, info in graph.nodes() for p in info.params}
    assert any(p.startswith("model.layers.7.mlp.experts.") for p in read)
    assert [b.layers for b in graph.blocks] == [[0, 1, 2], [3, 4, 5, 6, 7]]


class _Widening(nn.Module):
    """Layers of one class whose width changes at layer 5: same ops, other shapes."""

    def __init__(self, layers: int = 7):
        super().__init__()
        self.layers = nn.ModuleList(_Block(16 if i >= 5 else 8) for i in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x.sum()


class _Block(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.up = nn.Linear(8, hidden)
        self.down = nn.Linear(hidden, 8)

    def forward(self, x):
        return x + self.down(self.up(x))


def test_a_change_near_the_end_exports_the_whole_model_with_the_reason():
    from fxplan.passes.unroll import NotUnrollable, _container
    with pytest.raises(NotUnrollable, match=r"layers\.4 and layers\.5 differ "
                                            r"\(attribute down\.in_features: 8 vs 16\)"):
        _container(_Widening())
    inputs = {"x": torch.zeros(2, 8)}
    assert _described(export_graph(_Widening(), inputs, unroll=True)) == \
        _described(export_graph(_Widening(), inputs, unroll=False))


def test_the_layer_index_attribute_is_not_a_difference():
    """HF layers keep their own index (``self_attn.layer_idx``); that is no change of kind,
    while a plain attribute that differs otherwise is."""
    from fxplan.passes.unroll import index_attributes, layer_structure
    layers = [nn.Linear(4, 4) for _ in range(6)]
    for i, layer in enumerate(layers):
        layer.layer_idx = i
        layer.window = 8
    ignore = index_attributes(layers)
    assert ignore == frozenset({"layer_idx"})
    assert len({layer_structure(m, ignore) for m in layers}) == 1
    layers[4].window = 16
    assert layer_structure(layers[4], ignore) != layer_structure(layers[3], ignore)


def test_layers_whose_lifted_constants_are_numbered_apart_repeat():
    """Falcon's attention lifts two constants per layer, numbered across the model
    (``lifted_tensor_2`` in layer 1, ``_4`` in layer 2): equal by value, so its layers are
    unrolled from three and listed as one repeated block."""
    pytest.importorskip("transformers")
    graph = capture(f"{TINY['falcon']}", seq=16)
    assert "transformer.h: layers 0-2 traced, 3-6 repeated from layer 2" in graph.method_note
    assert [b.layers for b in graph.blocks] == [list(range(7))]
