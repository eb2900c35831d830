"""The mixture-of-experts GPT: routing, capacity, auxiliary loss, sizes and capture."""

from __future__ import annotations

import math

import pytest
import torch

from fxplan.examples.families import FAMILIES
from fxplan.examples.model_spec import resolve_model
from fxplan.examples.models import moe
from fxplan.examples.models.moe import MoEConfig, MoEGPT, MoELayer, expert_capacity
from fxplan.examples.param_counts import family_params
from fxplan.examples.presets import PRESETS


def _config(**values) -> MoEConfig:
    base = dict(layers=2, hidden=16, heads=2, vocab=32, seq=8, experts=4, top_k=2,
                dropout=0.0)
    return MoEConfig(**{**base, **values})


@pytest.mark.parametrize("values", [
    PRESETS["moe-tiny"].values,
    dict(layers=4, hidden=24, heads=2, vocab=50, seq=8, experts=3, top_k=1, moe_every=2,
         ffn_mult=3),
    dict(layers=3, hidden=16, heads=4, vocab=20, seq=4, experts=5, moe_every=3),
])
def test_param_count_matches_the_built_model(values):
    config = MoEConfig(**values)
    with torch.device("meta"):
        model = MoEGPT(config)
    assert family_params("moe", config) == sum(p.numel() for p in model.parameters())


def test_27b_preset_is_its_size():
    config = FAMILIES["moe"].config_cls(**PRESETS["moe-27b"].values)
    assert family_params("moe", config) == pytest.approx(27e9, rel=0.03)
    assert config.moe_layers == 8 and config.is_moe(1) and not config.is_moe(0)


def test_capacity():
    assert expert_capacity(1024, 48, 2, 1.0) == math.ceil(2 * 1024 / 48)
    assert expert_capacity(10, 4, 2, 1.25) == 7
    assert expert_capacity(3, 64, 1, 1.0) == 1       # at least one slot
    assert expert_capacity(4, 1, 2, 2.0) == 4        # never more slots than tokens


def test_gates_renormalised_and_tokens_over_capacity_dropped():
    torch.manual_seed(0)
    layer = MoELayer(_config(capacity_factor=0.5, top_k=1))
    with torch.no_grad():  # every token prefers expert 2
        layer.router.weight.zero_()
        layer.router.weight[2] = 1.0
    x = torch.ones(1, 8, 16) + 0.01 * torch.randn(1, 8, 16)
    y = layer(x)
    capacity = expert_capacity(8, 4, 1, 0.5)                        # 1 slot per expert
    served = (y.abs().sum(-1) > 0).sum().item()
    assert capacity == 1 and served == capacity                     # the other 7 are dropped
    # top-2 with ample capacity: every token served, its two gates summing to one
    layer2 = MoELayer(_config(capacity_factor=4.0))
    x2 = torch.randn(2, 4, 16)
    probs = torch.softmax(layer2.router(x2.reshape(8, 16)), -1)
    top, idx = probs.topk(2, -1)
    gate = top / top.sum(-1, keepdim=True)
    expected = torch.zeros(8, 16)
    for t in range(8):
        for j in range(2):
            e = idx[t, j]
            ex = layer2.experts
            h = torch.nn.functional.gelu(x2.reshape(8, 16)[t] @ ex.w1[e] + ex.b1[e, 0])
            expected[t] += gate[t, j] * (h @ ex.w2[e] + ex.b2[e, 0])
    torch.testing.assert_close(layer2(x2).reshape(8, 16), expected, rtol=1e-4, atol=1e-5)


def test_load_balancing_loss_is_switch_formula():
    uniform = torch.full((8, 4), 0.25)
    balanced = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2]] * 2)
    assert moe.load_balancing_loss(uniform, balanced, 4).item() == pytest.approx(1.0)
    skewed = torch.zeros(8, 4)
    skewed[:, 0] = 1.0
    one_expert = torch.zeros(8, 1, dtype=torch.int64)
    assert moe.load_balancing_loss(skewed, one_expert, 4).item() == pytest.approx(4.0)


def test_auxiliary_loss_joins_the_gradient(monkeypatch):
    """∇ of the model's loss = ∇ of (loss without the hook + coef · Σ aux)."""
    torch.manual_seed(0)
    config = _config(aux_loss_coef=0.5)
    model = MoEGPT(config)
    tokens = torch.randint(0, 32, (2, 8))
    model(tokens, tokens).backward()
    with_hook = {n: p.grad.clone() for n, p in model.named_parameters()}
    auxes: list[torch.Tensor] = []

    def collect(x, aux, coef):
        auxes.append(coef * aux)
        return x

    monkeypatch.setattr(moe, "add_auxiliary_loss", collect)
    model.zero_grad()
    (model(tokens, tokens) + sum(auxes)).backward()
    assert len(auxes) == 2
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, with_hook[name], rtol=1e-5, atol=1e-7, msg=name)
    assert with_hook["h.0.mlp.router.weight"].abs().sum() > 0
    assert model.h[0].mlp.last_aux_loss is not None


def test_tiny_moe_trains_on_cpu():
    torch.manual_seed(0)
    bundle = resolve_model("moe-tiny")
    model = bundle.build(device="cpu")
    tokens = torch.randint(0, 512, (2, 16))
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        optim.zero_grad()
        loss = model(tokens, tokens)
        loss.backward()
        optim.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_captures_with_symbolic_trace_and_counts_expert_flops():
    import fxplan

    graph = fxplan.capture("moe-tiny:moe_every=2,layers=4", batch=2)
    assert graph.method == "symbolic_trace"
    assert not graph.unpriced_ops
    config = MoEConfig(**{**PRESETS["moe-tiny"].values, "moe_every": 2, "layers": 4})
    assert graph.num_params == family_params("moe", config)
    tokens, h, f = 2 * config.seq, config.hidden, config.ffn_hidden
    c = expert_capacity(tokens, config.experts, config.top_k, config.capacity_factor)
    bmm = sum(info.flops for node, info in graph.nodes()
              if info.op_class == "matmul" and "experts" in (info.module_path or ""))
    assert bmm == config.moe_layers * 2 * (2 * config.experts * c * h * f)
    layers = sorted({info.layer for _, info in graph.nodes() if info.layer is not None})
    assert layers == [0, 1, 2, 3]
