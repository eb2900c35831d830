"""Jobs the rank pool runs for a ZeRO stage or an offload per pipeline rank: what each rank
built."""

from __future__ import annotations

from typing import Any

import torch

from fxplan.core.plan import Plan
from fxplan.runtime.apply.graph import apply_plan
from rt_plans import build_model, fixed_batch


def rank_wrappers(plan_json: str) -> dict[str, Any] | None:
    """This rank's pipeline rank, the class names of its stages' wrappers and of its optimizer
    (``None`` on a rank outside the plan)."""
    plan = Plan.from_json(plan_json)
    sharded = apply_plan(build_model(sum(s.num_layers for s in plan.stages)), plan,
                         fixed_batch(plan)[0])
    if sharded is None:
        return None
    optimizer = sharded.optimizer(torch.optim.SGD, lr=0.1)
    return {"pp": sharded.coordinate["pp"],
            "wrappers": [type(stage.module).__name__ for stage in sharded.stages],
            "optimizer": type(optimizer).__name__,
            "offload_policies": sorted({type(policy).__name__
                                        for stage in sharded.stages
                                        for policy in _offload_policies(stage.module)})}


def _offload_policies(module: torch.nn.Module) -> list[Any]:
    """The ``offload_policy`` of every FSDP2 parameter group under ``module``."""
    out = []
    for sub in module.modules():
        state = getattr(sub, "_get_fsdp_state", None)
        group = state()._fsdp_param_group if state is not None else None
        if group is not None:
            out.append(group.offload_policy)
    return out
