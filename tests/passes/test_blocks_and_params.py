"""Repeated blocks, layers, module paths and parameters (tied weights by identity)."""

from __future__ import annotations

import pytest
import torch

from fxplan.api import capture
from fxplan.passes.node_info import OP_CLASSES


@pytest.fixture(scope="module")
def gpt():
    return capture("gpt-tiny:layers=4", batch=2)


@pytest.mark.parametrize("spec, layers, per_layer", [
    ("gpt-tiny:layers=4", 4, 36), ("llama-tiny:layers=3", 3, 42), ("mlp-small", 3, 6)])
def test_identical_blocks_share_one_signature(spec, layers, per_layer):
    graph = capture(spec, batch=2)
    assert len(graph.blocks) == 1
    block = graph.blocks[0]
    assert block.layers == list(range(layers))
    assert [len(names) for names in block.nodes_per_layer] == [per_layer] * layers
    for layer, names in zip(block.layers, block.nodes_per_layer):
        assert {graph.info(n).layer for n in names} == {layer}
        assert {graph.info(n).block_signature for n in names} == {block.signature}


def test_signature_ignores_the_layer_index_but_not_the_shape():
    four = capture("gpt-tiny:layers=4", batch=2).blocks[0].signature
    two = capture("gpt-tiny:layers=2", batch=2).blocks[0].signature
    wider = capture("gpt-tiny:layers=2,hidden=128", batch=2).blocks[0].signature
    assert four == two != wider


def test_layers_kept_as_leaf_modules_still_repeat():
    graph = capture("gpt-tiny:layers=3", batch=1, leaf_modules=["Block"])
    assert graph.leaf_modules == {"h.0": "Block", "h.1": "Block", "h.2": "Block"}
    assert [(b.layers, b.nodes_per_layer) for b in graph.blocks] == [
        ([0, 1, 2], [["h_0"], ["h_1"], ["h_2"]])]


def test_blocks_of_different_shape_get_different_signatures():
    graph = capture("convnet-small", batch=2)
    assert [b.layers for b in graph.blocks] == [[0, 1], [2], [3], [4], [5]]


def test_embedding_and_head_are_outside_layers(gpt):
    for name in ("wte", "wpe", "ln_f", "lm_head", "cross_entropy"):
        info = gpt.info(name)
        assert info.layer is None and info.block_signature is None
    assert gpt.info("h_2_attn_qkv").layer == 2
    assert gpt.info("h_2_attn_qkv").module_path == "h.2.attn.qkv"
    assert gpt.info("softmax_1").module_path == "h.1.attn"
    assert gpt.info("add_1").module_path == "h.0"
    rows = gpt.per_layer_table()
    assert [r.name for r in rows] == ["(before layers)", "h.0", "h.1", "h.2", "h.3",
                                      "(after layers)"]


def test_tied_lm_head_is_found_by_identity(gpt):
    assert gpt.params["lm_head.weight"].tied_to == "wte.weight"
    assert gpt.params["wte.weight"].tied_to is None
    assert [p.name for p in gpt.params.values() if p.tied_to] == ["lm_head.weight"]
    total = sum(p.numel for p in gpt.params.values())
    assert gpt.num_params == total - gpt.params["lm_head.weight"].numel
    assert gpt.info("lm_head").params == ["lm_head.weight"]
    assert gpt.info("h_0_attn_qkv").params == ["h.0.attn.qkv.weight", "h.0.attn.qkv.bias"]
    untied = capture("llama-tiny", batch=1)
    assert not any(p.tied_to for p in untied.params.values())
    tied = capture("llama-tiny:tie_embeddings=true", batch=1)
    assert tied.params["output.weight"].tied_to == "tok_embeddings.weight"


def test_every_node_is_annotated(gpt):
    for node, info in gpt.nodes():
        assert node.meta["fxplan"] is info is gpt.info(node)
        assert info.op_class in OP_CLASSES
    assert gpt.info("h_0_mlp_fc1").shape == (2, 64, 256)
    assert gpt.info("h_0_mlp_fc1").dtype == torch.float32
    assert gpt.info("split").shape == ((2, 64, 64),) * 3
    assert gpt.info("size").shape is None


UNNUMBERED = __import__("os").path.join(__import__("os").path.dirname(__file__), "models",
                                        "unnumbered_blocks.py")


@pytest.mark.parametrize("function, method, layers, names, per_layer", [
    ("build", "symbolic_trace", 3, ["block_a", "block_b", "block_c"], 5),
    ("build", "export", 3, ["block_a", "block_b", "block_c"], None),
    ("build_functional", "symbolic_trace", 4, [f"graph-layer-{i}" for i in range(4)], 9),
])
def test_blocks_found_from_graph_structure(function, method, layers, names, per_layer):
    """No numbered layer container: the layers are the repeated segments between cuts of the
    parameter-dependent stream, named by their common module path, and the capture says so."""
    graph = capture(f"{UNNUMBERED}:{function}", method=method)
    assert graph.block_method == "graph structure"
    assert len(graph.blocks) == 1
    block = graph.blocks[0]
    assert block.layers == list(range(layers))
    assert [graph.layer_names[i] for i in block.layers] == names
    sizes = {len(n) for n in block.nodes_per_layer}
    assert len(sizes) == 1 and (per_layer is None or sizes == {per_layer})
    # every parameter of a layer is read inside it; the embedding and head are outside
    for layer, nodes in zip(block.layers, block.nodes_per_layer):
        params = {p for n in nodes for p in graph.info(n).params}
        if function == "build":
            assert params and all(p.startswith(names[layer] + ".") for p in params), params
        else:
            assert params == {f"w1.{layer}", f"w2.{layer}"}, params


def test_numbered_containers_are_the_module_hierarchy_method(gpt):
    assert gpt.block_method == "module hierarchy"
    assert capture("mlp-small", batch=2).block_method == "module hierarchy"


def test_no_repeats_no_blocks():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    graph = capture(model, inputs=torch.zeros(2, 4))
    assert graph.blocks == [] and graph.block_method == "none"
