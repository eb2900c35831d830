"""The placements of a candidate on its ``(dp, tp)`` stage mesh, and where they came from.

The intra-op solver (:func:`fxplan.intra_op.solve_intra_op`, repeated blocks sharing one set
of variables) places the graph on the ``(1, tp)`` slice of the stage mesh at the captured
microbatch, once per tensor-parallel degree (:class:`IntraOpCache`); the ``dp`` token is the
search's data parallelism (the batch ``S(0)`` for activations, ``S(0)`` for parameters under
ZeRO-3). :meth:`PlacementChoice.priced` placements are what :func:`cost_model.step.estimate.estimate`
prices (:mod:`cost_model.parallel.priced_layout`): a :class:`~fxplan.core.placements.PlacementMap` of every
node's output, what each consumer needs where it differs from its producer's output (keyed by
the :class:`~fxplan.core.placements.DataEdge`), every parameter.
Sequence parallelism is read off the answer: it is on when an activation the Megatron layout
replicates (layer norms, the residual stream) is sharded over tp.

Where the solver is not importable, finds no feasible placement, or the search's time budget
leaves it no time (its limit is the smaller of :data:`SOLVER_TIME_LIMIT_S` and the budget
left), the placements come from the cost
model's default Megatron layout (:func:`fxplan.cost_model.parallel.tp_layout.tp_layout`, derived from
dataflow), priced by that layout's rules, and the fallback is logged and recorded in
``Plan.fallbacks`` — never silently:

- parameters: column-parallel weights and biases and the vocab-parallel embedding
  ``S(0)`` over tp, row-parallel weights ``S(1)``, the rest ``R``; over dp ``S(0)`` under
  ZeRO-3 (parameters sharded), else ``R``;
- activations: ``S(0)`` over dp (the batch; ``R`` when ``dp = 1``); over tp ``S(last)`` for
  a column-parallel output, ``R`` for replicated ones (``S(1)``, the sequence, with sequence
  parallelism);
  split intermediates (attention core) are left to the layout and not listed.
"""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from fxplan.core.config import ParallelConfig
from fxplan.core.placements import (DataEdge, Placement, PlacementMap, Placements, Replicate,
                                    Shard, parse_placements)
from fxplan.core.plan import SolverInfo
from fxplan.cost_model.parallel.megatron_layout import CONST, REPL, used_params
from fxplan.cost_model.parallel.tp_layout import tp_layout
from fxplan.cost_model.comm.mesh import LogicalMesh

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.inter_op.progress import Budget
    from fxplan.intra_op import IntraOpSolution
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["IntraOpCache", "PlacementChoice", "megatron_placements", "shared_solves"]

log = logging.getLogger("fxplan.planner")

#: Wall-clock limit of one intra-op solve (the solver reports ``feasible`` and its gap when hit).
SOLVER_TIME_LIMIT_S = 30.0


@dataclass
class PlacementChoice:
    """The ``placements`` chosen for a candidate on its ``(dp, tp)`` stage mesh, the solver that
    chose them (or the fallback that did), and whether they are ``priced``: from the solver and
    what the estimate prices (else the default Megatron layout is)."""

    placements: PlacementMap
    solver: SolverInfo = SolverInfo()
    fallbacks: list[str] = field(default_factory=list)
    priced: bool = False
    sequence_parallel: bool = False
    objective_s: float = float("nan")

    def priced_placements(self) -> PlacementMap | None:
        """``ParallelConfig.placements`` for :func:`cost_model.step.estimate.estimate`: the map when
        it is priced, ``None`` (the default Megatron layout) otherwise."""
        return self.placements if self.priced else None


def _sequence_parallel(graph: CapturedGraph, nodes: Mapping[str, Placements]) -> bool:
    """Whether an activation the Megatron layout replicates is sharded over tp."""
    layout = tp_layout(graph)
    by_name = graph.nodes_by_name
    return any(layout.state.get(name) == REPL and by_name[name].op != "placeholder"
               and p[-1].is_shard() for name, p in nodes.items())


def _dp_placements(c: ParallelConfig) -> tuple[Placement, Placement]:
    """The dp entry of activations (the batch ``S(0)`` when ``dp > 1``, else ``R``) and of
    parameters (``S(0)`` under ZeRO-3 with ``dp > 1``, else ``R``)."""
    batch: Placement = Shard(0) if c.dp > 1 else Replicate()
    weights: Placement = Shard(0) if c.zero_stage == 3 and c.dp > 1 else Replicate()
    return batch, weights


def _solver_map(graph: CapturedGraph, result: IntraOpSolution,
                c: ParallelConfig) -> tuple[PlacementMap, bool]:
    """The solver's answer for ``c``'s tp degree on ``c``'s stage mesh, and whether it is
    sequence-parallel: the tp entry is the solver's (the last entry of its ``(1, tp)``
    placements), the dp entry the inter-op search's data parallelism
    (:func:`_dp_placements`)."""
    layout = tp_layout(graph)
    batch, weights = _dp_placements(c)

    def act(name: str, tp: Placement) -> Placements:
        return (batch if layout.state.get(name) != CONST else Replicate(), tp)

    nodes = {name: act(name, s.output[-1]) for name, s in result.placements.items()}
    inputs = {DataEdge(r.consumer, r.producer): act(r.producer, r.dst[-1]) for r in result.reshards}
    params = {name: (weights, parse_placements(p)[-1])
              for name, p in result.param_placements.items()}
    return PlacementMap(nodes, inputs, params), _sequence_parallel(graph, nodes)


def _from_solver(graph: CapturedGraph, result: IntraOpSolution, c: ParallelConfig,
                 placed: tuple[PlacementMap, bool] | None = None) -> PlacementChoice:
    """:func:`_solver_map` of ``c`` (``placed``: it, made already) with the solver's record."""
    placements, sequence_parallel = placed or _solver_map(graph, result, c)
    out = PlacementChoice(placements,
                          SolverInfo(backend=result.backend, status=result.status,
                                     gap=float(result.gap), time_s=float(result.solve_time_s)),
                          priced=True, sequence_parallel=sequence_parallel,
                          objective_s=float(result.objective_s))
    out.fallbacks.extend(f"intra-op: {f}" for f in result.fallbacks)
    return out


def _megatron(graph: CapturedGraph, c: ParallelConfig,
              placements: PlacementMap | None = None) -> PlacementChoice:
    """The default Megatron layout (module docstring; ``placements``: its map, made already);
    the dp entry as in :func:`_from_solver`."""
    return PlacementChoice(placements or _megatron_map(graph, c),
                           SolverInfo(backend="megatron-default", status="not-run"))


def _megatron_map(graph: CapturedGraph, c: ParallelConfig) -> PlacementMap:
    """The map of :func:`_megatron`."""
    layout = tp_layout(graph)
    batch, dp_param = _dp_placements(c)
    params: dict[str, Placements] = {name: (dp_param, Replicate()) for name in graph.params}
    by_name = graph.nodes_by_name
    if c.tp > 1:
        for name in layout.column | layout.vocab:
            for param in used_params(by_name[name], graph):
                params[param] = (dp_param, Shard(0))
        for name in layout.row:
            for param in used_params(by_name[name], graph):
                if graph.params[param].shape and len(graph.params[param].shape) == 2:
                    params[param] = (dp_param, Shard(1))
    nodes: dict[str, Placements] = {}
    replicated = Shard(1) if c.sequence_parallel and c.tp > 1 else Replicate()
    for node, info in graph.nodes():
        shape = info.shape
        if not isinstance(shape, tuple) or not shape or not isinstance(shape[0], int):
            continue
        state = layout.state.get(node.name)
        if state == CONST or node.op == "output":
            continue
        if node.name in layout.column and c.tp > 1:
            nodes[node.name] = (batch, Shard(len(shape) - 1))
        elif state == REPL or c.tp == 1:
            nodes[node.name] = (batch, replicated if len(shape) > 1 else Replicate())
    return PlacementMap(nodes, {}, params)


def megatron_placements(graph: CapturedGraph, c: ParallelConfig) -> PlacementChoice:
    """The default Megatron layout of ``c`` as placements (priced by the layout's own rules)."""
    return _megatron(graph, c)


#: The stores of the innermost :func:`shared_solves` (none outside one).
_SHARED: list[dict[Any, Any]] = []


@contextmanager
def shared_solves() -> Iterator[None]:
    """Within it, the searches of one graph share their intra-op answers and placement maps.

    A search alone keeps them for itself (:class:`IntraOpCache`). ``fxplan compare`` plans one
    graph on clusters of one kind at many sizes; the solve on the ``(1, tp)`` slice reads the
    graph, ranks ``0 … tp−1`` and their links, the same at every size while the tp group lies
    in one node. So an answer is shared between two searches when their clusters' specs are
    equal but for the node counts and, for a tp group wider than a node, have as many nodes.
    Only answers that do not depend on time are shared: a solve proven optimal or infeasible,
    in searches without a time budget. The placement maps (immutable) are shared with the
    answer they come from; the default Megatron maps depend on the graph alone. A plan made
    from a shared answer reports the solve that found it (``Plan.solver``)."""
    _SHARED.append({})
    try:
        yield
    finally:
        _SHARED.pop()


def _kind(cluster: Cluster) -> str:
    """The cluster's spec without its node counts (:func:`shared_solves`)."""
    spec = cluster.to_dict()
    for key in ("name", "description"):
        spec.pop(key, None)
    if len(spec.get("device_groups", ())) == 1:
        spec["device_groups"][0].pop("nodes", None)
    return json.dumps(spec, sort_keys=True)


@dataclass
class _Memo:
    """What the searches sharing it learnt: answers by tp degree, each answer's placement maps
    (with their sequence parallelism) by its dp entries and, for one graph, the Megatron maps
    by ``(tp, dp entries, sp)``."""

    graph: Any
    solved: dict[Any, IntraOpSolution | str] = field(default_factory=dict)
    maps: dict[tuple, tuple[Any, ...]] = field(default_factory=dict)


def _memo(store: dict[Any, Any] | None, graph: CapturedGraph, key: Any) -> _Memo:
    """The memo of ``graph`` under ``key`` in ``store`` (a fresh one when not sharing)."""
    if store is None:
        return _Memo(graph)
    memo = store.get((id(graph), key))
    if memo is None or memo.graph is not graph:
        memo = store[(id(graph), key)] = _Memo(graph)
    return memo


class IntraOpCache:
    """One intra-op solve per tensor-parallel degree (the solution does not depend on dp,
    microbatching, ZeRO or recompute: the solver sees the ``(1, tp)`` slice at the captured
    microbatch); a solver that cannot run is remembered as its reason. The placement maps
    made from an answer, and the default Megatron maps, are made once per distinct dp entry
    (and sp); within :func:`shared_solves` all of these are shared between searches."""

    def __init__(self, graph: CapturedGraph, cluster: Cluster,
                 budget: Budget | None = None) -> None:
        self.graph, self.cluster, self.budget = graph, cluster, budget
        timeless = budget is None or budget.seconds is None
        store = _SHARED[-1] if _SHARED and timeless else None
        self._answers = _memo(store, graph, _kind(cluster) if store is not None else None)
        self._defaults = _memo(store, graph, "megatron")
        self._solved: dict[int, IntraOpSolution | str] = {}

    def _answer_key(self, tp: int) -> Any:
        """The key of ``tp``'s answer in a shared memo: a tp group wider than a node also
        depends on the number of nodes (:func:`shared_solves`)."""
        if tp <= self.cluster.device(0).devices_per_node:
            return tp
        return (tp, self.cluster.num_nodes)

    def time_limit_s(self) -> float:
        """:data:`SOLVER_TIME_LIMIT_S`, or what is left of the search's time budget if less."""
        left = self.budget.remaining() if self.budget is not None else None
        return SOLVER_TIME_LIMIT_S if left is None else min(SOLVER_TIME_LIMIT_S, left)

    def solve(self, tp: int) -> IntraOpSolution | str:
        """The :class:`~fxplan.intra_op.IntraOpSolution` for ``tp``, or the reason (a string)
        why the solver could not run: not importable, no placement fits
        (``IntraOpInfeasible``), or the time budget left it no time or it found no placement
        within what was left (``IntraOpTimeLimit``). Any other error is a bug and raises."""
        if tp in self._solved:
            return self._solved[tp]
        shared = self._answers.solved.get(self._answer_key(tp))
        if shared is not None:
            self._solved[tp] = shared
            return shared
        try:
            from fxplan.intra_op import IntraOpInfeasible, IntraOpTimeLimit, solve_intra_op
        except ImportError as err:
            if _interrupted(err):  # Ctrl-C during a compiled module's init: not a missing solver
                raise KeyboardInterrupt from err
            self._solved[tp] = f"{type(err).__name__}: {err}"
            return self._solved[tp]
        limit = self.time_limit_s()
        if limit <= 0:
            # Not cached: the time budget, not the tp degree, is why.
            return f"time budget {self.budget.seconds:g} s spent before the solve for tp={tp}"
        mesh = LogicalMesh(self.cluster, (1, tp), ("dp", "tp"))
        try:
            self._solved[tp] = solve_intra_op(self.graph, mesh, time_limit_s=limit)
        except IntraOpInfeasible as err:
            self._solved[tp] = f"{type(err).__name__}: {err}"
        except IntraOpTimeLimit as err:
            return f"{type(err).__name__}: {err}"
        answer = self._solved[tp]
        if isinstance(answer, str) or answer.status == "optimal":   # not a matter of time
            self._answers.solved[self._answer_key(tp)] = answer
        return answer

    def placements(self, c: ParallelConfig) -> PlacementChoice:
        """The solver's placements for ``c``'s stage mesh, or the logged Megatron fallback."""
        result = self.solve(c.tp)
        if not isinstance(result, str):
            key = (id(result), *_dp_placements(c))
            made = self._answers.maps.get(key)
            if made is None or made[0] is not result:
                made = self._answers.maps[key] = (result, *_solver_map(self.graph, result, c))
            return _from_solver(self.graph, result, c, made[1:])
        reason = (f"intra-op solver not used ({result}); placements are the cost model's "
                  f"default Megatron layout (column/row tp={c.tp}, "
                  f"{'sequence-parallel' if c.sequence_parallel else 'replicated'} residual "
                  "stream), which is also what the step time was priced with")
        log.warning(reason)
        out = self.megatron(c)
        out.fallbacks.append(reason)
        return out

    def megatron(self, c: ParallelConfig) -> PlacementChoice:
        """:func:`megatron_placements` of ``c``, its map made once per distinct tp, dp entries
        and sequence parallelism."""
        key = (c.tp, *_dp_placements(c), c.sequence_parallel and c.tp > 1)
        maps = self._defaults.maps
        if key not in maps:
            maps[key] = (_megatron_map(self.graph, c),)
        return _megatron(self.graph, c, maps[key][0])


def _interrupted(err: BaseException) -> bool:
    """Whether a ``KeyboardInterrupt`` is in ``err``'s chain: a compiled extension interrupted
    while it initialises raises ``ImportError("initialization failed")`` from it (pybind11)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False
