"""Intra-op (SPMD) placement search: strategies per node on a device mesh, by OR-Tools.

Entry point: :func:`solve_intra_op`. The formulation is in :mod:`fxplan.intra_op.ilp`;
backends: HiGHS (:mod:`.highs`), CP-SAT (:mod:`.cpsat`), exact chain DP (:mod:`.dp`),
brute force (:mod:`.brute`).
"""

from fxplan.intra_op.backends import BACKENDS, solve_problem
from fxplan.intra_op.costs import CostModel, NodePrice
from fxplan.intra_op.mesh_cost import MeshCost
from fxplan.intra_op.problem import IntraOpInfeasible, IntraOpTimeLimit, Problem
from fxplan.intra_op.result import SolverResult
from fxplan.intra_op.solution import IntraOpSolution, EdgeReshard
from fxplan.intra_op.solve import solve_intra_op

__all__ = ["solve_intra_op", "IntraOpSolution", "EdgeReshard", "CostModel", "NodePrice", "MeshCost",
           "Problem", "IntraOpInfeasible", "IntraOpTimeLimit", "SolverResult", "BACKENDS",
           "solve_problem"]
