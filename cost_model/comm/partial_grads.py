"""Which gradients come out of a tensor-parallel backward as partial sums, and their reduction.

Under sequence parallelism the residual stream is split along the sequence over the ``tp``
ranks. A parameter the layout keeps replicated (``TPLayout.sharded_params`` does not hold
it) and that is applied to that split stream — every layer norm's weight and bias, the
position embedding — gets on each tp rank the gradient of its own sequence shard only: the
true gradient is the sum over the tp ranks (DTensor leaves it ``Partial(sum)``). The one
exception is a row-parallel linear's bias: it is added after the row-parallel output is
reduce-scattered, and the runtime's ``RowwiseParallel`` gives it a ``Replicate`` gradient.
(Without sequence parallelism every such parameter sees the whole replicated activation and
its gradient is complete.)

The runtime reduces all of them after the backward in **one** flattened all-reduce over the
stage's tp group (:mod:`fxplan.runtime.apply.partial_grads`), so per step and stage, with
``Ψ_P`` the elements of those parameters on the stage and ``k_g`` the gradient bytes per
element::

    t_partial = all_reduce(k_g · Ψ_P, tp group)          (0 when Ψ_P = 0, tp = 1 or no sp)

Megatron-LM does the same on GPUs (``allreduce_layernorm_grads`` under sequence
parallelism), so the term holds on every device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fxplan.cost_model.parallel.megatron_layout import used_params
from fxplan.cost_model.parallel.tp_layout import tp_layout

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.config import ParallelConfig
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["partial_grad_params"]


def partial_grad_params(graph: CapturedGraph, config: ParallelConfig) -> frozenset[str]:
    """Parameters whose gradient is a partial sum over tp under ``config`` (module
    docstring); empty without tensor and sequence parallelism. Memoised per graph."""
    if config.tp <= 1 or not config.sequence_parallel:
        return frozenset()
    key = ("partial_grad_params", config.placements)
    if key not in graph.memo:
        layout = tp_layout(graph, config.placements)
        names: set[str] = set()
        for node, _ in graph.nodes():
            if node.name in layout.row:
                continue
            names.update(p for p in used_params(node, graph) if p not in layout.sharded_params)
        graph.memo[key] = frozenset(names)
    return graph.memo[key]
