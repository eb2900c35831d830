"""``fxplan.search(graph, cluster, batch=…) -> Plan``: the inter-op search (see
:mod:`fxplan.inter_op.driver` for the formulation). ``planner`` re-exports :func:`search`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any, Mapping

from fxplan.core.plan import Plan
from fxplan.inter_op.constraints import ConstraintError
from fxplan.inter_op.infeasible import InfeasibleError
from fxplan.inter_op.progress import PhaseTimer

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.examples.bundle import ModelBundle
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["search", "ConstraintError", "InfeasibleError", "capture_for_search",
           "training_dtype"]


def training_dtype(cluster: Cluster) -> str:
    """``bfloat16`` where the device has a bf16 peak, else ``float16`` where it has fp16 (V100),
    else ``float32``: the precision mixed-precision training would use there."""
    peaks = cluster.device(0).peak_tflops
    return "bfloat16" if "bf16" in peaks else "float16" if "fp16" in peaks else "float32"


@lru_cache(maxsize=8)
def _capture(model: str, seq: int | None, dtype: str) -> CapturedGraph:
    import torch

    from fxplan.passes.capture import capture

    return capture(model, batch=1, seq=seq, dtype=getattr(torch, dtype))


def capture_for_search(model: str | ModelBundle, *, seq: int | None = None,
                       dtype: str = "bfloat16", timer: PhaseTimer | None = None) -> CapturedGraph:
    """Capture ``model`` (a spec string or bundle) at microbatch 1 for the search.

    The cost model scales every segment by ``microbatch / 1``, so one capture serves every
    microbatch size the search tries. Captures of spec strings are cached (8 most recent).
    """
    import torch

    from fxplan.passes.capture import capture

    timer = timer or PhaseTimer()
    with timer("capture"):
        if isinstance(model, str):
            return _capture(model, seq, dtype)
        return capture(model, batch=1, seq=seq, dtype=getattr(torch, dtype))


def search(graph: CapturedGraph | str | ModelBundle, cluster: Cluster | str, *, batch: int,
           seq: int | None = None, time_budget_s: float | None = None, progress: bool = True,
           constraints: Mapping[str, Any] | None = None, finalists: int | None = None,
           model: str | None = None) -> Plan:
    """The fastest configuration of ``graph`` on ``cluster`` for global ``batch`` that fits.

    ``graph``: a :class:`passes.capture.CapturedGraph`, or a model spec (``"gpt-1.7b"``) or
    ``ModelBundle`` captured here (phase ``capture``). ``cluster``: a ``Cluster`` or a spec string.
    ``seq`` must match the captured sequence when given (ignored for a graph without a
    sequence dimension, as :func:`cost_model.estimate.estimate` does). ``constraints`` fixes
    fields of the candidates, each to a value or a collection of values: ``tp, pp, dp,
    microbatch_size, schedule, recompute, sequence_parallel, zero_stage``
    (:mod:`fxplan.inter_op.constraints`).
    ``finalists``: how many candidates the step simulator prices (default 8).
    ``time_budget_s`` bounds the whole search after capture (ranking, intra-op solves and
    simulation; see ``docs/planner.md``).
    Raises :class:`InfeasibleError` (a ``UserError``) when nothing fits and
    :class:`ConstraintError` (a ``UserError``) for invalid or over-restrictive constraints.
    """
    from fxplan.cluster_specs import Cluster
    from fxplan.cost_model.layer_costs import graph_segments
    from fxplan.core.errors import UserError
    from fxplan.inter_op.driver import DEFAULT_FINALISTS, run_search

    timer = PhaseTimer()
    if isinstance(cluster, str):
        cluster = Cluster.load(cluster)
    name = model or (graph if isinstance(graph, str) else getattr(graph, "name", "model"))
    if not hasattr(graph, "gm"):
        graph = capture_for_search(graph, seq=seq, dtype=training_dtype(cluster), timer=timer)
    # The cost model's reading of the graph (raises CostModelError, a user error, for a graph
    # without a batched input); ``seq`` is checked as cost_model.estimate checks it.
    captured_seq = graph_segments(graph).seq
    if seq is not None and captured_seq is not None and seq != captured_seq:
        raise UserError(f"seq={seq} but the graph was captured at seq={captured_seq}; capture "
                        "it at the sequence length to plan for")
    if batch < 1:
        raise UserError(f"batch must be a positive integer, got {batch}")
    plan = run_search(graph, cluster, batch=batch, model=str(name), time_budget_s=time_budget_s,
                      progress=progress, constraints=constraints or {},
                      finalists=finalists or DEFAULT_FINALISTS, timer=timer)
    return plan
