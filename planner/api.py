"""``planner.plan(model, cluster, *, inputs, batch, plan=None, …)``: plan, then apply.

    sharded = planner.plan(model, "local-cpu:devices=4", inputs=(tokens,), batch=8)
    optimizer = sharded.optimizer(torch.optim.AdamW, lr=1e-3)
    loss = sharded.train_step((tokens, targets), lm_loss); optimizer.step(); optimizer.zero_grad()

1. The plan: ``plan=`` when given (a :class:`~planner.plan_spec.Plan`, e.g. from ``load_plan``),
   otherwise :func:`planner.search` on the model captured at one sample of ``inputs``.
2. Without ``torch.distributed`` initialised there is no mesh to apply it on: the Plan is
   returned and a message says so (plan and report only).
3. Otherwise every process applies it (:func:`planner.runtime.apply.apply_plan`) and gets its
   :class:`~planner.runtime.sharded_module.ShardedModule`; the world size must be the plan's.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any, Sequence

from planner.cli.errors import UserError
from planner.plan_spec import Plan, PlanError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from planner.runtime.sharded_module import ShardedModule

__all__ = ["plan"]

logger = logging.getLogger("fxplan.planner")


def _search(model: "torch.nn.Module", cluster: Any, inputs: tuple, batch: int,
            seq: int | None, search_options: dict[str, Any]) -> Plan:
    try:
        from planner.inter_op import search
    except ImportError as err:
        raise UserError(
            f"planner.search is not available in this installation ({err}); pass a plan "
            "explicitly: planner.plan(model, cluster, inputs=…, batch=…, plan=load_plan(path))"
        ) from err
    from passes.capture import capture

    one_sample = tuple(x[:1] for x in inputs)
    graph = capture(model, inputs=one_sample)
    return search(graph, cluster, batch=batch, seq=seq, progress=False,
                  model=type(model).__name__, **search_options)


def plan(model: "torch.nn.Module", cluster: Any, *, inputs: Any, batch: int,
         plan: Plan | None = None, seq: int | None = None, ranks: Sequence[int] | None = None,
         debug: bool = False, **search_options: Any) -> "ShardedModule | Plan | None":
    """Search (or take ``plan``) and apply it on the current process group.

    Returns the :class:`ShardedModule` of this process, ``None`` on a process outside
    ``ranks``, or — without ``torch.distributed`` initialised — the :class:`Plan` itself.
    """
    import torch.distributed as dist

    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
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
    from planner.runtime.apply import apply_plan

    return apply_plan(model, chosen, inputs, ranks=ranks, debug=debug)
