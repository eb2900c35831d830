r"""Intra-op (SPMD) placement of a captured graph on a device mesh.

:func:`solve_intra_op` chooses one strategy per tensor node — the placements of its operands
and output on every mesh axis — minimising the predicted step time

    Σ_v c_v[s_v]  +  Σ_{(u,v)} R_uv[s_u, s_v]        subject to   Σ_v m_v[s_v] ≤ M

where ``c_v`` is compute plus the communication the strategy implies, ``R_uv`` the reshard
of the tensor on edge ``(u, v)`` (and of its gradient), ``m_v`` the bytes kept (see
:mod:`fxplan.intra_op.mesh_cost` for the prices). The steps:

1. strategies from the sharding rules; repeated layers share variables
   (:mod:`~fxplan.intra_op.build`, :mod:`~fxplan.intra_op.blocks`);
2. coarsening: follow-the-producer ops merged, leaves eliminated exactly
   (:mod:`~fxplan.intra_op.coarsen`);
3. a backend: the integer program of :mod:`~fxplan.intra_op.ilp` through HiGHS (default) or
   CP-SAT, the exact DP of :mod:`~fxplan.intra_op.dp` when the coarse problem is a chain,
   or brute force for tiny problems (``backend="auto"`` takes the DP on chains, else HiGHS).
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from fxplan.cost_model.comm.mesh import LogicalMesh
from fxplan.core.placements import format_placements
from fxplan.passes.captured_graph import CapturedGraph
from fxplan.intra_op.backends import solve_problem
from fxplan.intra_op.build import build_problem, op_graph, strategy_of
from fxplan.intra_op.coarsen import coarsen
from fxplan.intra_op.costs import CostModel
from fxplan.intra_op.mesh_cost import MeshCost
from fxplan.intra_op.solution import IntraOpSolution, EdgeReshard

__all__ = ["IntraOpSolution", "EdgeReshard", "solve_intra_op"]

log = logging.getLogger(__name__)


def solve_intra_op(graph: CapturedGraph, mesh: LogicalMesh, *, cost: Optional[CostModel] = None,
                   memory_budget_bytes: float | None = None, backend: str = "auto",
                   time_limit_s: float = 30.0, merge_followers: bool = True) -> IntraOpSolution:
    """Choose a strategy for every tensor node of ``graph`` on ``mesh`` (module docstring).

    ``cost`` defaults to :class:`~fxplan.intra_op.mesh_cost.MeshCost` on ``mesh``;
    ``memory_budget_bytes`` caps the per-rank bytes the strategies keep; ``backend`` is one of
    ``auto``, ``highs``, ``cpsat``, ``dp``, ``brute``; ``merge_followers=False`` keeps every
    node a decision (exact but larger).
    """
    start = time.perf_counter()
    cost = cost if cost is not None else MeshCost(mesh)
    opg = op_graph(graph, mesh.shape)
    built = build_problem(graph, opg, cost, memory_budget_bytes, follow=merge_followers)
    coarse = coarsen(built.problem, built.followers)
    build_time = time.perf_counter() - start
    result = solve_problem(coarse.problem, backend, time_limit_s)
    if result.status != "optimal":
        log.warning("intra-op %s stopped at its %.1f s limit: %s, gap %.2f%%", result.backend,
                    time_limit_s, result.status, 100 * result.gap)
    choice = coarse.expand(result.choice)
    objective, memory = built.problem.evaluate(choice)
    compute = sum(float(c[s]) for c, s in zip(built.compute, choice))
    chosen = strategy_of(opg, built, choice)
    params: dict[str, str] = {}
    for op in opg.ops:
        for operand, placements in zip(op.ctx.operands, chosen[op.name].inputs):
            if operand.param is not None and operand.param not in params:
                params[operand.param] = format_placements(placements)
        if op.ctx.param is not None:
            params.setdefault(op.ctx.param, format_placements(chosen[op.name].output))
    notes = {name: s.notes for name, s in chosen.items() if s.notes}
    reshards = []
    for op in opg.ops:
        for slot, operand in enumerate(op.ctx.operands):
            if operand.producer is None or operand.producer.name not in opg.index:
                continue
            src, dst = chosen[operand.producer.name].output, chosen[op.name].inputs[slot]
            if src != dst:
                seconds = cost.edge_price(operand, src, dst, chosen[op.name].split,
                                          opg.requires_grad[opg.index[operand.producer.name]])
                reshards.append(EdgeReshard(operand.producer.name, op.name, slot, src, dst, seconds))
    return IntraOpSolution(
        mesh=str(mesh), placements=chosen, param_placements=params, objective_s=objective,
        comm_s=objective - compute, compute_s=compute, memory_bytes=memory, status=result.status,
        gap=result.gap, backend=result.backend, fallbacks=tuple(opg.fallbacks),
        solve_time_s=result.solve_time_s, build_time_s=build_time,
        problem_size=f"{built.problem.size_summary()} → coarse {coarse.problem.size_summary()}",
        notes=notes, reshards=tuple(reshards))
