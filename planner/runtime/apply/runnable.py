"""Whether the runtime can apply a plan to a model: asked by the search before it offers one.

:func:`fxplan.runtime.apply.graph.apply_plan` decides on every rank, after the workers start, how a
plan runs: on the user's module (:func:`fxplan.runtime.apply.module.module_level_plan`), else
as the graph rewrite, else not at all. :func:`runtime_refusal` takes the same decision on one
process, on the model built on ``meta`` (fake tensors: nothing is allocated, no process
group), and says why the plan cannot run:

* the expert-parallel checks refuse it (``ep`` against the model's experts);
* a zero-bubble schedule beside data parallelism that needs FSDP2 (ZeRO-2/3, ZeRO-1 with
  tp or ep; ZeRO-0 and ZeRO-1 run, ``offload=optimizer`` too, their gradients averaged
  after the step: :func:`~fxplan.runtime.train.pipeline.zero_bubble_refusal`), or on a torch
  without the schedule;
* ``zbv`` and ``dualpipev`` put the first and the last stage on one rank, where a weight tied
  between the embedding and the head cannot be kept tied
  (:func:`~fxplan.runtime.apply.tied.same_rank_refusal`);
* the module level refuses it (:class:`~fxplan.runtime.styles.tp_styles.NotExpressible`: a pipeline
  cut the model's forward does not allow, placements without a parallel style, attention
  that reshapes by a head count fixed in the code, selective recompute in blocks that call
  no fused attention, …) and the graph rewrite cannot take it:
  it needs a model ``torch.fx.symbolic_trace`` traces (``graph_rewrite=False`` for a model
  captured by ``torch.export``, every Hugging Face model); context parallelism runs at module
  level only; and a plan with ``tp > 1`` is not offered for the graph rewrite when its
  tensor-parallel program would run an op DTensor has no strategy for (``rewrite_tp``: the
  reason, e.g. a torch whose DTensor cannot merge a sharded dimension in a view, or the
  CPU's fused attention kernel, which :func:`graph_rewrite_tp_refusal` finds in the captured
  graph).

Its answer is a sentence (the search's pruning reason) or ``None``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
from torch import nn

from fxplan.core.errors import UserError
from fxplan.core.torch_support import FEATURES, installed_torch, torch_has
from fxplan.runtime.styles.context_parallel import cp_degree
from fxplan.runtime.apply.module import module_level_plan
from fxplan.runtime.apply.module_tied import tied_aliases
from fxplan.runtime.train.pipeline import zero_bubble_refusal
from fxplan.runtime.apply.tied import same_rank_refusal
from fxplan.runtime.styles.tp_styles import NotExpressible

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["graph_rewrite_tp_refusal", "graph_rewrite_tp_torch_refusal", "runtime_refusal"]


def graph_rewrite_tp_refusal(graph: "CapturedGraph", cpu: bool) -> str | None:
    """Why the graph rewrite cannot run a tensor-parallel plan of ``graph`` (``None``: it
    can): the installed torch lacks DTensor's view propagation the rewrite's sharded views
    need (:func:`graph_rewrite_tp_torch_refusal`); on CPU devices (``cpu``)
    ``F.scaled_dot_product_attention`` dispatches to the CPU flash kernel, for which DTensor
    registers no sharding strategy, so the stage fails on every rank."""
    refusal = graph_rewrite_tp_torch_refusal()
    if refusal or not cpu:
        return refusal
    for node in graph.gm.graph.nodes:
        if node.op == "call_function" and "scaled_dot_product_attention" in str(
                getattr(node.target, "__name__", node.target)):
            return (f"its {node.name} (scaled_dot_product_attention) runs the CPU flash "
                    "kernel, for which DTensor has no sharding strategy")
    return None


def graph_rewrite_tp_torch_refusal() -> str | None:
    """Why the installed torch cannot run the graph rewrite with ``tp > 1`` (``None``: it
    can): its DTensor must merge a sharded dimension with its neighbours in a view
    (feature ``dtensor_view_sharding``)."""
    if torch_has("dtensor_view_sharding"):
        return None
    return (f"it needs {FEATURES['dtensor_view_sharding'][2]}, which this torch "
            f"({installed_torch()}) does not have")


def runtime_refusal(model: nn.Module, plan: "Plan", inputs: Sequence[torch.Tensor], *,
                    graph_rewrite: bool, rewrite_tp: str | None = None) -> str | None:
    """Why the runtime cannot apply ``plan`` to ``model`` called on ``inputs`` (one or more
    microbatches; module docstring), or ``None`` when it can. ``graph_rewrite``: whether the
    graph rewrite can take a plan the module level refuses; ``rewrite_tp``: why it cannot
    take one with ``tp > 1`` (``None``: it can)."""
    from fxplan.runtime.styles.expert_parallel import check_expert_layers, check_expert_parallel

    try:
        check_expert_parallel(plan)
        check_expert_layers(model, plan)
    except UserError as err:
        return str(err)
    refusal = zero_bubble_refusal(plan)
    if refusal:
        return refusal
    if plan.schedule.v_shape:   # the first and the last stage on one rank (runtime.tied)
        last = plan.pp * plan.virtual_stages - 1
        refusal = same_rank_refusal(plan, {first: (0, last) for first in
                                           set(tied_aliases(model).values())})
        if refusal:
            return refusal
    cp = cp_degree(plan)
    inputs = tuple(x.narrow(1, 0, x.size(1) // cp) if cp > 1 and x.dim() > 1 and
                   x.size(1) == plan.seq else x for x in inputs)
    try:
        module_level_plan(model, plan, inputs)
    except NotExpressible as why:
        if cp > 1:
            return f"context parallelism runs at module level only, which refuses it: {why}"
        if not graph_rewrite:
            return (f"the module level refuses it ({why}), and the graph rewrite needs a model "
                    "torch.fx.symbolic_trace can trace")
        if plan.tp > 1 and rewrite_tp:
            return (f"the module level refuses it ({why}), and the graph rewrite cannot run "
                    f"it tensor-parallel: {rewrite_tp}")
    return None
