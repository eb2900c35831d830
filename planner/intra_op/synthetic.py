"""Random placement problems shaped like captured graphs, for tests and the backend benchmark.

* :func:`random_chain` — ``n`` nodes in a line, ``K`` strategies each.
* :func:`random_dag` — a chain plus a skip edge every few nodes (the residual stream of a
  transformer), so the edge graph has cycles and the DP does not apply.

Prices mimic the planner's: node prices a compute time divided by a random shard factor plus
a little implied communication; edge prices zero on the diagonal (no reshard when the
placements agree) and a reshard-like positive price elsewhere, with a few forbidden pairs.
With ``tight_memory`` the budget sits at 15 % of the way from the smallest to the largest
footprint, so the memory row binds on most seeds.
"""

from __future__ import annotations

import numpy as np

from fxplan.intra_op.problem import Problem

__all__ = ["random_chain", "random_dag"]


def _node(problem: Problem, rng: np.random.Generator, name: str, k: int) -> int:
    shard = rng.choice([1, 2, 4, 8], size=k)
    cost = rng.uniform(1.0, 2.0) / shard + rng.uniform(0.0, 0.1, size=k)
    memory = rng.uniform(1.0, 4.0) / rng.choice([1, 2, 4, 8], size=k)  # independent of ``shard``
    return problem.add_node(name, cost, memory)


def _edge_cost(rng: np.random.Generator, ku: int, kv: int, forbid: float) -> np.ndarray:
    cost = rng.uniform(0.05, 0.5, size=(ku, kv))
    for i in range(min(ku, kv)):
        cost[i, i] = 0.0
    mask = rng.random((ku, kv)) < forbid
    mask[np.arange(min(ku, kv)), np.arange(min(ku, kv))] = False
    cost[mask] = np.inf
    return cost


def _budget(problem: Problem, tight_memory: bool) -> None:
    if tight_memory:
        low = problem.min_memory()
        high = sum(float(m.max()) for m in problem.node_memory)
        problem.memory_budget = low + 0.15 * (high - low)


def random_chain(n: int, k: int, *, seed: int = 0, tight_memory: bool = False,
                 forbid: float = 0.05) -> Problem:
    """A path of ``n`` nodes with ``k`` strategies each."""
    rng = np.random.default_rng(seed)
    problem = Problem()
    for v in range(n):
        _node(problem, rng, f"n{v}", k)
        if v:
            problem.add_edge(v - 1, v, _edge_cost(rng, k, k, forbid))
    _budget(problem, tight_memory)
    return problem


def random_dag(n: int, k: int, *, seed: int = 0, skip_every: int = 3, tight_memory: bool = False,
               forbid: float = 0.05, vary_k: bool = False) -> Problem:
    """A chain with a residual-like skip edge ``v → v + skip_every`` every ``skip_every`` nodes;
    with ``vary_k`` each node has between 1 and ``k`` strategies."""
    rng = np.random.default_rng(seed)
    problem = Problem()
    sizes = rng.integers(1, k + 1, size=n) if vary_k else np.full(n, k)
    for v in range(n):
        _node(problem, rng, f"n{v}", int(sizes[v]))
        if v:
            problem.add_edge(v - 1, v, _edge_cost(rng, int(sizes[v - 1]), int(sizes[v]), forbid))
        if v >= skip_every and v % skip_every == 0:
            u = v - skip_every
            problem.add_edge(u, v, _edge_cost(rng, int(sizes[u]), int(sizes[v]), forbid))
    _budget(problem, tight_memory)
    return problem
