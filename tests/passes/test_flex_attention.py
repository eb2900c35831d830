"""FlexAttention is captured on a CPU host as the fused attention it is on the cluster's
devices (no CPU backward kernel runs; ``fxplan.passes.flex_attention``) and the search plans it
for a GPU cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from fxplan.api import capture, search

pytest.importorskip("torch.nn.attention.flex_attention")
MODEL = f"{Path(__file__).resolve().parents[1] / 'runtime' / 'models' / 'flex_style.py'}:build"


def test_flex_attention_is_captured_as_fused_attention_and_planned_for_gpus():
    import torch.nn.attention.flex_attention as flex

    hop = flex.flex_attention_hop
    graph = capture(MODEL, batch=2)
    assert flex.flex_attention_hop is hop   # torch given back as it was
    attention = [info for node, info in graph.nodes()
                 if "scaled_dot_product_attention" in str(node.target)]
    assert len(attention) == 2 and all(a.op_class == "attention" for a in attention)
    # dense (the mask's sparsity is not a shape): QKᵀ and P·V, 2·2·B·H·L·L·d each layer
    assert attention[0].flops == 2 * 2 * 2 * 4 * 128 * 128 * 8
    assert graph.num_params == sum(p.numel() for p in graph.module.parameters())
    plan = search(MODEL, "dgx-a100-80g", batch=8, progress=False)
    assert plan.world_size == 8
