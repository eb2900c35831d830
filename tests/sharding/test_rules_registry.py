"""The registry: decorator registration, module classes through their MRO, the logged
replicate fallback, expansion over a mesh, and full coverage of the example models."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn

from fxplan.api import capture
from fxplan.intra_op.build import op_graph
from fxplan.sharding import (AxisOption, OpContext, describe, describe_module, find_rule,
                              node_strategies, register_rule)
from fxplan.sharding.expand import divides, expand_options
from fxplan.sharding.strategy import P, R, S


def _swish_like(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def _unruled(x: torch.Tensor) -> torch.Tensor:
    return x.cumsum(0)


torch.fx.wrap("_swish_like")
torch.fx.wrap("_unruled")


class _Custom(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _swish_like(x)


class _Unruled(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _unruled(x)


class _MyLinear(nn.Linear):
    """A subclass: found through the MRO."""


def test_an_op_without_rule_is_replicated_logged_and_listed(caplog: pytest.LogCaptureFixture) -> None:
    graph = capture(_Unruled(), inputs={"x": torch.empty(4, 8, device="meta")})
    node = next(n for n in graph.gm.graph.nodes if n.op == "call_function")
    with caplog.at_level(logging.DEBUG, logger="fxplan.sharding.registry"):
        op = node_strategies(graph.gm, node, (4,))
    assert op.fallback and op.rule == "replicate_fallback"
    assert [str(s) for s in op.strategies] == ["R -> R"]
    assert "no sharding rule" in caplog.text
    listed = op_graph(graph, (4,)).fallbacks  # reported once per op, with its nodes
    assert len(listed) == 1 and "no sharding rule, replicated" in listed[0]


def test_register_rule_adds_an_op_in_one_short_function() -> None:
    @register_rule(_swish_like, follows=True)
    def swish_rule(ctx: OpContext) -> list[AxisOption]:
        return [AxisOption((R,), R)] + [AxisOption((S(d),), S(d)) for d in range(ctx.operands[0].ndim)]

    table = describe_module(_Custom(), (4,), x=(4, 8))
    assert set(table["_swish_like"]) == {"R -> R", "S(0) -> S(0)", "S(1) -> S(1)"}
    with pytest.raises(ValueError, match="already has rule"):
        register_rule(_swish_like)(lambda ctx: [])


def test_module_subclasses_share_their_base_rule() -> None:
    assert find_rule(_MyLinear).name == find_rule(nn.Linear).name == "linear_rule"


def test_expansion_checks_divisibility_and_collapses_size_one_axes() -> None:
    options = [AxisOption((R,), R), AxisOption((S(0),), S(0)), AxisOption((P,), P)]
    assert divides((8, 6), (S(0), S(0)), (2, 4)) and not divides((8, 6), (S(1), R), (4, 1))
    two = {str(s) for s in expand_options(options, (2, 4), [(8,)], (8,))}
    assert "S(0)S(0) -> S(0)S(0)" in two and len(two) == 9
    assert {str(s) for s in expand_options(options, (1, 4), [(6,)], (6,))} == {"RR -> RR", "RP -> RP"}


@pytest.mark.parametrize("spec,seq", [("gpt-tiny", 16), ("llama-tiny", 16), ("mlp-small", None),
                                      ("convnet-small", None),
                                      ("gpt:layers=1,hidden=64,heads=4,vocab=128,seq=16,attention=sdpa", 16)])
def test_every_op_of_the_example_models_has_a_rule(spec: str, seq: int | None) -> None:
    graph = capture(spec, batch=4, seq=seq)
    table = describe(graph.gm, (2, 2))
    fallbacks = [n for n in graph.gm.graph.nodes if n.name in table
                 and node_strategies(graph.gm, n, (2, 2)).fallback]
    assert fallbacks == []
    assert all(table.values())
