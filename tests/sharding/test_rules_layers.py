"""Layer rules: pointwise with broadcasting and linearity, norms, softmax, attention (GQA),
embedding (vocab-parallel → Partial), cross-entropy (vocab-parallel loss), conv and pooling."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from fxplan.sharding import describe_module


class _Pointwise(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        y = F.gelu(x + bias) * 2.0
        return self.drop(y) * x - (-y)


def test_pointwise_follows_broadcasts_and_passes_partial_only_when_linear() -> None:
    table = describe_module(_Pointwise(), (4,), x=(8, 16), bias=(16,))
    assert set(table["add"]) == {"R, R -> R", "S(0), R -> S(0)", "S(1), S(0) -> S(1)", "P, P -> P"}
    assert "P -> P" not in table["gelu"] and "P -> P" not in table["drop"]  # non-linear
    assert "P -> P" in table["mul"]  # scaling by a constant is linear
    assert {"P, R -> P", "R, P -> P"} <= set(table["mul_1"])  # a product: one partial factor
    assert "P, P -> P" in table["sub"] and "P -> P" in table["neg"]


class _Norms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.rms = nn.RMSNorm([8, 16])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softmax(self.rms(self.ln(x)), dim=1)


def test_norms_and_softmax_never_shard_the_normalised_dims() -> None:
    table = describe_module(_Norms(), (4,), x=(4, 8, 16))
    assert set(table["ln"]) == {"R, R, R -> R", "S(0), R, R -> S(0)", "S(1), R, R -> S(1)"}
    assert set(table["rms"]) == {"R, R -> R", "S(0), R -> S(0)"}
    assert set(table["softmax"]) == {"R -> R", "S(0) -> S(0)", "S(2) -> S(2)"}


class _Attention(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def test_attention_shards_batch_or_heads_with_grouped_query_heads() -> None:
    table = describe_module(_Attention(), (2,), q=(4, 8, 16, 4), k=(4, 2, 16, 4), v=(4, 2, 16, 4))
    assert set(table["scaled_dot_product_attention"]) == {
        "R, R, R -> R", "S(0), S(0), S(0) -> S(0)", "S(1), S(1), S(1) -> S(1)"}
    four = describe_module(_Attention(), (4,), q=(4, 8, 16, 4), k=(4, 2, 16, 4), v=(4, 2, 16, 4))
    assert "S(1), S(1), S(1) -> S(1)" not in four["scaled_dot_product_attention"]  # 2 kv heads / 4


class _Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(64, 16)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.wte(tokens) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, 64), targets.view(-1))


def test_embedding_and_loss_offer_vocabulary_parallelism() -> None:
    from fxplan.api import capture
    from fxplan.sharding import node_strategies

    inputs = {"tokens": torch.zeros(4, 8, dtype=torch.long, device="meta"),
              "targets": torch.zeros(4, 8, dtype=torch.long, device="meta")}
    graph = capture(_Embed(), inputs=inputs)
    ops = {n.name: node_strategies(graph.gm, n, (4,)) for n in graph.gm.graph.nodes}
    embed = {str(s) for s in ops["wte"].strategies}
    assert {"R, S(0) -> P", "R, S(1) -> S(2)", "S(0), R -> S(0)", "S(1), R -> S(1)"} <= embed
    loss = {str(s): s for s in ops["cross_entropy"].strategies}
    assert set(loss) == {"R, R -> R", "S(0), S(0) -> P", "S(1), R -> R"}
    (stats,) = loss["S(1), R -> R"].comms[0]
    assert stats.kind == "all_reduce" and stats.count == 3 and stats.drop_dims == (1,)


class _Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.pool(F.relu(self.bn(self.conv(x)))), 1)


def test_conv_batchnorm_pool_shard_batch_or_channels() -> None:
    table = describe_module(_Conv(), (2,), x=(4, 8, 8, 8))
    assert set(table["conv"]) == {"R, R, R -> R", "S(0), R, R -> S(0)", "R, S(0), S(0) -> S(1)",
                                  "S(1), S(1), R -> P"}
    assert set(table["bn"]) == {"R, R, R -> R", "S(1), S(0), S(0) -> S(1)", "S(0), R, R -> S(0)"}
    assert set(table["pool"]) == {"R -> R", "S(0) -> S(0)", "S(1) -> S(1)"}
    assert "S(1) -> S(1)" in table["flatten"]
