"""Coarsening and presolve keep the optimum: leaf elimination is exact, separable edges fold
into node prices, follow-merging is feasible (and expands back onto every node)."""

from __future__ import annotations

import numpy as np
import pytest

from fxplan.intra_op import Problem, solve_problem
from fxplan.intra_op.coarsen import coarsen
from fxplan.intra_op.ilp import reduce_edge
from fxplan.intra_op.synthetic import random_dag


def _with_leaves(seed: int) -> Problem:
    problem = random_dag(8, 3, seed=seed)
    rng = np.random.default_rng(seed + 100)
    for k in range(4):
        leaf = problem.add_node(f"leaf{k}", rng.uniform(0, 1, size=3))
        host = int(rng.integers(0, 8))
        problem.add_edge(leaf, host, rng.uniform(0, 1, size=(3, problem.num_strategies(host))))
    return problem


@pytest.mark.parametrize("seed", range(8))
def test_leaf_elimination_is_exact(seed: int) -> None:
    problem = _with_leaves(seed)
    coarse = coarsen(problem)
    assert coarse.problem.num_nodes < problem.num_nodes
    result = solve_problem(coarse.problem, "brute")
    full = coarse.expand(result.choice)
    assert len(full) == problem.num_nodes
    assert problem.evaluate(full)[0] == pytest.approx(solve_problem(problem, "brute").objective)
    assert problem.evaluate(full)[0] == pytest.approx(result.objective)


@pytest.mark.parametrize("seed", range(4))
def test_follow_merge_gives_a_feasible_choice_no_better_than_optimal(seed: int) -> None:
    problem = random_dag(9, 3, seed=seed)
    followers = {v: v - 1 for v in range(1, 9) if v % 3 == 2}  # chain neighbours
    coarse = coarsen(problem, followers)
    result = solve_problem(coarse.problem, "brute")
    full = coarse.expand(result.choice)
    assert problem.evaluate(full)[0] == pytest.approx(result.objective)
    assert result.objective >= solve_problem(problem, "brute").objective - 1e-12


def test_separable_edges_are_detected() -> None:
    a, b = np.array([1.0, 2.0, 4.0]), np.array([0.5, 0.0])
    split = reduce_edge(a[:, None] + b[None, :])
    assert split is not None
    assert np.allclose(split[0][:, None] + split[1][None, :], a[:, None] + b[None, :])
    assert reduce_edge(np.array([[0.0, 1.0], [1.0, 0.0]])) is None
    assert reduce_edge(np.array([[0.0, np.inf], [1.0, 0.0]])) is None


def test_separable_edges_keep_the_objective() -> None:
    problem = random_dag(8, 3, seed=5)
    for edge in problem.edges[::2]:  # make every other edge separable
        edge.cost = edge.cost[:, :1] + edge.cost[:1, :] * 0.5
    assert solve_problem(problem, "highs").objective == pytest.approx(solve_problem(problem, "brute").objective)
