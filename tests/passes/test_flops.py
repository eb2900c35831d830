"""Per-node FLOP rules agree with torch's FlopCounterMode on real CPU runs."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from fxplan.examples.model_spec import resolve_model
from fxplan.api import capture


def _measured_forward_flops(spec: str, batch: int) -> int:
    torch.manual_seed(0)
    bundle = resolve_model(spec)
    model = bundle.build(device="cpu").eval()
    inputs = {k: torch.randint(0, 8, s.shape) if not s.dtype.is_floating_point
              else torch.randn(s.shape) for k, s in bundle.example_inputs(batch).items()}
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(**inputs)
    return counter.get_total_flops()


def test_llama_matmul_flops_equal_flop_counter():
    """No biases in Llama: the projections' FLOPs agree exactly. FlopCounterMode has no
    formula for the CPU flash-attention kernel, so attention is checked against
    ``2·(b·heads·s)·s·(d + d)`` (QKᵀ and P·V; grouped K/V heads do not reduce the work)."""
    graph = capture("llama-tiny", batch=2)
    projections = sum(i.flops for _, i in graph.nodes() if i.op_class == "matmul")
    assert projections == _measured_forward_flops("llama-tiny", 2)
    config = resolve_model("llama-tiny").config
    b, s, d = 2, config.seq, config.head_dim
    attention = [i for _, i in graph.nodes() if i.op_class == "attention"]
    assert len(attention) == config.layers
    assert all(i.flops == 2 * (b * config.heads * s) * s * (d + d) for i in attention)


def test_gpt_and_convnet_matmul_flops_match_flop_counter_plus_biases():
    """FlopCounterMode leaves out bias additions; the rules count them (numel(out) each)."""
    for spec in ("gpt-tiny", "convnet-small"):
        graph = capture(spec, batch=2)
        biases = sum(_numel(i.shape) for _, i in graph.nodes()
                     if i.op_class in ("matmul", "conv") and any(p.endswith(".bias")
                                                                 for p in i.params))
        assert graph.forward_matmul_flops - biases == _measured_forward_flops(spec, 2), spec


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def test_rules_price_linear_views_and_embeddings():
    graph = capture("gpt-tiny", batch=2)
    qkv = graph.info("h_0_attn_qkv")
    b, s, h = 2, 64, 64
    assert qkv.flops == 2 * b * s * h * 3 * h + b * s * 3 * h  # 2·M·N·K + bias
    assert qkv.bytes_written == b * s * 3 * h * 4
    assert graph.info("transpose").op_class == "view" and graph.info("transpose").bytes_read == 0
    wte = graph.info("wte")
    assert wte.op_class == "embedding" and wte.flops == 0
    assert wte.bytes_read == b * s * h * 4 + b * s * 8  # gathered rows + indices, not the table
    assert graph.info("contiguous").op_class == "elementwise"  # a real copy
    assert graph.unpriced_ops == {}


def test_functional_embedding_reads_gathered_rows_not_the_table():
    class Functional(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(1000, 16))

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.embedding(idx, self.table)

    idx = torch.zeros(2, 5, dtype=torch.long)
    functional = capture(Functional(), inputs=idx)
    module = capture(torch.nn.Embedding(1000, 16), inputs=idx)
    (f_info,) = [i for _, i in functional.nodes() if i.op_class == "embedding"]
    (m_info,) = [i for _, i in module.nodes() if i.op_class == "embedding"]
    expected = 2 * 5 * 16 * 4 + 2 * 5 * 8  # gathered rows + indices
    assert f_info.bytes_read == m_info.bytes_read == expected
    assert f_info.bytes_written == m_info.bytes_written == 2 * 5 * 16 * 4
