"""Hugging Face mixtures of experts (Mixtral, Qwen2-MoE) through ``hf:``: sizes, capture, plan."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import fxplan  # noqa: E402
from fxplan.examples.hf_presets import HF_PRESETS  # noqa: E402
from fxplan.examples.model_spec import resolve_model  # noqa: E402
from fxplan.examples.param_counts import hf_params  # noqa: E402

MIXTRAL = ("hf:mixtral:num_hidden_layers=2,hidden_size=64,intermediate_size=96,"
           "num_attention_heads=4,num_key_value_heads=2,num_local_experts=4,vocab_size=256,"
           "max_position_embeddings=64")
QWEN = ("hf:qwen2_moe:num_hidden_layers=3,hidden_size=64,intermediate_size=128,"
        "moe_intermediate_size=32,shared_expert_intermediate_size=48,num_attention_heads=4,"
        "num_key_value_heads=2,num_experts=4,num_experts_per_tok=2,vocab_size=256,"
        "max_position_embeddings=64,decoder_sparse_step=2")


def _numel(spec: str) -> int:
    return sum(p.numel() for p in resolve_model(spec).build().parameters())


@pytest.mark.parametrize("name, published", [
    ("mixtral-8x7b", 46.7e9), ("qwen1.5-moe-a2.7b", 14.3e9),
])
def test_presets_are_their_published_size(name, published):
    assert hf_params(HF_PRESETS[name]) == pytest.approx(published, rel=0.005)


@pytest.mark.parametrize("spec", [MIXTRAL, QWEN])
def test_formula_matches_transformers(spec):
    bundle = resolve_model(spec)
    from fxplan.examples.hf_presets import HFPreset

    values = {k: v for k, v in bundle.config.to_dict().items()}
    assert hf_params(HFPreset(bundle.config.model_type, values)) == _numel(spec)


@pytest.mark.parametrize("spec, moe_layers", [(MIXTRAL, 2), (QWEN, 1)])
def test_captures_with_layers_and_prices_the_experts(spec, moe_layers):
    graph = fxplan.capture(spec, batch=2, seq=16, dtype=torch.bfloat16)
    layers = int(spec.split('num_hidden_layers=')[1].split(',')[0])
    assert sorted(graph.layer_names) == list(range(layers))
    assert graph.num_params == _numel(spec)
    grouped = [info for node, info in graph.nodes()
               if "grouped_mm" in str(node.target) and info.op_class == "matmul"]
    assert len(grouped) >= 2 * moe_layers and all(info.flops > 0 for info in grouped)
    assert "grouped_mm" not in graph.unpriced_ops


def test_mixtral_plans_on_local_cpu_with_expert_parallelism():
    from fxplan.cost_model.parallel.expert_parallel import moe_layers

    graph = fxplan.capture(MIXTRAL, batch=1, seq=16, dtype=torch.float32)
    (layer,) = moe_layers(graph).values()          # both layers share one signature
    assert layer.experts == 4 and layer.dispatch_bytes == 16 * 2 * 64 * 4   # k·T rows of h, fp32
    plan = fxplan.search(graph, "local-cpu:devices=2", batch=4, seq=16, constraints={"ep": 2})
    assert plan.estimate["step_time_s"] > 0 and plan.config.ep == 2
    assert plan.config.dp * plan.config.pp * plan.config.tp == 2
