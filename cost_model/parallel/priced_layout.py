"""Priced placements: a tensor-parallel layout read from an intra-op solution, edge by edge.

``ParallelConfig.placements`` carries the solver's answer as one
:class:`~fxplan.core.placements.PlacementMap` on the ``(dp, tp)`` stage mesh (or on tp alone):

    ``nodes[v]``                the placements of ``v``'s output
    ``inputs[DataEdge(v, u)]``  what ``v`` needs of its input ``u`` (listed where it differs
                                from ``u``'s output)
    ``params[name]``            the placements of parameter ``name``

A map with inputs or parameters is *priced* here (a map of outputs alone keeps the rules of
:mod:`cost_model.parallel.megatron_layout`). Only the tp entry (the last) matters; a missing output is
``R``. For node ``v`` with activation inputs ``u`` (``π`` the tp placements)::

    dst_u   = π(DataEdge(v, u)) if given, else π(u)       what v reads
    split_v = π(v) ∈ {S, P}  or  some dst_u ∈ {S, P}      v's work is divided over tp
    state_v = SHARD if π(v) = S(d) else REPL              (CONST as in the default layout)
    saves_v split  ⇔  some u with state_u = SHARD or dst_u = S(d)

The compute of a split node is ``1/t`` (:func:`cost_model.step.layer_costs.work_divisor`); every edge
with ``π(u) ≠ dst_u`` is a :class:`PricedEdge`, priced forward and backward by
:func:`cost_model.comm.edge_reshard.edge_collectives` (``reshard_cost`` on the tp axis), so the
estimate prices exactly the reshards the intra-op solver priced. A saved tensor is split when
the node reads a sharded producer or a sharded input (Megatron's sequence-parallel linear
saves its sharded input and gathers it again in the backward, Korthikanti et al. 2022).
A tensor needs a gradient when a parameter is among its ancestors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fxplan.core.placements import DataEdge, Placement, PlacementMap, Replicate, Shard
from fxplan.cost_model.parallel.megatron_layout import CONST, REPL, SHARD, TPLayout, used_params

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["PricedEdge", "build_priced", "is_priced"]


@dataclass(frozen=True)
class PricedEdge:
    """``producer``'s output moves from ``src`` to ``dst`` (tp placements) before its consumer."""

    producer: str
    src: Placement
    dst: Placement
    consumer_split: bool
    requires_grad: bool


def is_priced(placements: PlacementMap) -> bool:
    """Whether ``placements`` names inputs or parameters (module docstring)."""
    return bool(placements.inputs or placements.params)


def build_priced(graph: CapturedGraph, placements: PlacementMap) -> TPLayout:
    """The :class:`TPLayout` of priced placements (module docstring)."""
    out = {name: p[-1] for name, p in placements.nodes.items()}
    needs = {edge: p[-1] for edge, p in placements.inputs.items()}
    state: dict[str, int] = {}
    inputs: dict[str, tuple[str, ...]] = {}
    split, saves, grad = set(), set(), set()
    edges: dict[str, tuple[PricedEdge, ...]] = {}
    for node in graph.gm.graph.nodes:
        info = graph.info(node)
        acts = tuple(a.name for a in node.all_input_nodes if state.get(a.name, CONST) != CONST)
        inputs[node.name] = acts
        if node.op == "placeholder":
            state[node.name] = REPL
            continue
        if node.op == "get_attr" or not acts or info.shape is None:
            state[node.name] = CONST
            continue
        mine = out.get(node.name, Replicate())
        state[node.name] = SHARD if isinstance(mine, Shard) else REPL
        dst = {a: needs.get(DataEdge(node.name, a), out.get(a, Replicate())) for a in acts}
        is_split = not isinstance(mine, Replicate) or any(not isinstance(d, Replicate)
                                                          for d in dst.values())
        if is_split:
            split.add(node.name)
        if used_params(node, graph) or any(a in grad for a in acts):
            grad.add(node.name)
        if any(state[a] == SHARD or isinstance(d, Shard) for a, d in dst.items()):
            saves.add(node.name)
        moved = tuple(PricedEdge(a, out.get(a, Replicate()), d, is_split, a in grad)
                      for a, d in dst.items() if d != out.get(a, Replicate()))
        if moved:
            edges[node.name] = moved
    params = frozenset(name for name, p in placements.params.items() if isinstance(p[-1], Shard))
    empty: frozenset[str] = frozenset()
    return TPLayout(state, empty, empty, empty, empty, frozenset(saves), params, inputs,
                    priced=True, split=frozenset(split), edges=edges)
