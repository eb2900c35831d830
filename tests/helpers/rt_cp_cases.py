"""Jobs the rank pool runs for context parallelism: the tiny GPT and the tiny ``hf:llama``
train under a ``cp > 1`` plan like one process (:mod:`fxplan.runtime.styles.context_parallel`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from fxplan.core.plan import Plan
from fxplan.examples.models.lm import lm_loss
from fxplan.runtime.apply.graph import apply_plan


def with_cp(plan: Plan, cp: int) -> Plan:
    """``plan`` (``batch = dp·mb·m``) with context-parallel degree ``cp``: the ``dp/cp``
    replicas read ``batch / cp`` samples."""
    config = dataclasses.replace(plan.config, cp=cp)
    return dataclasses.replace(plan, config=config, batch=plan.batch // cp)


def _setup(model: str, cp: int, plan_kwargs: dict[str, Any]
           ) -> tuple[Plan, Any, Any, Any, Any]:
    """The plan, the model builder, the fixed batch, the one-process reference job and the
    loss the reference uses."""
    if model == "gpt":
        import rt_cases
        from rt_plans import build_model, fixed_batch, make_plan

        plan = with_cp(make_plan(**plan_kwargs), cp)
        layers = plan_kwargs.get("layers", 2)
        return (plan, lambda: build_model(layers, attention=plan_kwargs.get("attention", "math")),
                fixed_batch(plan), lambda steps: rt_cases.reference(plan, layers, steps), lm_loss)
    import rt_module_cases as cases

    plan = with_cp(cases.plan_for(cases.build("llama"), **plan_kwargs), cp)
    return (plan, lambda: cases.build("llama"), cases.batch(plan),
            lambda steps: cases.reference("llama", plan, steps), cases.lm_loss)


def cp_matches_reference(model: str, cp: int, plan_kwargs: dict[str, Any], steps: int = 3
                         ) -> dict[str, Any] | None:
    """Train ``steps`` SGD steps of ``model`` (``gpt`` or ``llama``) under ``plan_kwargs`` with
    ``cp``; losses and gathered parameters against one process on the whole batch (rank 0)."""
    from rt_cases import LR, relative_error, train_steps

    plan, build, batch, reference, loss_fn = _setup(model, cp, plan_kwargs)
    sharded = apply_plan(build(), plan, batch[0])
    if sharded is None:
        return None
    losses = train_steps(sharded, sharded.optimizer(torch.optim.SGD, lr=LR), batch, steps,
                         loss_fn)
    params = sharded.full_parameters()
    ref_losses, ref_params = reference(steps)
    errors = {k: relative_error(params[k], ref_params[k]) for k in ref_params if k in params}
    worst = max(errors, key=errors.get)
    return dict(path=sharded.path, fallbacks=sharded.fallbacks, losses=losses,
                ref_losses=ref_losses, missing=sorted(set(ref_params) - set(params)),
                loss_error=max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)),
                param_error=errors[worst], worst=worst,
                local_tokens=sharded.context.split(batch[0]).shape[1] if sharded.context else None)


def cp_collectives(recompute: str) -> dict[str, Any] | None:
    """One step of the tiny GPT under ``dp=2, cp=2`` (one CP group) with ``recompute``: the
    gloo all-gathers it really issues (the profiler's ``gloo:all_gather`` events: none is re-run
    under selective recompute, whose checkpointed attention call keeps the gathered K and V),
    the CP backward's reductions (``_AllGatherBackward``: a reduce-scatter, all-reduce + slice
    on gloo) and the bytes one forward all-gathers per layer (the gathered output)."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from rt_cases import LR

    plan, build, batch, _, loss_fn = _setup("gpt", 2, dict(dp=2, recompute=recompute))
    sharded = apply_plan(build(), plan, batch[0])
    if sharded is None:
        return None
    optimizer = sharded.optimizer(torch.optim.SGD, lr=LR)
    sharded.train_step(batch, loss_fn)   # a warm-up step: DDP's first-step broadcasts
    optimizer.step()
    gathered: list[int] = []
    original = dist.all_gather

    def counted(parts: list[torch.Tensor], tensor: torch.Tensor, group: Any = None,
                **kwargs: Any) -> Any:
        if group is sharded.context.group:
            gathered.append(sum(p.numel() * p.element_size() for p in parts))
        return original(parts, tensor, group=group, **kwargs)

    dist.all_gather = counted
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            sharded.train_step(batch, loss_fn)
    finally:
        dist.all_gather = original
    names = [event.name for event in prof.events()]
    layers = plan.stages[0].num_layers
    return dict(layers=layers, microbatches=plan.num_microbatches, mb=plan.microbatch_size,
                all_gathers=names.count("gloo:all_gather"),
                backward=names.count("_AllGatherBackward"), forward_bytes=gathered[:layers])
