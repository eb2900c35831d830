"""Tensor-parallel layout of a captured graph: which tensors are split over the ``tp`` ranks.

**Default (Megatron) layout**, derived from the graph's dataflow, never from names. Every
node gets a state: ``CONST`` (parameters, buffers, what is computed from them alone),
``REPL`` (full-size on every tp rank: the residual stream) or ``SHARD`` (split over tp).
In graph order:

- a placeholder is ``REPL``; a ``get_attr``, a node with no activation input and a node
  whose value is not a tensor (``x.size(1)``) ``CONST``;
- a *linear* (a ``matmul`` node owning a 2-D weight) whose input is ``REPL`` is
  **column-parallel**: its weight and bias are split, its output is ``SHARD``; in the
  backward the gradient of its input is all-reduced over tp;
- a linear whose input is ``SHARD`` is **row-parallel**: its weight is split (the bias is
  not), its output is a partial sum all-reduced in the forward, ``REPL`` again;
- an embedding looked up with activation indices is **vocab-parallel** (weight split by
  rows, output all-reduced, ``REPL``); one looked up with constant indices (positions)
  is replicated;
- any other node is ``SHARD`` if an activation input is, else ``REPL``: the attention core
  and the activation between the two linears are split, layer norms, dropouts after the
  projections and residual adds are not.

With sequence parallelism the ``REPL`` activations are split along the sequence instead
of being replicated; the all-reduces become a reduce-scatter (forward) and an all-gather
(the backward of it), and the column-parallel inputs are all-gathered (Korthikanti et al.,
2022, §4.2.2).

A saved tensor is split if the node that saves it reads a ``SHARD`` activation (a linear
saves its input, softmax its output — the same state, a dropout its mask); under sequence
parallelism every saved activation is split.

**Explicit placements** (``ParallelConfig.placements``, a
:class:`~fxplan.core.placements.PlacementMap` on the ``(dp, tp)`` mesh or on ``tp`` alone: its
node outputs) override the state of the nodes they name (``S(d)`` on
tp → ``SHARD``, ``R`` → ``REPL``, ``P`` → a partial sum, all-reduced to ``REPL`` like a
row-parallel output); a node that turns a ``SHARD`` input into a ``REPL`` output without
being a reduction point all-gathers its output. These maps name outputs only; a map that
also names what each consumer needs of its inputs and the parameters' placements (the
intra-op solver's answer) is priced edge by edge instead (:mod:`cost_model.parallel.priced_layout`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from fxplan.core.placements import Partial, Placement, Replicate, Shard

if TYPE_CHECKING:  # pragma: no cover
    import torch.fx

    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["CONST", "REPL", "SHARD", "TPLayout", "megatron_tp_layout", "used_params"]

CONST, REPL, SHARD = 0, 1, 2


@dataclass(frozen=True, eq=False)
class TPLayout:
    """Per-node tensor-parallel roles (module docstring); node and parameter names."""

    state: Mapping[str, int]
    column: frozenset[str]
    row: frozenset[str]
    vocab: frozenset[str]
    gathers: frozenset[str]
    saves_sharded: frozenset[str]
    sharded_params: frozenset[str]
    #: Activation inputs of each node (node names), ``CONST`` inputs left out.
    inputs: Mapping[str, tuple[str, ...]]
    #: Priced placements only (:mod:`cost_model.parallel.priced_layout`): nodes whose work is split
    #: over tp, and per consumer the edges whose tp placement changes.
    priced: bool = False
    split: frozenset[str] = frozenset()
    edges: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    def is_sharded(self, name: str) -> bool:
        return self.state.get(name) == SHARD

    def is_activation(self, name: str) -> bool:
        return self.state.get(name, CONST) != CONST


def used_params(node: torch.fx.Node, graph: CapturedGraph) -> list[str]:
    """Parameters a node uses: its own (``call_module``) and those of its ``get_attr`` inputs,
    also when read through views of the parameter alone (the core ATen lowering's
    ``aten.mm(x, aten.t(weight))``)."""
    names = list(graph.info(node).params)
    for arg in node.all_input_nodes:
        while (arg.op == "call_function" and graph.info(arg).op_class == "view"
               and len(arg.all_input_nodes) == 1):
            arg = arg.all_input_nodes[0]
        if arg.op == "get_attr":
            names += graph.info(arg).params
    return names


def _weight(names: list[str], graph: CapturedGraph) -> str | None:
    for name in names:
        if len(graph.params[name].shape) == 2:
            return name
    return None


def _tp_state(tp: Placement) -> int | str:
    """State of a tp placement: SHARD, REPL or 'P'."""
    if isinstance(tp, Shard):
        return SHARD
    if isinstance(tp, Replicate):
        return REPL
    if isinstance(tp, Partial):
        return "P"
    raise ValueError(f"unknown placement {tp!r}")


def megatron_tp_layout(graph: CapturedGraph, placements: Mapping[str, Placement]) -> TPLayout:
    """The default layout with the tp placements ``placements`` (node → tp entry) imposed."""
    state: dict[str, int] = {}
    inputs: dict[str, tuple[str, ...]] = {}
    column, row, vocab, gathers, saves, sharded_params = set(), set(), set(), set(), set(), set()
    for node in graph.gm.graph.nodes:
        info = graph.info(node)
        acts = tuple(a.name for a in node.all_input_nodes if state.get(a.name, CONST) != CONST)
        inputs[node.name] = acts
        any_sharded = any(state[a] == SHARD for a in acts)
        if any_sharded:
            saves.add(node.name)
        params = used_params(node, graph)
        weight = _weight(params, graph) if params else None
        if node.op == "placeholder":
            s = REPL
        elif node.op == "get_attr" or not acts or info.shape is None:
            s = CONST
        elif info.op_class == "matmul" and weight is not None:
            if any_sharded:
                row.add(node.name)
                sharded_params.add(weight)  # the bias is added after the reduction: whole
                s = REPL
            else:
                column.add(node.name)
                sharded_params.update(params)
                s = SHARD
        elif info.op_class == "embedding" and weight is not None:
            vocab.add(node.name)
            sharded_params.add(weight)
            s = REPL
        else:
            s = SHARD if any_sharded else REPL
        given = placements.get(node.name)
        if given is not None and s != CONST:
            explicit = _tp_state(given)
            if explicit == "P":
                row.add(node.name)
                explicit = REPL
            elif explicit == REPL and any_sharded and node.name not in row:
                gathers.add(node.name)
            if explicit == SHARD and not any_sharded and weight is not None:
                column.add(node.name)
            s = explicit
        state[node.name] = s
    return TPLayout(state, frozenset(column), frozenset(row - gathers), frozenset(vocab),
                    frozenset(gathers), frozenset(saves), frozenset(sharded_params), inputs)
