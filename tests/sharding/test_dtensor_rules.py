"""Options read from DTensor's registered strategies for ATen ops without a decorator rule:
elementwise comparisons and ``&``, ``cumsum``, ``index``, ``new_ones``, decomposed ops; an op
DTensor lacks stays a reported replicate fallback; where both sources cover an op they agree
(the decorator rules are a subset of DTensor's for the matmul family: no ``Partial`` factor)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from fxplan.api import capture
from fxplan.intra_op.build import op_graph
from fxplan.sharding import node_strategies
from fxplan.sharding.api import rule_sources
from fxplan.sharding.dtensor_rules import cache_info, dtensor_options
from fxplan.sharding.expand import expand_options
from torch_versions import dtensor_tables_of_2_13


def _exported(module: nn.Module, **inputs: torch.Tensor) -> dict:
    """Node name → NodeStrategies on a 1-axis mesh of 2, for a ``torch.export`` capture."""
    graph = capture(module, inputs=inputs, method="export")
    ops = {n.name: node_strategies(graph.gm, n, (2,)) for n in graph.gm.graph.nodes}
    return {name: op for name, op in ops.items() if op is not None}


def _table(op) -> set[str]:
    return {str(s) for s in op.strategies}


class _Masks(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x == y) & (x != 0)


@dtensor_tables_of_2_13
def test_comparisons_and_bitwise_and_follow_their_inputs_from_dtensor() -> None:
    ops = _exported(_Masks(), x=torch.zeros(4, 6, dtype=torch.long), y=torch.zeros(6, dtype=torch.long))
    eq, ne, conj = ops["eq"], ops["ne"], ops["and_1"]
    assert (eq.rule, ne.rule, conj.rule) == ("dtensor:aten.eq.Tensor", "dtensor:aten.ne.Scalar",
                                             "dtensor:aten.__and__.Tensor")
    assert not (eq.fallback or ne.fallback or conj.fallback)
    assert _table(eq) == {"R, R -> R", "S(0), R -> S(0)", "S(1), S(0) -> S(1)"}  # y broadcast
    assert _table(ne) == {"R -> R", "S(0) -> S(0)", "S(1) -> S(1)"}  # never P: not linear
    assert _table(conj) == {"R, R -> R", "S(0), S(0) -> S(0)", "S(1), S(1) -> S(1)"}


class _Scan(nn.Module):
    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.cumsum(1), x[ids], x.new_ones(4, 6)


@dtensor_tables_of_2_13
def test_cumsum_index_and_new_ones_from_dtensor() -> None:
    ops = _exported(_Scan(), x=torch.zeros(4, 6), ids=torch.zeros(2, 8, dtype=torch.long))
    assert ops["cumsum"].rule == "dtensor:aten.cumsum.default"
    assert _table(ops["cumsum"]) == {"R -> R", "S(0) -> S(0)"}  # never the scanned dim
    # x[ids]: an embedding-like lookup; ids sharded (batch/sequence) or columns of x, or a
    # partial x (a lookup is linear in the table); never the indexed rows of x
    assert _table(ops["index"]) == {"R, R -> R", "R, S(0) -> S(0)", "R, S(1) -> S(1)",
                                    "S(1), R -> S(2)", "P, R -> P"}
    # new_ones reads only its input's dtype and device: any input placement gives R, and a
    # sharded input gives an output sharded alike (DTensor localises the size argument)
    assert {"R -> R", "P -> R", "S(0) -> S(0)", "S(1) -> S(1)"} <= _table(ops["new_ones"])


class _Padded(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, 1), value=-100.0).diff(dim=0)


@dtensor_tables_of_2_13
def test_composite_ops_take_dtensor_through_their_decomposition() -> None:
    ops = _exported(_Padded(), x=torch.zeros(4, 5))  # padded to (4, 6), diff (3, 6)
    assert ops["pad"].rule == "dtensor:aten.pad.default"
    assert _table(ops["pad"]) == {"R -> R", "S(0) -> S(0)"}  # padded dim whole; -100 kills P
    assert _table(ops["diff"]) == {"R -> R", "S(1) -> S(1)", "P -> P"}  # differences are linear


@torch.library.custom_op("fxplan_test::mystery", mutates_args=())
def _mystery(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@_mystery.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class _Mystery(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.fxplan_test.mystery(x) + torch.arange(6)


def test_an_op_dtensor_lacks_stays_a_reported_replicate_fallback() -> None:
    graph = capture(_Mystery(), inputs={"x": torch.zeros(4, 6)}, method="export")
    ops = [node_strategies(graph.gm, n, (2,)) for n in graph.gm.graph.nodes]
    lacking = {str(op.ctx.node.target): op for op in ops if op is not None and op.fallback}
    assert set(lacking) == {"fxplan_test.mystery.default", "aten.arange.default"}
    assert all(_table(op) in ({"R -> R"}, {" -> R"}) for op in lacking.values())
    listed = op_graph(graph, (2,)).fallbacks
    assert len(listed) == 2 and all("no sharding rule, replicated" in line for line in listed)
    sources = rule_sources(graph.gm)
    assert set(sources["fallback"]) == {"fxplan_test.mystery.default", "aten.arange.default"}


class _Both(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor, x: torch.Tensor,
                c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.mm(a, b), torch.addmm(bias, a, b), torch.bmm(x, x.transpose(1, 2)),
                torch.softmax(x, dim=-1), x + c, x * c, x / c, x.sum(1), x.view(4, 64))


@dtensor_tables_of_2_13
def test_dtensor_agrees_with_the_decorator_rules_where_both_cover_an_op() -> None:
    graph = capture(_Both(), inputs=dict(a=torch.zeros(8, 16), b=torch.zeros(16, 32), bias=torch.zeros(32),
                                         x=torch.zeros(4, 8, 8), c=torch.zeros(8)), method="export")
    compared = {}
    for node in graph.gm.graph.nodes:
        op = node_strategies(graph.gm, node, (2,))
        if op is None or node.op != "call_function":
            continue
        derived = dtensor_options(op.ctx)
        assert derived is not None and op.source == "rule"  # the decorator rule keeps priority
        theirs = {str(s) for s in expand_options(derived, (2,), op.ctx.shapes, op.ctx.out)}
        compared[str(node.target).split(".")[1]] = (_table(op), theirs)
    assert {"mm", "addmm", "bmm", "softmax", "add", "mul", "div", "sum", "view"} <= set(compared)
    for name in ("softmax", "add", "mul", "div", "sum", "view", "transpose"):
        mine, theirs = compared[name]
        assert mine == theirs, name
    # matmuls: DTensor also passes one Partial factor through (a product is linear in each)
    assert compared["mm"][1] - compared["mm"][0] == {"P, R -> P", "R, P -> P"}
    assert compared["bmm"][1] - compared["bmm"][0] == {"P, R -> P", "R, P -> P"}
    assert compared["addmm"][1] - compared["addmm"][0] == {"P, P, R -> P", "P, R, P -> P"}
    for name in ("mm", "addmm", "bmm"):
        assert compared[name][0] < compared[name][1]


@dtensor_tables_of_2_13
def test_queries_are_cached_per_op_shapes_and_constants() -> None:
    _exported(_Masks(), x=torch.zeros(4, 6, dtype=torch.long), y=torch.zeros(6, dtype=torch.long))
    before = cache_info()
    _exported(_Masks(), x=torch.zeros(4, 6, dtype=torch.long), y=torch.zeros(6, dtype=torch.long))
    after = cache_info()
    assert after["misses"] == before["misses"] and after["hits"] >= before["hits"] + 3


LLAMA = ("hf:llama:num_hidden_layers=2,hidden_size=64,intermediate_size=128,"
         "num_attention_heads=4,num_key_value_heads=4,vocab_size=128")


@dtensor_tables_of_2_13
def test_a_tiny_hf_llama_has_fewer_fallbacks_with_dtensor_strategies(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    graph = capture(LLAMA, batch=8, seq=16)
    with_dtensor = op_graph(graph, (4,)).fallbacks
    import fxplan.sharding.api as api

    monkeypatch.setattr(api, "dtensor_options", lambda ctx: None)
    without = op_graph(graph, (4,)).fallbacks
    names = lambda lines: {line.split(" ")[0] for line in lines}  # noqa: E731
    assert names(with_dtensor) < names(without)
    assert {"eq", "ne", "and", "cumsum", "index", "new_ones", "diff", "pad"} <= names(without) - names(with_dtensor)
