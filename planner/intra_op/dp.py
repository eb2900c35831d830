r"""Exact dynamic programming for chain problems (every node with at most two neighbours,
no cycle) — the shape of coarsened transformer blocks without skip edges.

The path components are laid end to end into one sequence ``v_0 … v_{n-1}`` (a zero price
matrix stands between components), then

* without a binding memory budget, the min-plus recursion

      f_0[j] = c_0[j],   f_t[j] = c_t[j] + min_i ( f_{t-1}[i] + R_{t-1,t}[i, j] )

  gives the optimum ``min_j f_{n-1}[j]`` in ``O(n·K²)``;
* with a budget ``M``, each state ``(t, j)`` keeps the Pareto front of (memory, cost) pairs of
  the prefixes ending in ``j``: the candidates ``(μ + m_t[j], φ + R[i,j] + c_t[j])`` over every
  ``(μ, φ)`` on the fronts of ``(t−1, i)``, those over ``M − (least memory of the suffix)``
  dropped, and the dominated ones removed. The answer is the cheapest entry of the last
  fronts. Exact. To keep fronts short, a feasible choice from a Lagrangian relaxation
  (min-plus on ``c + λ·m``, ``λ`` bisected until the choice fits) gives an upper bound ``U``,
  and an entry ``(μ, φ)`` is dropped once ``φ + max(h_t[j], h^λ_t[j] − λ·(M − μ)) > U``, with
  ``h_t[j]`` the cheapest suffix after ``(t, j)`` ignoring memory and ``h^λ_t[j]`` the same on
  ``c + λ·m`` (backward min-plus passes; the second is the Lagrangian bound).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from fxplan.intra_op.problem import IntraOpInfeasible, Problem
from fxplan.intra_op.result import OPTIMAL, SolverResult

__all__ = ["solve_chain_dp", "NotAChain"]


class NotAChain(ValueError):
    """The problem's edges do not form disjoint paths."""


@dataclass
class _Chain:
    """The problem laid out as one sequence: prices, memories and links in order."""

    order: list[int]
    cost: list[np.ndarray]
    memory: list[np.ndarray]
    links: list[np.ndarray]  # links[t] between positions t and t+1


def _sequence(problem: Problem) -> _Chain:
    paths = problem.chain_order()
    if paths is None:
        raise NotAChain(f"not a chain problem ({problem.size_summary()})")
    order = [v for path in paths for v in path]
    links = []
    for prev, cur in zip(order, order[1:]):
        cost = problem.edge_between(prev, cur)
        shape = (problem.num_strategies(prev), problem.num_strategies(cur))
        links.append(np.zeros(shape) if cost is None else cost)
    return _Chain(order, [problem.node_cost[v] for v in order],
                  [problem.node_memory[v] for v in order], links)


def _min_plus(cost: list[np.ndarray], links: list[np.ndarray]) -> tuple[float, list[int]]:
    """Forward min-plus recursion; ``(optimum, strategy per position)``."""
    f = cost[0].copy()
    back: list[np.ndarray] = []
    for t in range(1, len(cost)):
        total = f[:, None] + links[t - 1]
        arg = np.argmin(total, axis=0)
        back.append(arg)
        f = total[arg, np.arange(total.shape[1])] + cost[t]
    j = int(np.argmin(f))
    picks = [j]
    for arg in reversed(back):
        j = int(arg[j])
        picks.append(j)
    return float(f[picks[0]]), picks[::-1]


def _suffix_bounds(cost: list[np.ndarray], links: list[np.ndarray]) -> list[np.ndarray]:
    """``h_t[j]``: the cheapest continuation after position ``t`` in state ``j``."""
    h = [np.zeros_like(cost[-1])]
    for t in range(len(cost) - 2, -1, -1):
        h.append(np.min(links[t] + (cost[t + 1] + h[-1])[None, :], axis=1))
    return h[::-1]


def _fits(chain: _Chain, picks: list[int], budget: float) -> bool:
    return sum(float(m[j]) for m, j in zip(chain.memory, picks)) <= budget


def _lagrangian(chain: _Chain, budget: float, rounds: int = 30) -> tuple[float, float]:
    """``(U, λ)``: the price ``U`` of the cheapest feasible choice met while bisecting ``λ`` in
    min-plus on ``c + λ·m``, and the smallest ``λ`` whose choice fits (``U = inf`` if none)."""
    def relaxed(lam: float) -> list[int]:
        return _min_plus([c + lam * m for c, m in zip(chain.cost, chain.memory)], chain.links)[1]

    def price(picks: list[int]) -> float:
        total = sum(float(c[j]) for c, j in zip(chain.cost, picks))
        return total + sum(float(r[a, b]) for r, a, b in zip(chain.links, picks, picks[1:]))

    lo, hi = 0.0, 1.0
    while not _fits(chain, relaxed(hi), budget):
        hi *= 16.0
        if hi > 1e30:
            return np.inf, 0.0
    best = price(relaxed(hi))
    for _ in range(rounds):
        mid = 0.5 * (lo + hi)
        picks = relaxed(mid)
        if _fits(chain, picks, budget):
            hi, best = mid, min(best, price(picks))
        else:
            lo = mid
    return best, hi


def _pareto(mem: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Indices of the non-dominated (memory ↑, cost strictly ↓), finite entries."""
    idx = np.lexsort((cost, mem))
    running = np.minimum.accumulate(cost[idx])
    keep = np.ones(idx.size, dtype=bool)
    keep[1:] = cost[idx[1:]] < running[:-1]
    return idx[keep & np.isfinite(cost[idx])]


Front = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # memory, cost, prev state, prev index


def _pareto_dp(chain: _Chain, budget: float) -> list[int]:
    least = [float(m.min()) for m in chain.memory]
    suffix = np.concatenate([np.cumsum(least[::-1])[::-1][1:], [0.0]])
    upper, lam = _lagrangian(chain, budget)
    h = _suffix_bounds(chain.cost, chain.links)
    h_lam = _suffix_bounds([c + lam * m for c, m in zip(chain.cost, chain.memory)], chain.links)
    slack = 1e-9 * max(budget, 1.0)
    cut = upper + 1e-9 * max(abs(upper), 1.0) if np.isfinite(upper) else np.inf

    def prune(t: int, j: int, mem: np.ndarray, cost: np.ndarray) -> np.ndarray:
        # a suffix of memory μ ≤ M − mem costs ≥ h_t[j] and ≥ h^λ_t[j] − λ·(M − mem)
        rest = np.maximum(h[t][j], h_lam[t][j] - lam * (budget - mem))
        ok = (mem <= budget - suffix[t] + slack) & (cost + rest <= cut)
        return _pareto(mem, np.where(ok, cost, np.inf))

    fronts: list[list[Front]] = [[]]
    for j, (m, c) in enumerate(zip(chain.memory[0], chain.cost[0])):
        keep = prune(0, j, np.array([m]), np.array([c]))
        fronts[0].append((np.array([m])[keep], np.array([c])[keep], np.zeros(keep.size, int), keep))
    for t in range(1, len(chain.order)):
        layer: list[Front] = []
        prev_i = np.concatenate([np.full(f[0].size, i) for i, f in enumerate(fronts[-1])])
        prev_k = np.concatenate([np.arange(f[0].size) for f in fronts[-1]])
        mem0 = np.concatenate([f[0] for f in fronts[-1]])
        cost0 = np.concatenate([f[1] for f in fronts[-1]])
        for j in range(chain.cost[t].size):
            mem = mem0 + chain.memory[t][j]
            cost = cost0 + chain.links[t - 1][prev_i, j] + chain.cost[t][j]
            keep = prune(t, j, mem, cost)
            layer.append((mem[keep], cost[keep], prev_i[keep], prev_k[keep]))
        fronts.append(layer)
    ends = [(float(f[1].min()), j) for j, f in enumerate(fronts[-1]) if f[1].size]
    if not ends:
        raise IntraOpInfeasible(
            f"no placement fits the memory budget {budget / 2**30:.3f} GiB "
            f"(the least memory of every node sums to {sum(least) / 2**30:.3f} GiB)"
        )
    j = min(ends)[1]
    k = int(np.argmin(fronts[-1][j][1]))
    picks = []
    for t in range(len(chain.order) - 1, -1, -1):
        picks.append(j)
        _, _, prev_i, prev_k = fronts[t][j]
        j, k = int(prev_i[k]), int(prev_k[k])
    return picks[::-1]


def solve_chain_dp(problem: Problem) -> SolverResult:
    """Exact optimum of a chain problem; raises :class:`NotAChain` otherwise."""
    start = time.perf_counter()
    problem.check_budget()
    chain = _sequence(problem)
    if problem.budget_binding():
        picks = _pareto_dp(chain, float(problem.memory_budget))
    else:
        value, picks = _min_plus(chain.cost, chain.links)
        if not np.isfinite(value):
            raise IntraOpInfeasible("every choice has an infinite price (forbidden pairs on every path)")
    choice = [0] * problem.num_nodes
    for v, s in zip(chain.order, picks):
        choice[v] = s
    objective, memory = problem.evaluate(choice)
    return SolverResult(tuple(choice), objective, memory, objective, OPTIMAL, "dp",
                        time.perf_counter() - start)
