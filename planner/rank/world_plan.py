"""The plan for the world a job got: the saved plan, or, after a resize, the plan rank 0 finds
for the resized cluster and broadcasts to every rank."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["plan_for_world"]


def plan_for_world(plan: "Plan", world: int, run_dir: str) -> "tuple[Plan, Any]":
    """``plan`` when the world this job got is the plan's (case b: a restart, no replanning);
    otherwise the plan :func:`fxplan.replan.replan` finds for the plan's cluster resized to
    ``world`` devices — computed by rank 0, saved to ``RUN_DIR/plans/``, broadcast to every
    rank (collective). Returns ``(plan, Replan or None)``; a failed search ends every rank
    with rank 0's message."""
    from fxplan.core.plan import Plan
    from fxplan.replan import replan

    if world == plan.world_size:
        return plan, None
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            found = replan(plan, world=world)
            path = Path(run_dir) / "plans" / f"plan-world{world}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            found.new.save(path)
            box[0] = (found.new.to_dict(), found.replan_time_s, found.import_s, found.cpu_s)
        except Exception as err:  # every rank must hear of it, not wait in the broadcast
            box[0] = f"{type(err).__name__}: {err}"
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], str):
        raise RuntimeError(f"replanning {plan.summary} for a world of {world} failed on rank 0: "
                           f"{box[0]}")
    from fxplan.replan import Replan

    new = Plan.from_dict(box[0][0], source="replanned plan")
    return new, Replan(plan, new, *box[0][1:])
