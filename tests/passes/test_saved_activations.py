"""Saved activations of a GPT layer equal Korthikanti et al. (2022), "Reducing Activation
Recomputation in Large Transformer Models", eq. (1): per layer, 16-bit precision, explicit
("math") attention, dropout on:

    34·s·b·h + 5·a·s²·b bytes

    layernorm inputs 4sbh, QKV input 2sbh, Q and K 4sbh, softmax output 2as²b, dropout mask
    as²b, dropout output 2as²b, V 2sbh, projection input 2sbh, projection dropout mask sbh,
    fc1 input 2sbh, GeLU input 8sbh, fc2 input 8sbh, MLP dropout mask sbh.

The formula leaves out O(s·b) terms; the only extra bytes allowed here are the two layer
norms' saved mean and rstd: 2 norms × 2 tensors × s·b elements × (2 or 4 bytes).
"""

from __future__ import annotations

import pytest
import torch

from fxplan.api import capture

S, B, H, A = 32, 3, 48, 4
SPEC = f"gpt:layers=3,hidden={H},heads={A},vocab=128,seq={S},dropout=0.1,attention=math"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpt_layer_saves_korthikanti_bytes(dtype):
    graph = capture(SPEC, batch=B, dtype=dtype)
    formula = 34 * S * B * H + 5 * A * S * S * B
    per_layer = graph.saved_bytes_by_layer()
    for layer in range(3):
        extra = per_layer[layer] - formula
        assert extra >= 0 and extra % (S * B) == 0 and extra <= 2 * 2 * S * B * 4, (layer, extra)


def test_each_term_lands_on_the_op_that_saves_it():
    graph = capture(SPEC, batch=B, dtype=torch.bfloat16)
    sbh, as2b = S * B * H, A * S * S * B
    saved = {node.name: info.saved_bytes for node, info in graph.nodes()}
    expect = {
        "h_0_attn_qkv": 2 * sbh,          # QKV input
        "matmul": 4 * sbh,                # Q and K
        "softmax": 2 * as2b,              # softmax output
        "h_0_attn_attn_drop": as2b,       # attention dropout mask (1-byte bool)
        "matmul_1": 2 * as2b + 2 * sbh,   # dropout output and V
        "h_0_attn_proj": 2 * sbh,         # projection input
        "h_0_attn_resid_drop": sbh,       # projection dropout mask
        "h_0_mlp_fc1": 2 * sbh,           # fc1 input
        "h_0_mlp_act": 8 * sbh,           # GeLU input
        "h_0_mlp_fc2": 8 * sbh,           # fc2 input
        "h_0_mlp_drop": sbh,              # MLP dropout mask
    }
    for name, value in expect.items():
        assert saved[name] == value, name
    for norm in ("h_0_ln1", "h_0_ln2"):  # input 2sbh + mean and rstd, O(sb)
        assert 2 * sbh < saved[norm] <= 2 * sbh + 2 * S * B * 4


def test_parameters_and_buffers_are_never_activations():
    graph = capture("gpt-tiny", batch=1)
    assert graph.info("masked_fill").saved_bytes == 0  # the causal mask is a buffer
    assert graph.info("lm_head").saved_bytes == 1 * 64 * 64 * 4  # its input, not the weight


def test_a_storage_saved_again_names_its_later_savers():
    """A storage is charged once, to its first saver; the nodes that save it again are noted
    there: the Llama's three projections keep one normed input, and its fused attention's
    output is the storage its out-projection keeps as input (a view of it)."""
    graph = capture("llama-tiny:layers=1", batch=2, seq=16, dtype=torch.float32)
    shared = {node.name: info.saved_shared for node, info in graph.nodes() if info.saved_shared}
    hidden_bytes = 2 * 16 * graph.info("layers_0_attention_wq").shape[-1] * 4
    assert shared["layers_0_attention_wq"] == ((hidden_bytes, ("layers_0_attention_wk",
                                                               "layers_0_attention_wv")),)
    assert shared["scaled_dot_product_attention"] == ((hidden_bytes, ("layers_0_attention_wo",)),)
    assert graph.info("layers_0_attention_wo").saved_bytes == 0  # charged to the attention
    gpt = capture("gpt-tiny:layers=1,attention=sdpa", batch=2, seq=16, dtype=torch.float32)
    assert not any(info.saved_shared for _, info in gpt.nodes())  # its output is copied
