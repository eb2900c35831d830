"""``fxplan.plan(model, cluster, *, inputs, batch, plan=None, …)``: plan, then apply.

    sharded = fxplan.plan(model, "local-cpu:devices=4", inputs=(tokens,), batch=8)
    optimizer = sharded.optimizer(torch.optim.AdamW, lr=1e-3)
    loss = sharded.train_step((tokens, targets), lm_loss); optimizer.step(); optimizer.zero_grad()

1. The plan: ``plan=`` when given (a :class:`~fxplan.core.plan.Plan`, e.g. from ``load_plan``),
   otherwise :func:`fxplan.search` on the model captured at one sample of ``inputs`` in the
   cluster's training dtype (as ``fxplan plan`` captures). A given plan made by this function
   (its ``model`` is the module's class name) is refused when the module, captured the same way,
   has another graph fingerprint; a plan made from a model spec (``fxplan plan gpt-…``) cannot
   be compared with a module captured from ``inputs`` (the spec's capture includes the targets
   and loss), so only its world size is checked, and a log line says so.
2. Without ``torch.distributed`` initialised there is no mesh to apply it on: the Plan is
   returned and a message says so (plan and report only).
3. Otherwise every process applies it (:func:`fxplan.runtime.apply.apply_plan`) and gets its
   :class:`~fxplan.runtime.sharded_module.ShardedModule`; the world size must be the plan's.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any, Sequence

from fxplan.core.plan import Plan, PlanError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from fxplan.cluster_specs import Cluster
    from fxplan.passes.captured_graph import CapturedGraph
    from fxplan.runtime.sharded_module import ShardedModule

__all__ = ["plan"]

logger = logging.getLogger("fxplan.planner")


def _capture(model: "torch.nn.Module", cluster: Cluster, inputs: tuple) -> CapturedGraph:
    """The module at one sample of ``inputs`` in ``cluster``'s training dtype (as the CLI)."""
    import torch

    from fxplan.passes.capture import capture
    from fxplan.inter_op import training_dtype

    one_sample = tuple(x[:1] for x in inputs)
    return capture(model, inputs=one_sample, dtype=getattr(torch, training_dtype(cluster)))


def _load_cluster(cluster: str | Cluster) -> Cluster:
    from fxplan.cluster_specs import Cluster

    return Cluster.load(cluster) if isinstance(cluster, str) else cluster


def _search(model: "torch.nn.Module", cluster: str | Cluster, inputs: tuple, batch: int,
            seq: int | None, search_options: dict[str, Any]) -> Plan:
    from fxplan.inter_op import search

    cluster = _load_cluster(cluster)
    graph = _capture(model, cluster, inputs)
    return search(graph, cluster, batch=batch, seq=seq, progress=False,
                  model=type(model).__name__, **search_options)


def _check_graph(model: "torch.nn.Module", chosen: Plan, cluster: str | Cluster,
                 inputs: tuple) -> None:
    """Refuse a given plan for another graph when the module can be captured as it was."""
    if chosen.model != type(model).__name__:
        logger.info("plan for model %r (not made from this %s module): its graph fingerprint "
                    "is not checked, only its world size", chosen.model, type(model).__name__)
        return
    graph = _capture(model, _load_cluster(cluster), inputs)
    chosen.check_matches(graph_fingerprint=graph.fingerprint(),
                         source=f"plan (compared with the {type(model).__name__} module "
                                "captured at one sample of inputs=)")


def plan(model: "torch.nn.Module", cluster: str | Cluster, *, inputs: Any, batch: int,
         plan: Plan | None = None, seq: int | None = None, ranks: Sequence[int] | None = None,
         debug: bool = False, **search_options: Any) -> "ShardedModule | Plan | None":
    """Search (or take ``plan``) and apply it on the current process group.

    Returns the :class:`ShardedModule` of this process, ``None`` on a process outside
    ``ranks``, or — without ``torch.distributed`` initialised — the :class:`Plan` itself.
    """
    import torch.distributed as dist

    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    if plan is not None:
        _check_graph(model, plan, cluster, inputs)
    chosen = plan if plan is not None else _search(model, cluster, inputs, batch, seq,
                                                   search_options)
    if chosen.batch != batch:
        raise PlanError(f"plan is for global batch {chosen.batch}, but batch={batch} was given")
    if not dist.is_available() or not dist.is_initialized():
        print(
            f"fxplan: torch.distributed is not initialised, so the plan is reported, not "
            f"applied: {chosen.summary} (needs {chosen.world_size} ranks). Run under torchrun "
            "(or `fxplan launch plan.json`) to train with it.",
            file=sys.stderr,
        )
        return chosen
    world = dist.get_world_size()
    needed = len(ranks) if ranks is not None else world
    chosen.check_matches(world_size=needed, source="plan")
    from fxplan.runtime.apply import apply_plan

    return apply_plan(model, chosen, inputs, ranks=ranks, debug=debug)
