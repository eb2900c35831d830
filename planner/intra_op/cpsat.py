"""CP-SAT: the alternative intra-op backend, same one-hot-edge program with boolean edges.

CP-SAT wants integers. Prices are scaled so that the largest coefficient becomes
``PRICE_RESOLUTION`` and rounded (the returned objective is re-priced exactly in seconds by
``Problem.evaluate``, so rounding can only cost optimality by ≤ ½ unit per term). Memory is
scaled so that the budget is ``MEMORY_RESOLUTION`` units and rounded conservatively (each
``m_v[s]`` up, the budget down), so a CP-SAT choice always fits; the rounding can exclude only
choices within ``n / MEMORY_RESOLUTION`` of the budget (with 1e12 units, CP-SAT declared
feasible problems infeasible). ``num_workers=8`` measured faster than 2 even on 2 cores (notes/torch-2.13-cpu.md).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from fxplan.intra_op.ilp import Terms, encode, read_choice
from fxplan.intra_op.problem import IntraOpInfeasible, IntraOpTimeLimit, Problem
from fxplan.intra_op.result import FEASIBLE, OPTIMAL, SolverResult

__all__ = ["solve_cpsat", "PRICE_RESOLUTION"]

PRICE_RESOLUTION = 10**7  # integer units given to the largest price coefficient
MEMORY_RESOLUTION = 10**9  # integer units given to the memory budget (1e12 broke CP-SAT)


class _CpSatModel:
    """:class:`~fxplan.intra_op.ilp.LinearModel` over a ``cp_model.CpModel``."""

    def __init__(self, price_unit: float, memory_unit: float) -> None:
        self.model = cp_model.CpModel()
        self.price_unit = price_unit
        self.memory_unit = memory_unit
        self.offset = 0.0

    def bool_var(self, name: str) -> Any:
        return self.model.new_bool_var(name)

    unit_var = bool_var

    def add_eq(self, terms: Terms, rhs: float) -> None:
        self.model.add(sum(int(c) * v for c, v in terms) == int(rhs))

    def add_memory_le(self, terms: Terms, rhs: float) -> None:
        coefs = [math.ceil(c / self.memory_unit) for c, _ in terms]
        self.model.add(cp_model.LinearExpr.weighted_sum([v for _, v in terms], coefs)
                       <= math.floor(rhs / self.memory_unit))

    def minimize(self, terms: Terms, constant: float) -> None:
        self.offset = constant
        coefs = [round(c / self.price_unit) for c, _ in terms]
        self.model.minimize(cp_model.LinearExpr.weighted_sum([v for _, v in terms], coefs))


def _largest_price(problem: Problem) -> float:
    arrays = problem.node_cost + [e.cost for e in problem.edges]
    finite = [float(np.abs(a[np.isfinite(a)]).max(initial=0.0)) for a in arrays]
    return max(finite, default=0.0) or 1.0


def solve_cpsat(problem: Problem, *, time_limit_s: float = 30.0, num_workers: int = 8) -> SolverResult:
    """Solve ``problem`` with CP-SAT; status ``optimal`` or ``feasible`` (time limit hit)."""
    start = time.perf_counter()
    problem.check_budget()
    price_unit = _largest_price(problem) / PRICE_RESOLUTION
    memory_unit = (problem.memory_budget or 1.0) / MEMORY_RESOLUTION
    wrapper = _CpSatModel(price_unit, memory_unit)
    enc = encode(problem, wrapper)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = num_workers
    status = solver.solve(wrapper.model)
    if status == cp_model.INFEASIBLE:
        raise IntraOpInfeasible(
            f"no placement fits the memory budget {problem.memory_budget / 2**30:.3f} GiB "
            f"(every node at its smallest: {problem.min_memory() / 2**30:.3f} GiB)"
        )
    if status == cp_model.UNKNOWN:
        raise IntraOpTimeLimit(f"CP-SAT found no placement within its {time_limit_s:.3g} s limit")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise RuntimeError(f"CP-SAT ended with {solver.status_name(status)} after {time_limit_s} s")
    values = [{s: solver.boolean_value(var) for s, var in xs.items()} for xs in enc.x]
    choice = read_choice(enc, values)
    objective, memory = problem.evaluate(choice)
    proven = status == cp_model.OPTIMAL
    bound = solver.best_objective_bound * price_unit + wrapper.offset
    return SolverResult(choice, objective, memory, objective if proven else bound,
                        OPTIMAL if proven else FEASIBLE, "cpsat", time.perf_counter() - start)

