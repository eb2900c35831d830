"""Per-node and per-parameter placements of the chosen plan on its ``(dp, tp)`` stage mesh.

The intra-op solver (:func:`planner.intra_op.solve_intra_op`, repeated blocks sharing one set
of variables) places the winner's graph on the ``(1, tp)`` slice of its ``(dp, tp)`` stage mesh
at the captured microbatch; the ``dp`` token is the search's data parallelism (the batch
``S(0)`` for activations, ``S(0)`` for parameters under ZeRO-3). Its placements, status and
gap go into the plan. The step time stays the cost model's price of the default Megatron
layout (which the solver rediscovers on GPT blocks). Where
that solver is not importable or refuses the call, the placements come from the cost model's
default Megatron layout (:func:`cost_model.megatron_layout.tp_layout`, derived from dataflow),
and the fallback is logged and recorded in ``Plan.fallbacks`` — never silently:

- parameters: column-parallel weights and biases and the vocab-parallel embedding
  ``S(0)`` over tp, row-parallel weights ``S(1)``, the rest ``R``; over dp ``S(0)`` under
  ZeRO-3 (parameters sharded), else ``R``;
- activations: ``S(0)`` over dp (the batch); over tp ``S(last)`` for a column-parallel
  output, ``R`` for replicated ones (``S(1)``, the sequence, with sequence parallelism);
  split intermediates (attention core) are left to the layout and not listed.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from cost_model.megatron_layout import CONST, REPL, tp_layout, used_params
from cost_model.mesh import LogicalMesh
from planner.plan_spec import SolverInfo
from planner.inter_op.space import Candidate

__all__ = ["Placements", "solve_placements"]

log = logging.getLogger("fxplan.planner")

#: Wall-clock limit of one intra-op solve (the solver reports ``feasible`` and its gap when hit).
SOLVER_TIME_LIMIT_S = 30.0


@dataclass
class Placements:
    nodes: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    solver: SolverInfo = SolverInfo()
    fallbacks: list[str] = field(default_factory=list)


def _tokens(text: str) -> list[str]:
    return re.findall(r"S\(-?\d+\)|R|P", text)


def _from_solver(graph: Any, cluster: Any, c: Candidate) -> Placements:
    """Solve the tp axis on the ``(1, tp)`` slice of the stage mesh at the captured microbatch;
    the dp token is the inter-op search's data parallelism (batch ``S(0)`` for activations,
    parameters ``S(0)`` under ZeRO-3, else ``R``)."""
    from planner.intra_op import solve_intra_op

    result = solve_intra_op(graph, LogicalMesh(cluster, (1, c.tp), ("dp", "tp")),
                            time_limit_s=SOLVER_TIME_LIMIT_S)
    layout = tp_layout(graph)
    batch = "S(0)" if c.dp > 1 else "R"
    weights = "S(0)" if c.zero_stage == 3 and c.dp > 1 else "R"
    nodes = {name: (batch if layout.state.get(name) != CONST else "R") + _tokens(p)[-1]
             for name, p in result.node_placements.items()}
    params = {name: weights + _tokens(p)[-1] for name, p in result.param_placements.items()}
    out = Placements(nodes, params, SolverInfo(backend=result.backend, status=result.status,
                                               gap=float(result.gap),
                                               time_s=float(result.solve_time_s)))
    out.fallbacks.extend(f"intra-op: {f}" for f in result.fallbacks)
    return out


def _megatron(graph: Any, c: Candidate) -> Placements:
    layout = tp_layout(graph)
    dp_param = "S(0)" if c.zero_stage == 3 and c.dp > 1 else "R"
    params = {name: dp_param + "R" for name in graph.params}
    by_name = {node.name: node for node in graph.gm.graph.nodes}
    if c.tp == 1:
        layout_nodes: tuple = ()
    else:
        layout_nodes = ((layout.column, "S(0)"), (layout.vocab, "S(0)"))
    for names, token in layout_nodes:
        for name in names:
            for param in used_params(by_name[name], graph):
                params[param] = dp_param + token
    for name in (layout.row if c.tp > 1 else ()):
        for param in used_params(by_name[name], graph):
            if graph.params[param].shape and len(graph.params[param].shape) == 2:
                params[param] = dp_param + "S(1)"
    nodes: dict[str, str] = {}
    replicated = "S(1)" if c.sequence_parallel and c.tp > 1 else "R"
    for node, info in graph.nodes():
        shape = info.shape
        if not isinstance(shape, tuple) or not shape or not isinstance(shape[0], int):
            continue
        state = layout.state.get(node.name)
        if state == CONST or node.op == "output":
            continue
        if node.name in layout.column and c.tp > 1:
            nodes[node.name] = f"S(0)S({len(shape) - 1})"
        elif state == REPL or c.tp == 1:
            nodes[node.name] = "S(0)" + (replicated if len(shape) > 1 else "R")
    return Placements(nodes, params, SolverInfo(backend="megatron-default", status="not-run"))


def solve_placements(graph: Any, cluster: Any, c: Candidate) -> Placements:
    """The solver's placements for ``c``'s stage mesh, or the logged Megatron fallback."""
    try:
        return _from_solver(graph, cluster, c)
    except (ImportError, AttributeError, TypeError, NotImplementedError) as err:
        reason = (f"intra-op solver unavailable ({type(err).__name__}: {err}); placements are "
                  f"the cost model's default Megatron layout (column/row tp={c.tp}, "
                  f"{'sequence-parallel' if c.sequence_parallel else 'replicated'} residual "
                  "stream), which is also what the step time was priced with")
        log.warning(reason)
        out = _megatron(graph, c)
        out.fallbacks.append(reason)
        return out
