"""From a captured graph to the numeric :class:`~fxplan.intra_op.problem.Problem`.

1. every tensor node gets its strategies from the sharding rules (:mod:`fxplan.sharding`);
2. nodes of repeated layers are mapped to their representative (:mod:`.blocks`);
3. each representative becomes a problem node priced ``count ×`` the cost model's node price;
4. each producer→consumer operand becomes an edge priced by the cost model's reshard price,
   summed over every occurrence (within a layer ``L`` times, across layers ``L − 1`` times);
5. a parameter shared by several modules (a tied embedding and LM head) links its users: the
   placement the owner stores it in is resharded for every other user (forward and gradient).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch.fx

from fxplan.passes.captured_graph import CapturedGraph
from fxplan.intra_op.blocks import layer_representatives, representatives
from fxplan.intra_op.costs import CostModel
from fxplan.intra_op.problem import Problem
from fxplan.sharding.api import NodeStrategies, is_tensor_node, node_strategies, same_role
from fxplan.sharding.context import OpContext, Operand, make_context
from fxplan.sharding.strategy import OpStrategy

__all__ = ["OpGraph", "op_graph", "BuiltProblem", "build_problem"]


@dataclass
class OpGraph:
    """The tensor nodes of a graph with their strategies, in graph order."""

    ops: list[NodeStrategies]
    index: dict[str, int]
    requires_grad: list[bool]
    rep: list[int]

    @property
    def fallbacks(self) -> list[str]:
        """One line per op without a sharding rule: ``arange ×5 (arange, arange_1, …):
        no sharding rule, replicated`` (the nodes are all replicated, whatever the mesh)."""
        nodes: dict[str, list[str]] = {}
        for op in self.ops:
            if op.fallback:
                nodes.setdefault(_op_name(op.ctx.op), []).append(op.name)
        return [f"{op}{f' ×{len(names)}' if len(names) > 1 else ''} "
                f"({', '.join(names[:3])}{', …' if len(names) > 3 else ''}): "
                f"no sharding rule, replicated" for op, names in nodes.items()]


def _op_name(op: object) -> str:
    return getattr(op, "__name__", str(op))


def _tensor_nodes(graph: CapturedGraph) -> list[tuple[torch.fx.Node, OpContext, str | None]]:
    """Every tensor node of ``graph`` in order, with its context and the name of its layer
    representative (:func:`~fxplan.intra_op.blocks.layer_representatives`) where the two
    share a role (:func:`~fxplan.sharding.api.same_role`), else ``None``. None of it depends
    on the mesh: made once per graph (``graph.memo``) for the solves of every tp degree."""
    key = ("intra_op", "tensor_nodes")
    if key not in graph.memo:
        names = layer_representatives(graph)
        contexts: dict[str, OpContext] = {}
        nodes = []
        for node in graph.gm.graph.nodes:
            if not is_tensor_node(node):
                continue
            ctx = contexts[node.name] = make_context(graph.gm, node)
            like = names.get(node.name)
            nodes.append((node, ctx, like if like in contexts and like != node.name
                          and same_role(contexts[like], ctx) else None))
        graph.memo[key] = nodes
    return graph.memo[key]


def op_graph(graph: CapturedGraph, mesh_shape: Sequence[int]) -> OpGraph:
    """Strategies of every tensor node on a mesh of ``mesh_shape``, and which need gradients
    (a node sharing its representative's role shares its strategy list)."""
    ops: list[NodeStrategies] = []
    index: dict[str, int] = {}
    grad: list[bool] = []
    names = layer_representatives(graph)
    for node, ctx, like in _tensor_nodes(graph):
        if like is None:
            op = node_strategies(graph.gm, node, mesh_shape, ctx=ctx)
        else:
            base = ops[index[like]]
            op = NodeStrategies(ctx, base.strategies, base.rule, base.follows, base.fallback)
        index[node.name] = len(ops)
        owns = any(o.param for o in op.ctx.operands) or op.ctx.param is not None
        grad.append(owns or any(o.producer is not None and o.producer.name in index
                                and grad[index[o.producer.name]] for o in op.ctx.operands))
        ops.append(op)
    return OpGraph(ops, index, grad, representatives(ops, names))


@dataclass
class BuiltProblem:
    """The problem plus what is needed to read its answer: ``nodes[k]`` is the op index of
    problem node ``k``; ``compute[k][s]`` its compute seconds (all occurrences)."""

    problem: Problem
    nodes: list[int]
    compute: list[np.ndarray]
    followers: dict[int, int] = field(default_factory=dict)


def _matrix(cost: CostModel, graph: OpGraph, u: int, v: int, slot: int, follow: bool) -> np.ndarray:
    """Edge prices between every strategy of ``u`` (its output) and of ``v`` (operand ``slot``)."""
    operand = graph.ops[v].ctx.operands[slot]
    srcs = [s.output for s in graph.ops[u].strategies]
    dsts = [(s.inputs[slot], s.split) for s in graph.ops[v].strategies]
    return _priced(cost, operand, srcs, dsts, graph.requires_grad[u], follow)


def _priced(cost: CostModel, operand: Operand, srcs: list, dsts: list, grad: bool,
            follow: bool = False) -> np.ndarray:
    """Prices over the distinct source and destination placements, spread back to strategies.

    ``follow``: the consumer follows its producer — a source placement that some destination
    takes as it is is offered only those destinations (the rest are left infinite, unpriced);
    a source no destination takes gets every reshard priced.
    """
    usrc = list(dict.fromkeys(srcs))
    udst = list(dict.fromkeys(dsts))
    table = np.full((len(usrc), len(udst)), np.inf)
    for a, src in enumerate(usrc):
        same = [b for b, (dst, _) in enumerate(udst) if dst == src] if follow else []
        for b in same or range(len(udst)):
            table[a, b] = cost.edge_price(operand, src, udst[b][0], udst[b][1], grad)
    rows = {p: a for a, p in enumerate(usrc)}
    cols = {p: b for b, p in enumerate(udst)}
    return table[np.ix_([rows[p] for p in srcs], [cols[p] for p in dsts])]


def _owned_params(graph: CapturedGraph, op: NodeStrategies) -> list[int]:
    """Operand indices of parameters this node pays for (a tied alias's owner pays)."""
    return [i for i, o in enumerate(op.ctx.operands)
            if o.param is not None and (o.param not in graph.params or graph.params[o.param].tied_to is None)]


def _tie_edges(graph: CapturedGraph, opg: OpGraph, cost: CostModel) -> list[tuple[int, int, np.ndarray]]:
    users: dict[str, list[tuple[int, int]]] = {}
    for i, op in enumerate(opg.ops):
        for slot, o in enumerate(op.ctx.operands):
            if o.param is not None:
                info = graph.params.get(o.param)
                users.setdefault(info.tied_to or o.param if info else o.param, []).append((i, slot))
    edges = []
    for uses in users.values():
        (owner, oslot), others = uses[0], uses[1:]
        for user, uslot in others:
            operand = opg.ops[owner].ctx.operands[oslot]
            srcs = [s.inputs[oslot] for s in opg.ops[owner].strategies]
            dsts = [(s.inputs[uslot], s.split) for s in opg.ops[user].strategies]
            edges.append((owner, user, _priced(cost, operand, srcs, dsts, True)))
    return edges


def _followers(opg: OpGraph, producers: dict[int, set[int]]) -> dict[int, int]:
    """Follow-the-producer ops (unary, one producer over all their occurrences) → producer."""
    return {v: next(iter(ps)) for v, ps in producers.items()
            if len(ps) == 1 and opg.ops[v].follows and len(opg.ops[v].ctx.operands) == 1}


def build_problem(graph: CapturedGraph, opg: OpGraph, cost: CostModel,
                  memory_budget: float | None = None, follow: bool = True) -> BuiltProblem:
    """The problem of the module docstring over the representatives of ``opg``; with
    ``follow``, follow-the-producer edges are priced only where the follower takes its
    producer's placement as it is (see :func:`_priced`), and reported in ``followers``."""
    count = Counter(opg.rep)
    reps = sorted(count)
    where = {r: k for k, r in enumerate(reps)}
    problem = Problem(memory_budget=memory_budget)
    compute = []
    for r in reps:
        op = opg.ops[r]
        owned = _owned_params(graph, op)
        prices = [cost.node_price(op, s, requires_grad=opg.requires_grad[r], owned_params=owned)
                  for s in op.strategies]
        problem.add_node(op.name, [count[r] * p.total_s for p in prices],
                         [count[r] * p.memory_bytes for p in prices])
        compute.append(np.array([count[r] * p.compute_s for p in prices]))
    uses: Counter = Counter()
    producers: dict[int, set[int]] = {}
    for v, op in enumerate(opg.ops):
        for slot, o in enumerate(op.ctx.operands):
            if o.producer is not None and o.producer.name in opg.index:
                u = opg.index[o.producer.name]
                uses[(opg.rep[u], opg.rep[v], slot)] += 1
                producers.setdefault(opg.rep[v], set()).add(opg.rep[u])
    followers = _followers(opg, producers) if follow else {}
    for (u, v, slot), n in uses.items():
        problem.add_edge(where[u], where[v], n * _matrix(cost, opg, u, v, slot, followers.get(v) == u))
    for owner, user, matrix in _tie_edges(graph, opg, cost):
        problem.add_edge(where[opg.rep[owner]], where[opg.rep[user]], matrix)
    return BuiltProblem(problem, reps, compute, {where[v]: where[u] for v, u in followers.items()})


def strategy_of(opg: OpGraph, built: BuiltProblem, choice: Sequence[int]) -> dict[str, OpStrategy]:
    """Every tensor node's chosen strategy (layers take their representative's)."""
    chosen = {r: choice[k] for k, r in enumerate(built.nodes)}
    return {op.name: op.strategies[chosen[opg.rep[i]]] for i, op in enumerate(opg.ops)}
