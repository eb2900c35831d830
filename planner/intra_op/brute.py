"""Exhaustive search over every strategy choice: the reference the other backends are tested
against. Vectorised with numpy; refuses problems with more than ``MAX_CHOICES`` choices."""

from __future__ import annotations

import math
import time

import numpy as np

from fxplan.intra_op.problem import IntraOpInfeasible, Problem
from fxplan.intra_op.result import OPTIMAL, SolverResult

__all__ = ["solve_brute_force", "MAX_CHOICES"]

MAX_CHOICES = 4_000_000


def solve_brute_force(problem: Problem) -> SolverResult:
    """Price all ``Π_v K_v`` choices and return the cheapest that fits the budget."""
    start = time.perf_counter()
    sizes = [problem.num_strategies(v) for v in range(problem.num_nodes)]
    total = math.prod(sizes)
    if total > MAX_CHOICES:
        raise ValueError(f"brute force over Π K_v = {total:,} choices > {MAX_CHOICES:,}; use another backend")
    grid = np.indices(sizes).reshape(len(sizes), -1)  # grid[v] = strategy of v in each choice
    cost = np.full(total, problem.constant)
    memory = np.zeros(total)
    for v in range(problem.num_nodes):
        cost += problem.node_cost[v][grid[v]]
        memory += problem.node_memory[v][grid[v]]
    for edge in problem.edges:
        cost += edge.cost[grid[edge.u], grid[edge.v]]
    if problem.memory_budget is not None:
        cost[memory > problem.memory_budget] = np.inf
    best = int(np.argmin(cost))
    if not np.isfinite(cost[best]):
        budget = problem.memory_budget
        raise IntraOpInfeasible(
            "no choice is finite and within the memory budget"
            + (f" {budget / 2**30:.3f} GiB (smallest: {memory.min() / 2**30:.3f} GiB)" if budget else "")
        )
    choice = tuple(int(s) for s in grid[:, best])
    objective, mem = problem.evaluate(choice)
    return SolverResult(choice, objective, mem, objective, OPTIMAL, "brute", time.perf_counter() - start)
