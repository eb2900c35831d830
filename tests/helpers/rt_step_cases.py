"""Jobs the rank pool runs: what one training step issues (schedule, gradient sync)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

import fxplan.runtime.apply.sharded_module as sharded_module
from fxplan.examples.models.lm import lm_loss
from fxplan.runtime.apply.graph import apply_plan
from rt_plans import build_model, fixed_batch, make_plan


def _in_backward() -> bool:
    """Whether the autograd engine is running a backward on this thread."""
    return torch._C._current_graph_task_id() != -1


def step_gradient_syncs(plan_kwargs: dict[str, Any], steps: int = 2) -> dict[str, Any] | None:
    """Train ``steps`` steps of a plan counting per step the dp gradient reductions — FSDP2's
    reduce-scatters (``dist.reduce_scatter_single``) or DDP's bucket all-reduces (a comm hook
    that runs the default all-reduce) —, how many of them ran inside a backward and how many
    DDP buckets were reduced more than once in a step. A ``pp = 1`` plan runs on ranks 0, 1
    with the pipeline schedule builder made to fail; a ``pp > 1`` plan on every pool rank,
    through its schedule (``None`` from ranks outside the plan)."""
    plan = make_plan(**plan_kwargs)
    batch = fixed_batch(plan)
    pipelined = plan.pp > 1
    sharded = apply_plan(build_model(2), plan, batch[0],
                         ranks=None if pipelined else [0, 1])
    if sharded is None:
        return None
    calls: list[bool] = []
    buckets: list[int] = []
    (stage,) = sharded.stages
    if isinstance(stage.module, torch.nn.parallel.DistributedDataParallel):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations
            calls.append(_in_backward())
            buckets.append(bucket.index())
            return allreduce_hook(state, bucket)

        stage.module.register_comm_hook(sharded.mesh["dp"].get_group(), hook)
    # FSDP2 reduce-scatters with dist.reduce_scatter_single from torch 2.13, with
    # dist.reduce_scatter_tensor before it
    name = "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"
    original = getattr(dist, name)

    def reduce_scatter(*args: Any, **kwargs: Any) -> Any:
        calls.append(_in_backward())
        return original(*args, **kwargs)

    def no_schedule(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("pp = 1 built a pipeline schedule")

    built = sharded_module.build_schedule
    setattr(dist, name, reduce_scatter)
    if not pipelined:
        sharded_module.build_schedule = no_schedule
    per_step, in_backward, losses, repeated = [], [], [], []
    try:
        for _ in range(steps):
            calls.clear()
            buckets.clear()
            losses.append(float(sharded.train_step(batch, lm_loss)))
            per_step.append(len(calls))
            in_backward.append(sum(calls))
            repeated.append(len(buckets) - len(set(buckets)))
            for param in sharded.parameters():
                param.grad = None
    finally:
        setattr(dist, name, original)
        sharded_module.build_schedule = built
    fsdp_groups = sum(1 for m in stage.module.modules()
                      if isinstance(m, torch.distributed.fsdp.FSDPModule))
    return dict(per_step=per_step, in_backward=in_backward, fsdp_groups=fsdp_groups,
                repeated_buckets=repeated,
                plain_loop=sharded.plain_loop, losses=losses)
