"""The intra-op backends agree: ILP (HiGHS, CP-SAT) == exhaustive search on small random
graphs, and == the exact DP on chains, with and without a binding memory budget."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from ortools.math_opt.python import mathopt

from fxplan.intra_op import IntraOpInfeasible, Problem, solve_problem
from fxplan.intra_op.dp import NotAChain, solve_chain_dp
from fxplan.intra_op.synthetic import random_chain, random_dag

SEEDS = range(12)


def _same(a: float, b: float, rel: float = 1e-6) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def _solve_or_infeasible(problem: Problem, backend: str) -> float | None:
    try:
        result = solve_problem(problem, backend)
    except IntraOpInfeasible:
        return None
    assert result.status == "optimal" and result.gap == 0.0
    if problem.memory_budget is not None:
        assert result.memory <= problem.memory_budget * (1 + 1e-9)
    assert _same(result.objective, problem.evaluate(result.choice)[0])
    return result.objective


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tight", [False, True])
def test_ilp_matches_exhaustive_search_on_random_dags(seed: int, tight: bool) -> None:
    problem = random_dag(9, 3, seed=seed, skip_every=3, tight_memory=tight, vary_k=True)
    best = _solve_or_infeasible(problem, "brute")
    for backend, rel in (("highs", 1e-6), ("cpsat", 1e-5)):
        got = _solve_or_infeasible(problem, backend)
        assert (got is None) == (best is None), backend
        if best is not None:
            assert _same(got, best, rel), (backend, got, best)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tight", [False, True])
def test_ilp_matches_exact_dp_on_chains(seed: int, tight: bool) -> None:
    problem = random_chain(40, 4, seed=seed, tight_memory=tight)
    dp = _solve_or_infeasible(problem, "dp")
    highs = _solve_or_infeasible(problem, "highs")
    assert (dp is None) == (highs is None)
    if dp is not None:
        assert _same(dp, highs), (dp, highs)
    small = random_chain(9, 4, seed=seed, tight_memory=tight)
    assert _solve_or_infeasible(small, "dp") == pytest.approx(_solve_or_infeasible(small, "brute"))


def test_memory_budget_binds_and_changes_the_answer() -> None:
    free = random_chain(30, 4, seed=3)
    tight = random_chain(30, 4, seed=3, tight_memory=True)
    a, b = solve_problem(free, "highs"), solve_problem(tight, "highs")
    assert a.memory > tight.memory_budget >= b.memory
    assert b.objective > a.objective


def test_impossible_budget_names_the_smallest_memory() -> None:
    problem = random_dag(6, 3, seed=0)
    problem.memory_budget = 0.5 * problem.min_memory()
    for backend in ("highs", "cpsat", "dp", "brute"):
        if backend == "dp":
            continue  # not a chain
        with pytest.raises(IntraOpInfeasible, match="GiB"):
            solve_problem(problem, backend)


def test_auto_uses_dp_on_chains_and_highs_otherwise() -> None:
    assert solve_problem(random_chain(12, 3, seed=1)).backend == "dp"
    assert solve_problem(random_dag(12, 3, seed=1)).backend == "highs"
    with pytest.raises(NotAChain):
        solve_chain_dp(random_dag(12, 3, seed=1))


def test_forbidden_pairs_are_never_chosen() -> None:
    problem = Problem()
    a = problem.add_node("a", [0.0, 1.0])
    b = problem.add_node("b", [0.0, 5.0])
    problem.add_edge(a, b, np.array([[np.inf, 0.0], [0.0, np.inf]]))
    for backend in ("highs", "cpsat", "dp", "brute"):
        result = solve_problem(problem, backend)
        assert result.choice == (1, 0) and result.objective == 1.0, backend


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown intra-op backend"):
        solve_problem(random_chain(3, 2), "gurobi")


def test_stopped_early_returns_a_feasible_choice_with_its_gap(monkeypatch) -> None:
    """A HiGHS run stopped by a limit before proving optimality reports ``feasible``, a
    choice within the memory budget priced exactly, and a valid bound and gap.

    The stop is deterministic: math_opt's ``solution_limit=1`` (stop at the first incumbent)
    is added to the parameters ``solve_highs`` passes, whose own time limit stays generous. A
    wall-clock limit would make the outcome depend on the machine's load."""
    real_solve = mathopt.solve
    calls: list[mathopt.SolveParameters] = []

    def first_solution_only(model, solver_type, params):  # type: ignore[no-untyped-def]
        params = dataclasses.replace(params, solution_limit=1)
        calls.append(params)
        return real_solve(model, solver_type, params=params)

    problem = random_dag(100, 6, seed=3, tight_memory=True)
    monkeypatch.setattr(mathopt, "solve", first_solution_only)
    result = solve_problem(problem, "highs", time_limit_s=600.0)
    monkeypatch.undo()
    assert len(calls) == 1 and calls[0].solution_limit == 1
    assert result.status == "feasible"
    assert result.memory <= problem.memory_budget
    assert (result.objective, result.memory) == problem.evaluate(result.choice)
    assert result.bound < result.objective
    assert 0.0 < result.gap < 1.0
    assert _same(result.gap, (result.objective - result.bound) / result.objective)
    # The bound is a proven lower bound: the optimum lies between it and the incumbent.
    optimum = solve_problem(problem, "highs", time_limit_s=600.0)
    assert optimum.status == "optimal" and optimum.gap == 0.0
    assert result.bound <= optimum.objective * (1 + 1e-9)
    assert optimum.objective <= result.objective


def test_cpsat_is_imported_only_when_asked_for() -> None:
    """``auto`` never runs CP-SAT, whose OR-Tools module loads pandas: importing the intra-op
    package leaves it out."""
    import subprocess
    import sys

    code = ("import sys, fxplan.intra_op; "
            "print('ortools.sat.python.cp_model' in sys.modules, 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.split() == ["False", "False"]
