"""HiGHS through ``ortools.math_opt``: the default intra-op backend.

The program is the one of :mod:`fxplan.intra_op.ilp` with continuous edge variables. HiGHS is
run with its default thread setting: passing ``threads=`` through math_opt fails on OR-Tools
9.15 with a misleading ``'StatusNotOk' object has no attribute 'canonical_code'``.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from ortools.math_opt.python import mathopt

from fxplan.intra_op.ilp import Terms, encode, read_choice
from fxplan.intra_op.problem import IntraOpInfeasible, IntraOpTimeLimit, Problem
from fxplan.intra_op.result import FEASIBLE, OPTIMAL, SolverResult

__all__ = ["solve_highs"]

_OPTIMAL = {mathopt.TerminationReason.OPTIMAL}
_FEASIBLE = {mathopt.TerminationReason.FEASIBLE, mathopt.TerminationReason.NO_SOLUTION_FOUND}


class _MathOptModel:
    """:class:`~fxplan.intra_op.ilp.LinearModel` over a ``mathopt.Model``."""

    def __init__(self) -> None:
        self.model = mathopt.Model(name="fxplan-intra-op")

    def bool_var(self, name: str) -> Any:
        return self.model.add_binary_variable(name=name)

    def unit_var(self, name: str) -> Any:
        return self.model.add_variable(lb=0.0, ub=1.0, name=name)

    def _row(self, terms: Terms, lb: float, ub: float) -> None:
        row = self.model.add_linear_constraint(lb=lb, ub=ub)
        for coef, var in terms:
            row.set_coefficient(var, coef)

    def add_eq(self, terms: Terms, rhs: float) -> None:
        self._row(terms, rhs, rhs)

    def add_memory_le(self, terms: Terms, rhs: float) -> None:
        self._row(terms, -float("inf"), rhs)

    def minimize(self, terms: Terms, constant: float) -> None:
        objective = self.model.objective
        objective.is_maximize = False
        objective.offset = constant
        for coef, var in terms:
            objective.set_linear_coefficient(var, objective.get_linear_coefficient(var) + coef)


def solve_highs(problem: Problem, *, time_limit_s: float = 30.0, relative_gap: float = 1e-6) -> SolverResult:
    """Solve ``problem`` with HiGHS; status ``optimal`` or ``feasible`` (time limit hit)."""
    start = time.perf_counter()
    problem.check_budget()
    wrapper = _MathOptModel()
    enc = encode(problem, wrapper)
    params = mathopt.SolveParameters(
        time_limit=datetime.timedelta(seconds=time_limit_s), relative_gap_tolerance=relative_gap
    )
    result = mathopt.solve(wrapper.model, mathopt.SolverType.HIGHS, params=params)
    reason = result.termination.reason
    if reason == mathopt.TerminationReason.INFEASIBLE:
        raise IntraOpInfeasible(
            f"no placement fits the memory budget {problem.memory_budget / 2**30:.3f} GiB "
            f"(every node at its smallest: {problem.min_memory() / 2**30:.3f} GiB, but the "
            "allowed pairs on edges force more)"
        )
    if reason in _FEASIBLE and not result.has_primal_feasible_solution():
        raise IntraOpTimeLimit(f"HiGHS found no placement within its {time_limit_s:.3g} s limit "
                               f"({reason.name})")
    if reason not in _OPTIMAL | _FEASIBLE or not result.has_primal_feasible_solution():
        raise RuntimeError(f"HiGHS ended with {reason.name}: {result.termination.detail}")
    values = [dict(zip(xs, result.variable_values(list(xs.values())))) for xs in enc.x]
    choice = read_choice(enc, values)
    objective, memory = problem.evaluate(choice)
    status = OPTIMAL if reason in _OPTIMAL else FEASIBLE
    bound = result.termination.objective_bounds.dual_bound
    return SolverResult(choice, objective, memory, objective if status == OPTIMAL else bound,
                        status, "highs", time.perf_counter() - start)
