r"""Graph coarsening: fewer decision nodes, same kind of problem.

Merging node ``v`` into node ``u`` ties ``v``'s strategy to ``u``'s by a map
``j*(i) = argmin_j ( R_uv[i, j] + c_v[j] )`` (ties: least memory), then

    c_u[i] += R_uv[i, j*(i)] + c_v[j*(i)]          m_u[i] += m_v[j*(i)]
    R_uw[i, :] += R_vw[j*(i), :]                   for every other neighbour w of v

and removes ``v``. Two uses:

* **leaf elimination** (:func:`coarsen`, always): a node with a single neighbour and, when
  the memory budget can bind, a memory that does not depend on its strategy. Exact — the
  leaf's best reply to each strategy of its neighbour is all that can matter. Graph inputs,
  buffers and their index arithmetic disappear this way.
* **follow-the-producer merging** (``followers``): an elementwise op or a view that follows its
  single producer. A heuristic, as in Alpa: the follower's reply to its producer is fixed
  before its consumers are known (almost always the reshard-free one).

Merged nodes are expanded back by :meth:`Coarsened.expand`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np

from fxplan.intra_op.problem import Problem

__all__ = ["Coarsened", "coarsen"]


@dataclass
class Coarsened:
    """The coarse problem and how to map its choice back onto the original nodes."""

    problem: Problem
    kept: list[int]  # original index of each coarse node
    owner: dict[int, tuple[int, np.ndarray]] = field(default_factory=dict)  # v -> (u, j*)

    def expand(self, choice: Iterable[int]) -> tuple[int, ...]:
        full: dict[int, int] = dict(zip(self.kept, choice))

        def pick(v: int) -> int:
            if v not in full:
                u, reply = self.owner[v]
                full[v] = int(reply[pick(u)])
            return full[v]

        return tuple(pick(v) for v in range(len(self.kept) + len(self.owner)))


class _Work:
    """Mutable adjacency form of a problem while nodes are merged."""

    def __init__(self, problem: Problem) -> None:
        self.cost = [c.copy() for c in problem.node_cost]
        self.memory = [m.copy() for m in problem.node_memory]
        self.adj: list[dict[int, np.ndarray]] = [dict() for _ in problem.names]
        for e in problem.edges:
            self.adj[e.u][e.v] = e.cost
            self.adj[e.v][e.u] = e.cost.T
        self.alive = [True] * problem.num_nodes
        self.owner: dict[int, tuple[int, np.ndarray]] = {}

    def merge(self, v: int, u: int) -> None:
        r_uv = self.adj[u].get(v, np.zeros((self.cost[u].size, self.cost[v].size)))
        total = r_uv + self.cost[v][None, :]
        best = np.min(total, axis=1, keepdims=True)
        # least memory among the cheapest replies
        tied = np.where(total <= best + 1e-12 * np.maximum(1.0, np.abs(best)), self.memory[v][None, :], np.inf)
        reply = np.argmin(tied, axis=1)
        rows = np.arange(reply.size)
        self.cost[u] = self.cost[u] + total[rows, reply]
        self.memory[u] = self.memory[u] + self.memory[v][reply]
        for w, r_vw in list(self.adj[v].items()):
            del self.adj[w][v]
            if w == u:
                continue
            moved = r_vw[reply, :]
            self.adj[u][w] = self.adj[u].get(w, 0.0) + moved
            self.adj[w][u] = self.adj[u][w].T
        self.adj[v] = {}
        self.alive[v] = False
        self.owner[v] = (u, reply)


def _eliminate_leaves(work: _Work, binding: bool) -> None:
    stack = [v for v in range(len(work.alive)) if len(work.adj[v]) == 1]
    while stack:
        v = stack.pop()
        if not work.alive[v] or len(work.adj[v]) != 1:
            continue
        if binding and np.ptp(work.memory[v]) > 0:
            continue
        (u,) = work.adj[v]
        work.merge(v, u)
        if len(work.adj[u]) == 1:
            stack.append(u)


def coarsen(problem: Problem, followers: Mapping[int, int] | None = None) -> Coarsened:
    """Merge ``followers`` (node → its producer, in topological order) and eliminate leaves."""
    work = _Work(problem)
    for v, u in (followers or {}).items():
        while not work.alive[u]:
            u = work.owner[u][0]
        if work.alive[v] and u != v:
            work.merge(v, u)
    _eliminate_leaves(work, problem.budget_binding())
    kept = [v for v in range(problem.num_nodes) if work.alive[v]]
    index = {v: k for k, v in enumerate(kept)}
    coarse = Problem(memory_budget=problem.memory_budget, constant=problem.constant)
    for v in kept:
        coarse.add_node(problem.names[v], work.cost[v], work.memory[v])
    for v in kept:
        for w, cost in work.adj[v].items():
            if v < w:
                coarse.add_edge(index[v], index[w], cost)
    result = Coarsened(coarse, kept, dict(work.owner))
    return result
