"""The numeric placement problem every intra-op backend solves.

A :class:`Problem` is a graph of ``n`` decision nodes. Node ``v`` picks one of its ``K_v``
strategies ``s_v``; the price of a choice ``s = (s_0 … s_{n-1})`` is

    cost(s)   = Σ_v c_v[s_v] + Σ_{(u,v) ∈ E} R_uv[s_u, s_v]
    memory(s) = Σ_v m_v[s_v]

with ``c_v`` the node's own cost (compute plus the communication the strategy implies), ``R_uv``
the price of every (producer strategy, consumer strategy) pair on an edge (reshards), and
``m_v`` the bytes the strategy keeps resident. A choice is feasible when every chosen price is
finite and ``memory(s) ≤ memory_budget``. The backends minimise ``cost`` over feasible choices.

The problem is purely numeric: which placements a strategy index stands for is kept by the
caller (:mod:`fxplan.intra_op.build`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

__all__ = ["Edge", "Problem", "IntraOpInfeasible", "IntraOpTimeLimit"]


class IntraOpInfeasible(ValueError):
    """No strategy choice fits: the error shows the smallest memory any choice needs."""


class IntraOpTimeLimit(RuntimeError):
    """The solver's time limit ended before it found any feasible choice."""


@dataclass
class Edge:
    """Pairwise price ``cost[i, j]`` of ``u`` choosing ``i`` while ``v`` chooses ``j``."""

    u: int
    v: int
    cost: np.ndarray

    def __post_init__(self) -> None:
        self.cost = np.asarray(self.cost, dtype=float)
        if self.u == self.v:
            raise ValueError(f"edge ({self.u}, {self.v}) is a self-loop; fold it into the node cost")


@dataclass
class Problem:
    """See the module docstring; ``add_edge`` merges parallel edges by summing their prices."""

    names: list[str] = field(default_factory=list)
    node_cost: list[np.ndarray] = field(default_factory=list)
    node_memory: list[np.ndarray] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    memory_budget: float | None = None
    constant: float = 0.0
    _edge_index: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)

    # -- building ---------------------------------------------------------------------
    def add_node(self, name: str, cost: Sequence[float], memory: Sequence[float] | None = None) -> int:
        cost_arr = np.asarray(cost, dtype=float)
        if cost_arr.ndim != 1 or cost_arr.size == 0:
            raise ValueError(f"node {name!r} needs a 1-D, non-empty cost vector, got shape {cost_arr.shape}")
        mem_arr = np.zeros_like(cost_arr) if memory is None else np.asarray(memory, dtype=float)
        if mem_arr.shape != cost_arr.shape:
            raise ValueError(
                f"node {name!r}: {cost_arr.size} costs but {mem_arr.size} memory entries"
            )
        self.names.append(name)
        self.node_cost.append(cost_arr)
        self.node_memory.append(mem_arr)
        return len(self.names) - 1

    def add_edge(self, u: int, v: int, cost: np.ndarray) -> None:
        """Add ``cost[i, j]`` for (``u`` = i, ``v`` = j); parallel edges are summed."""
        cost = np.asarray(cost, dtype=float)
        expected = (self.num_strategies(u), self.num_strategies(v))
        if cost.shape != expected:
            raise ValueError(f"edge {self.names[u]}→{self.names[v]}: cost shape {cost.shape} ≠ {expected}")
        if u == v:
            self.node_cost[u] = self.node_cost[u] + np.diag(cost)
            return
        key, oriented = ((u, v), cost) if u < v else ((v, u), cost.T)
        if key in self._edge_index:
            edge = self.edges[self._edge_index[key]]
            edge.cost = edge.cost + oriented
        else:
            self._edge_index[key] = len(self.edges)
            self.edges.append(Edge(key[0], key[1], oriented))

    # -- queries ----------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self.names)

    def num_strategies(self, v: int) -> int:
        return int(self.node_cost[v].size)

    def neighbours(self) -> list[list[int]]:
        adj: list[list[int]] = [[] for _ in self.names]
        for edge in self.edges:
            adj[edge.u].append(edge.v)
            adj[edge.v].append(edge.u)
        return adj

    def evaluate(self, choice: Sequence[int]) -> tuple[float, float]:
        """``(cost(s), memory(s))`` of a full choice; ``inf`` cost if a chosen price is."""
        cost = self.constant + sum(float(c[s]) for c, s in zip(self.node_cost, choice, strict=True))
        cost += sum(float(e.cost[choice[e.u], choice[e.v]]) for e in self.edges)
        memory = sum(float(m[s]) for m, s in zip(self.node_memory, choice))
        return cost, memory

    def min_memory(self) -> float:
        """A lower bound on the memory of any choice: each node at its smallest footprint."""
        return float(sum(m[np.isfinite(c)].min(initial=np.inf) for c, m in zip(self.node_cost, self.node_memory)))

    def check_budget(self) -> None:
        """Raise :class:`IntraOpInfeasible` when no choice can fit the budget, with the sum."""
        if self.memory_budget is None:
            return
        need = self.min_memory()
        if need > self.memory_budget:
            raise IntraOpInfeasible(
                f"no placement fits: the smallest footprint of every node sums to "
                f"{need / 2**30:.3f} GiB > memory budget {self.memory_budget / 2**30:.3f} GiB"
            )

    def budget_binding(self) -> bool:
        """True when the budget can cut off some choice (Σ_v max_s m_v[s] > budget)."""
        if self.memory_budget is None:
            return False
        worst = sum(float(m.max()) for m in self.node_memory)
        return worst > self.memory_budget

    def chain_order(self) -> list[list[int]] | None:
        """The path components of the edge graph in order, or ``None`` if it is not a
        disjoint union of paths (each node at most two neighbours, no cycle)."""
        adj = self.neighbours()
        if any(len(a) > 2 for a in adj):
            return None
        seen = [False] * self.num_nodes
        paths: list[list[int]] = []
        for start in range(self.num_nodes):
            if seen[start] or len(adj[start]) == 2:
                continue
            path, prev, cur = [], -1, start
            while cur != -1:
                seen[cur] = True
                path.append(cur)
                nxt = [w for w in adj[cur] if w != prev]
                prev, cur = cur, (nxt[0] if nxt else -1)
            paths.append(path)
        return paths if all(seen) else None  # unseen nodes lie on a cycle

    def edge_between(self, u: int, v: int) -> np.ndarray | None:
        """``R_uv`` oriented (u rows, v columns), or ``None``."""
        key = (min(u, v), max(u, v))
        if key not in self._edge_index:
            return None
        cost = self.edges[self._edge_index[key]].cost
        return cost if u < v else cost.T

    def size_summary(self) -> str:
        pairs = sum(e.cost.size for e in self.edges)
        strategies = sum(self.num_strategies(v) for v in range(self.num_nodes))
        return f"{self.num_nodes} nodes, {strategies} strategies, {len(self.edges)} edges ({pairs} pairs)"
