"""``search(graph, cluster, batch=…) -> Plan``: the inter-op search of a captured graph (see
:mod:`fxplan.inter_op.driver` for the formulation). :func:`fxplan.search` is the public entry
that also takes a model spec and captures it first.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from fxplan.core.plan import Plan
from fxplan.inter_op.constraints import ConstraintError
from fxplan.inter_op.infeasible import InfeasibleError
from fxplan.inter_op.progress import PhaseTimer

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["search", "ConstraintError", "InfeasibleError"]


def search(graph: CapturedGraph, cluster: Cluster | str, *, batch: int,
           seq: int | None = None, time_budget_s: float | None = None, progress: bool = True,
           constraints: Mapping[str, Any] | None = None, finalists: int | None = None,
           model: str | None = None, timer: PhaseTimer | None = None,
           memory_headroom: Any = None, runnable: Any = None,
           state_layout: str = "runtime") -> Plan:
    """The fastest configuration of ``graph`` on ``cluster`` for global ``batch`` that fits.

    ``graph``: a :class:`~fxplan.passes.captured_graph.CapturedGraph` (capture it with
    :func:`fxplan.capture`, or call :func:`fxplan.search` with a model spec).
    ``cluster``: a ``Cluster`` or a spec string. ``timer``: the phase timer of a caller
    that captured the graph, so its ``capture`` phase shows in the plan's timings.
    ``seq`` must match the captured sequence when given (ignored for a graph without a
    sequence dimension, as :func:`cost_model.step.estimate.estimate` does). ``constraints`` fixes
    fields of the candidates, each to a value or a collection of values: ``tp, pp, dp,
    microbatch_size, schedule, recompute, sequence_parallel, zero_stage``
    (:mod:`fxplan.inter_op.constraints`).
    ``finalists``: how many candidates the step simulator prices (default 8).
    ``time_budget_s`` bounds the whole search after capture (ranking, intra-op solves and
    simulation; see ``docs/planner.md``).
    ``memory_headroom``: what every device must leave free — a fraction (``0.1``, ``"10%"``)
    or GiB (``"4GiB"``); ``None``: 5 % (:mod:`fxplan.cost_model.memory.headroom`). A plan
    whose estimated peak does not leave it is refused, and the pruning reasons say so.
    ``runnable``: the runtime's check of a plan on this model (``plan -> reason | None``;
    :func:`fxplan.api.runtime_check` builds it), asked of the finalists best first: a plan it
    refuses is pruned with its reason, never offered. ``state_layout``: the layout of the
    model states every candidate is priced in — ``runtime`` (fxplan's runtime: fp32
    parameters as the masters, fp32 gradients and reductions) or ``megatron`` (16-bit weights
    and gradients beside fp32 masters, as Megatron-LM and DeepSpeed keep them;
    :mod:`fxplan.cost_model.memory.breakdown`). Raises :class:`InfeasibleError` (a
    ``UserError``) when nothing fits and
    :class:`ConstraintError` (a ``UserError``) for invalid or over-restrictive constraints.
    """
    from fxplan.cluster_specs import Cluster
    from fxplan.cost_model.step.layer_costs import graph_segments
    from fxplan.core.errors import UserError
    from fxplan.cost_model.compute.op_database import frozen_databases
    from fxplan.cost_model.memory.breakdown import STATE_LAYOUTS
    from fxplan.inter_op.driver import DEFAULT_FINALISTS, run_search

    timer = timer or PhaseTimer()
    from fxplan.cost_model.memory.headroom import parse_headroom

    check_search_arguments(batch=batch, seq=seq, time_budget_s=time_budget_s,
                           finalists=finalists, constraints=constraints)
    headroom = parse_headroom(memory_headroom)
    if state_layout not in STATE_LAYOUTS:
        raise UserError(f"state_layout={state_layout!r}: expected one of "
                        f"{', '.join(STATE_LAYOUTS)} (runtime: what fxplan's runtime keeps; "
                        "megatron: Megatron-LM's and DeepSpeed's mixed-precision layout)")
    cluster = Cluster.load(cluster)
    if not hasattr(graph, "gm"):
        raise UserError(f"search() takes a captured graph, got {type(graph).__name__}; "
                        "fxplan.search takes a model spec or module and captures it")
    name = model or graph.name
    # The cost model's reading of the graph (raises CostModelError, a user error, for a graph
    # without a batched input); ``seq`` is checked as cost_model.estimate checks it.
    captured_seq = graph_segments(graph).seq
    if seq is not None and captured_seq is not None and seq != captured_seq:
        raise UserError(f"seq={seq} but the graph was captured at seq={captured_seq}; capture "
                        "it at the sequence length to plan for")
    # the op databases on the search path are read once for the whole search
    with frozen_databases(), _collector_skips_older_objects():
        return run_search(graph, cluster, batch=batch, model=str(name),
                          time_budget_s=time_budget_s, progress=progress,
                          constraints=constraints or {},
                          finalists=finalists or DEFAULT_FINALISTS, timer=timer,
                          memory_headroom=headroom, runnable=runnable,
                          state_layout=state_layout)


#: The cyclic collector's youngest-generation threshold while a search runs (Python's
#: default is 700 allocations).
_SEARCH_GC_THRESHOLD = 5000


@contextmanager
def _collector_skips_older_objects() -> Iterator[None]:
    """Python's cyclic garbage collector leaves the objects alive before the search alone
    while it runs (:func:`gc.freeze`): its full collections would otherwise walk the captured
    graph and torch's modules, hundreds of thousands of objects, each time — a sixth of a
    search of GPT-3 175B on 1024 GPUs. It also collects less often
    (:data:`_SEARCH_GC_THRESHOLD`): the search allocates millions of short-lived arrays and
    configurations, and at the default threshold their survivors reach the oldest generation
    and trigger full collections. What the search leaves is collected as usual; a caller's
    own freeze is left as it is, and the thresholds are restored."""
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], _SEARCH_GC_THRESHOLD), *thresholds[1:])
    frozen = gc.get_freeze_count() > 0
    if not frozen:
        gc.freeze()
    try:
        yield
    finally:
        if not frozen:
            gc.unfreeze()
        gc.set_threshold(*thresholds)


def check_search_arguments(*, batch: Any, seq: Any = None, time_budget_s: Any = None,
                           finalists: Any = None, constraints: Any = None) -> None:
    """Types and physical ranges of :func:`search`'s arguments (:mod:`fxplan.core.bounds`),
    checked before any work: ``batch`` an ``int`` in 1 … 2²⁴ (``16.0``, ``"16"`` and ``True``
    are refused), ``seq`` ``None`` or an ``int`` in 1 … 2²⁴, ``time_budget_s`` ``None`` or a
    finite number of seconds in [0, one week] (0: keep the first plan found), ``finalists`` ``None`` or an ``int`` in
    1 … 1000, ``constraints`` ``None`` or a mapping."""
    from fxplan.core.bounds import (MAX_BATCH, MAX_SEQ, MAX_TIME_BUDGET_S, BoundsError,
                                    check_count, check_number)

    check_count("batch", batch, high=MAX_BATCH)
    if seq is not None:
        check_count("seq", seq, high=MAX_SEQ)
    if time_budget_s is not None:
        check_number("time_budget_s", time_budget_s, high=MAX_TIME_BUDGET_S, low_open=False)
    if finalists is not None:
        check_count("finalists", finalists, high=1000)
    if constraints is not None and not isinstance(constraints, Mapping):
        raise BoundsError(f"constraints = {constraints!r} ({type(constraints).__name__}): "
                          "expected a mapping such as {'tp': 8, 'pp': [1, 2]}")
