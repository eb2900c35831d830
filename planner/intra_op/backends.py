"""Backend choice: ``auto`` takes the exact DP on chains and HiGHS otherwise."""

from __future__ import annotations

from typing import Callable

from fxplan.intra_op.brute import solve_brute_force
from fxplan.intra_op.dp import solve_chain_dp
from fxplan.intra_op.highs import solve_highs
from fxplan.intra_op.problem import Problem
from fxplan.intra_op.result import SolverResult

__all__ = ["BACKENDS", "solve_problem"]


def _cpsat(problem: Problem, time_limit_s: float) -> SolverResult:
    """CP-SAT, imported when asked for: its OR-Tools module loads pandas, a third of a second
    of every search that ``auto`` (the DP or HiGHS) never needs."""
    from fxplan.intra_op.cpsat import solve_cpsat

    return solve_cpsat(problem, time_limit_s=time_limit_s)


BACKENDS: dict[str, Callable[..., SolverResult]] = {
    "highs": lambda p, t: solve_highs(p, time_limit_s=t),
    "cpsat": _cpsat,
    "dp": lambda p, t: solve_chain_dp(p),
    "brute": lambda p, t: solve_brute_force(p),
}


def solve_problem(problem: Problem, backend: str = "auto", time_limit_s: float = 30.0) -> SolverResult:
    """Solve with ``backend`` (one of ``auto``, ``highs``, ``cpsat``, ``dp``, ``brute``)."""
    if backend == "auto":
        backend = "dp" if problem.chain_order() is not None else "highs"
    if backend not in BACKENDS:
        raise ValueError(f"unknown intra-op backend {backend!r}; expected auto or one of {sorted(BACKENDS)}")
    return BACKENDS[backend](problem, time_limit_s)
