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
    # with dropout the call runs as the GPU's flash kernel (FusedAttentionDropout), whose
    # output is laid out as its query: the transposition back is a view, the projection's input
    gpt = capture("gpt-tiny:layers=1,attention=sdpa,dropout=0.1", batch=2, seq=16,
                  dtype=torch.float32)
    o_bytes = 2 * 16 * gpt.info("h_0_attn_proj").shape[-1] * 4
    assert gpt.info("scaled_dot_product_attention").saved_shared == (
        (o_bytes, ("h_0_attn_proj",)),)


class _Attention(torch.nn.Module):
    """q, k and v made from the input by three weights, then attention with dropout, under a
    boolean mask where one is given (else causal)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = x * self.w[0], x * self.w[1], x * self.w[2]
        if mask is None:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.1,
                                                                    is_causal=True)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                dropout_p=0.1)


@pytest.mark.parametrize("masked", [False, True], ids=["flash", "efficient"])
def test_attention_with_dropout_saves_what_the_gpus_kernel_saves(masked):
    """The CPU's composite kernel would keep the s×s probabilities and mask per head; the GPU's
    fused kernel keeps q, k, v, the output, an fp32 log-sum-exp per query row and its random
    state, plus the additive bias a mask becomes (one per sample, broadcast over the heads)."""
    from fxplan.passes.fake_run import fake_run

    b, a, s, d = 2, 4, 256, 16
    inputs: list[torch.Tensor] = [torch.empty(b, a, s, d, dtype=torch.bfloat16)]
    if masked:
        inputs.append(torch.ones(b, 1, s, s, dtype=torch.bool).tril())
    gm = torch.fx.symbolic_trace(_Attention(d), concrete_args=None if masked else {"mask": None})
    run = fake_run(gm, inputs, dtype=torch.bfloat16)
    node = next(n for n in gm.graph.nodes if "scaled_dot_product" in str(n.target))
    saved = run.infos[node.name].saved_bytes
    tensor = b * a * s * d * 2
    kept = 4 * tensor + b * a * s * 4 + (b * s * s * 2 if masked else 0)
    assert kept <= saved <= kept + 64, (saved, kept)   # + the random state's few bytes
    assert saved < b * a * s * s * 2                     # not one s×s tensor per head
