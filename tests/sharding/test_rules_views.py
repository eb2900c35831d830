"""Views and selections propagate sharded dims: reshape by prefix products, transpose and
permute with their dims, slices and narrows only on whole dims, split interleaved, cat."""

from __future__ import annotations

import torch
import torch.nn as nn

from fxplan.sharding import describe_module
from fxplan.sharding.rules.indexing import INTERLEAVED
from fxplan.sharding.rules.views import reshape_dim_map


def test_reshape_dim_map_pairs_dims_with_equal_prefix_products() -> None:
    assert reshape_dim_map((8, 64, 256), (8, 64, 4, 64)) == {0: 0, 1: 1, 2: 2}  # hidden → heads
    assert reshape_dim_map((8, 64, 4, 64), (8, 64, 256)) == {0: 0, 1: 1, 2: 2}  # heads → hidden
    assert reshape_dim_map((8, 64, 512), (512, 512)) == {0: 0, 2: 1}  # the sequence merges away
    assert reshape_dim_map((6, 4), (4, 6)) == {0: 0}  # outermost runs are contiguous
    assert reshape_dim_map((1, 8, 3), (8, 3)) == {1: 0, 2: 1}  # size-1 dims never shard


class _Heads(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        y = x.view(b, t, 4, c // 4).transpose(1, 2)
        return y.permute(0, 2, 1, 3).reshape(b * t, c)


def test_view_transpose_permute_move_the_shard_with_its_dim() -> None:
    table = describe_module(_Heads(), (4,), x=(8, 16, 32))
    assert set(table["view"]) == {"R -> R", "P -> P", "S(0) -> S(0)", "S(1) -> S(1)", "S(2) -> S(2)"}
    assert "S(2) -> S(1)" in table["transpose"] and "S(1) -> S(2)" in table["transpose"]
    assert "S(1) -> S(2)" in table["permute"] and "S(3) -> S(3)" in table["permute"]
    assert set(table["reshape"]) == {"R -> R", "P -> P", "S(0) -> S(0)", "S(2) -> S(1)"}


class _Select(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        half = x[..., 8:]
        row = x[:, 0]
        widened = x[:, None]
        return half, row, widened, x.narrow(1, 0, 4), x.narrow(2, 0, 16)


def test_slices_and_narrows_keep_only_whole_dims_shardable() -> None:
    table = describe_module(_Select(), (2,), x=(4, 6, 16))
    assert set(table["getitem"]) == {"R -> R", "P -> P", "S(0) -> S(0)", "S(1) -> S(1)"}
    assert set(table["getitem_1"]) == {"R -> R", "P -> P", "S(0) -> S(0)", "S(2) -> S(1)"}
    assert "S(1) -> S(2)" in table["getitem_2"] and "S(2) -> S(3)" in table["getitem_2"]
    assert "S(1) -> S(1)" not in table["narrow"]  # a partial narrow of dim 1
    assert "S(2) -> S(2)" in table["narrow_1"]  # narrowed to its full length: the identity


class _Split(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).split(16, dim=2)
        return torch.cat([q, k], dim=-1) + torch.cat([v, v], dim=-1)


def test_split_of_the_sharded_dim_is_interleaved_and_cat_keeps_other_dims() -> None:
    from fxplan.api import capture
    from fxplan.sharding import node_strategies

    graph = capture(_Split(), inputs={"x": torch.empty(2, 8, 16, device="meta")})
    split = next(n for n in graph.gm.graph.nodes if n.target == "split")
    strategies = node_strategies(graph.gm, split, (4,)).strategies
    interleaved = [s for s in strategies if str(s) == "S(2) -> S(2)"]
    assert interleaved and interleaved[0].notes == (INTERLEAVED,)
    assert not [s for s in node_strategies(graph.gm, split, (32,)).strategies if str(s) == "S(2) -> S(2)"]
    table = describe_module(_Split(), (4,), x=(4, 8, 16))
    assert set(table["cat"]) == {"R, R -> R", "P, P -> P", "S(0), S(0) -> S(0)", "S(1), S(1) -> S(1)"}
