"""Backend choice: ``auto`` takes the exact DP on chains and HiGHS otherwise."""

from __future__ import annotations

from typing import Callable

from fxplan.intra_op.brute import solve_brute_force
from fxplan.intra_op.cpsat import solve_cpsat
from fxplan.intra_op.dp import solve_chain_dp
from fxplan.intra_op.highs import solve_highs
from fxplan.intra_op.problem import Problem
from fxplan.intra_op.result import SolverResult

__all__ = ["BACKENDS", "solve_problem"]

BACKENDS: dict[str, Callable[..., SolverResult]] = {
    "highs": lambda p, t: solve_highs(p, time_limit_s=t),
    "cpsat": lambda p, t: solve_cpsat(p, time_limit_s=t),
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
