"""Priced placements: a tensor-parallel layout read from an intra-op solution, edge by edge.

``ParallelConfig.placements`` carries the solver's answer as one map of placement strings on
the ``(dp, tp)`` stage mesh (or the tp token alone), with three kinds of key:

    ``node``             the placement of ``node``'s output
    ``node<producer``    the placement ``node`` needs of its input ``producer`` (listed where it
                         differs from ``producer``'s output; fx names never contain ``<``)
    ``param:name``       the placement of parameter ``name``

A map with an edge or a parameter key is *priced* here (a map of outputs alone keeps the
rules of :mod:`cost_model.megatron_layout`). Only the tp token matters; a missing output is
``R``. For node ``v`` with activation inputs ``u`` (``π`` the tp placements)::

    dst_u   = π(v<u) if given, else π(u)                  what v reads
    split_v = π(v) ∈ {S, P}  or  some dst_u ∈ {S, P}      v's work is divided over tp
    state_v = SHARD if π(v) = S(d) else REPL              (CONST as in the default layout)
    saves_v split  ⇔  some u with state_u = SHARD or dst_u = S(d)

The compute of a split node is ``1/t`` (:func:`cost_model.layer_costs._divisor`); every edge
with ``π(u) ≠ dst_u`` is a :class:`PricedEdge`, priced forward and backward by
:func:`cost_model.edge_reshard.edge_collectives` (``reshard_cost`` on the tp axis), so the
estimate prices exactly the reshards the intra-op solver priced. A saved tensor is split when
the node reads a sharded producer or a sharded input (Megatron's sequence-parallel linear
saves its sharded input and gathers it again in the backward, Korthikanti et al. 2022).
A tensor needs a gradient when a parameter is among its ancestors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from fxplan.cost_model.megatron_layout import CONST, REPL, SHARD, TPLayout, tp_placement, used_params
from fxplan.core.placements import Placement, Replicate, Shard

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["PARAM_PREFIX", "PricedEdge", "build_priced", "edge_key", "is_priced"]

PARAM_PREFIX = "param:"


@dataclass(frozen=True)
class PricedEdge:
    """``producer``'s output moves from ``src`` to ``dst`` (tp placements) before its consumer."""

    producer: str
    src: Placement
    dst: Placement
    consumer_split: bool
    requires_grad: bool


def edge_key(consumer: str, producer: str) -> str:
    """The map key of what ``consumer`` needs of ``producer``."""
    return f"{consumer}<{producer}"


def is_priced(placements: Mapping[str, str]) -> bool:
    """Whether ``placements`` names edges or parameters (module docstring)."""
    return any("<" in key or key.startswith(PARAM_PREFIX) for key in placements)


def build_priced(graph: CapturedGraph, placements: Mapping[str, str]) -> TPLayout:
    """The :class:`TPLayout` of priced placements (module docstring)."""
    tp = {key: tp_placement(text) for key, text in placements.items()}
    out = {key: p for key, p in tp.items() if "<" not in key and not key.startswith(PARAM_PREFIX)}
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
        dst = {a: tp.get(edge_key(node.name, a), out.get(a, Replicate())) for a in acts}
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
    params = frozenset(key[len(PARAM_PREFIX):] for key, p in tp.items()
                       if key.startswith(PARAM_PREFIX) and isinstance(p, Shard))
    empty: frozenset[str] = frozenset()
    return TPLayout(state, empty, empty, empty, empty, frozenset(saves), params, inputs,
                    priced=True, split=frozenset(split), edges=edges)
