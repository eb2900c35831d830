"""Data parallelism and ZeRO over the ``dp`` mesh axis, applied to one pipeline stage.

With ``dp`` replicas each rank sees ``1/dp`` of the batch and gradients are averaged,
``g = (1/dp) Σ_r g_r``, so SGD on the replicas equals SGD on the whole batch. The ZeRO stage
decides what else is split over ``dp`` (Rajbhandari et al., 2020):

    stage 0  nothing:        replicate each block, all-reduce grads   DDP (tp = 1) or
                                                                      ``replicate`` (FSDP2-based,
                                                                      composes with TP DTensors)
    stage 1  optimizer state: as stage 0 + ``ZeroRedundancyOptimizer`` over the dp group
    stage 2  + gradients:     ``fully_shard(reshard_after_forward=False)`` (reduce-scatter grads,
                              keep the gathered parameters between forward and backward)
    stage 3  + parameters:    ``fully_shard(reshard_after_forward=True)``; with
                              ``offload=optimizer+params``, ``offload_policy=CPUOffloadPolicy()``
                              (:mod:`fxplan.runtime.apply.offload`)

``offload=optimizer`` leaves the wrapping alone at every stage: :func:`make_optimizer` builds
the optimizer to step on the host (:mod:`fxplan.runtime.train.host_optimizer`), ZeRO-1's
``ZeroRedundancyOptimizer`` included (its partition's optimizer is the host one).

FSDP/replicate wrap every block (the outlined ``layer_i`` of the graph rewrite, recompute
wrapper included, or the user's ``model.layers.N`` at module level) and then the stage root, so parameters are gathered block by block. With ``tp > 1`` the parameters are
already DTensors on the ``tp`` axis and FSDP2 shards them further on ``dp`` (2-D mesh).
ZeRO-1 relies on ``ZeroRedundancyOptimizer``, which broadcasts plain tensors and cannot hold
DTensor parameters; with ``tp > 1`` (Megatron's distributed optimizer with TP, which the planner
does pick) it runs as ``fully_shard(reshard_after_forward=False)`` on dp instead — the ZeRO-2
layout: optimizer state sharded as planned, gradients reduce-scattered as well, so the same
values with less memory than the plan's ZeRO-1 estimate — with a plain optimizer over the
dp-sharded DTensors. That is a fallback: logged, and listed in ``ShardedModule.fallbacks``.

Beside a zero-bubble pipeline (``zb``, ``zbv``, ``dualpipev``) with ``dp > 1`` neither wrapper
follows torch's split backward: the stage stays unwrapped and its gradients are averaged over
dp after the schedule's step (:mod:`fxplan.core.zero_bubble_dp`,
:mod:`fxplan.runtime.train.dp_reduce`); ZeRO-1's optimizer is the same.

With a ZeRO stage or an offload per pipeline rank (``zero_stages``, ``offload_stages``) each
rank wraps its stages and builds its optimizer under its own stage and offload
(:func:`rank_plan`; ``CPUOffloadPolicy`` on the ``offload=optimizer+params`` ranks'
``fully_shard`` only, the host optimizer on the ``offload=optimizer`` ones): the
ranks of one stage's dp group share it, so their collectives match, and a rank's wrapping never
meets another rank's parameters.

Mixed precision (:mod:`fxplan.runtime.apply.precision`) rides on the same wrappers: FSDP2
(``fully_shard``, ``replicate``) takes its ``MixedPrecisionPolicy``, a DDP or unwrapped stage
runs its forward under ``torch.autocast``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from fxplan.core.fallbacks import record_fallback
from fxplan.core.zero_bubble_dp import reduces_after_step
from fxplan.runtime.apply.mesh import mesh_coordinate
from fxplan.runtime.apply.offload import offload_policy
from fxplan.runtime.apply.precision import Precision, autocast_stage, mixed_precision_policy
from fxplan.runtime.train.host_optimizer import host_offloaded

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["apply_data_parallel", "make_optimizer", "rank_plan", "zero1_fallback"]


def rank_plan(plan: "Plan", mesh: DeviceMesh | None) -> "Plan":
    """``plan`` as this process's pipeline rank applies it (its own ZeRO stage under
    ``zero_stages``: :meth:`~fxplan.core.plan.Plan.at_pipeline_rank`); ``plan`` itself without
    a mesh or outside it."""
    coordinate = mesh_coordinate(mesh) if mesh is not None else None
    if coordinate is None or "pp" not in coordinate:
        return plan
    return plan.at_pipeline_rank(coordinate["pp"])


def _blocks(stage: nn.Module) -> list[nn.Module]:
    return [m for name, m in stage.named_children() if name.startswith("layer_")]


def zero1_fallback(plan: "Plan") -> str | None:
    """The fallback line when the plan's ZeRO-1 runs as FSDP2 (``tp > 1``), else ``None``."""
    if plan.zero_stage != 1 or plan.dp == 1 or (plan.tp == 1 and plan.config.ep == 1):
        return None
    what = f"tp={plan.tp}" if plan.tp > 1 else f"ep={plan.config.ep}"
    over = "dp" if plan.config.ep == 1 else "dp (the expert weights over their dp/ep ranks)"
    return (f"[data-parallel] ZeRO-1 with {what} runs as FSDP2 fully_shard("
            f"reshard_after_forward=False) over {over} (ZeroRedundancyOptimizer cannot hold "
            "DTensor parameters): gradients are reduce-scattered too; same values, less memory "
            "than the plan's ZeRO-1 estimate")


def fsdp_shard_dim(param: nn.Parameter) -> Any:
    """FSDP2's dp shard of ``param``: ``Shard(0)`` (its default), except for a tensor-parallel
    parameter strided over tp on dim 0 (``_StridedShard``: head-parallel attention's fused
    ``in_proj_weight``), which FSDP2 would describe as a plain tp ``Shard(0)`` — its gathered
    value would have the rows in the wrong order — so it is sharded over dp on its next dim."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if isinstance(param, DTensor) and param.ndim > 1 and any(
            isinstance(p, _StridedShard) and p.dim == 0 for p in param.placements):
        return Shard(1)
    return None  # FSDP2's default, Shard(0)


def apply_data_parallel(stage: nn.Module, plan: "Plan", mesh: DeviceMesh,
                        fallbacks: list[str] | None = None,
                        blocks: Sequence[nn.Module] | None = None,
                        precision: Precision | None = None,
                        ignored: set[nn.Parameter] | None = None) -> nn.Module:
    """Wrap ``stage`` for the plan's dp degree and ZeRO stage (table in the module docstring);
    a fallback taken is logged and appended to ``fallbacks``. ``blocks``: the repeated blocks
    to wrap one by one (default: the outlined ``layer_i`` children of a graph-rewrite stage;
    the module-level path passes the user's ``model.layers.N``). ``precision``: mixed
    precision (:mod:`fxplan.runtime.apply.precision`): FSDP2's policy where FSDP2 wraps the stage,
    autocast around its forward otherwise (default: fp32). ``ignored``: parameters neither
    wrapper touches (the expert weights of expert parallelism without expert ZeRO, reduced by
    :class:`fxplan.runtime.styles.expert_parallel.ExpertGradSync`; with it they are nested FSDP2
    modules of their own group, :mod:`fxplan.runtime.styles.expert_zero`, which the wrappers skip)."""
    precision = precision or Precision()
    plan = rank_plan(plan, mesh)   # this pipeline rank's own ZeRO stage
    if plan.dp == 1 or reduces_after_step(plan.config):   # zero-bubble: no wrapper, a pass
        return autocast_stage(stage, precision, mesh.device_type)   # after the step
    dp_mesh = mesh["dp"]
    line = zero1_fallback(plan)
    extra = {"ignored_params": set(ignored)} if ignored else {}
    if line is not None:
        record_fallback(fallbacks, line)
    if plan.zero_stage in (2, 3) or line is not None:
        from torch.distributed.fsdp import fully_shard

        reshard = plan.zero_stage == 3  # ZeRO-1 with tp > 1 (fallback): False, as ZeRO-2
        for block in _blocks(stage) if blocks is None else blocks:
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard,
                        shard_placement_fn=fsdp_shard_dim, **_fsdp_policies(precision, plan),
                        **extra)
        fully_shard(stage, mesh=dp_mesh, reshard_after_forward=reshard,
                    shard_placement_fn=fsdp_shard_dim,
                    **_fsdp_policies(precision, plan, root=True), **extra)
        return stage
    if plan.tp == 1:
        from torch.nn.parallel import DistributedDataParallel

        stage = autocast_stage(stage, precision, mesh.device_type)
        if ignored:
            skip = [n for n, p in stage.named_parameters() if p in ignored]
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(stage, skip)
        # the gradients are views into DDP's buckets: no second fp32 copy of every gradient
        # beside them (4 B per parameter; what the memory model prices has none)
        return DistributedDataParallel(stage, process_group=dp_mesh.get_group(),
                                       gradient_as_bucket_view=True)
    from torch.distributed._composable.replicate_with_fsdp import replicate

    for block in _blocks(stage) if blocks is None else blocks:
        replicate(block, mesh=dp_mesh, **_fsdp_policies(precision), **extra)
    replicate(stage, mesh=dp_mesh, **_fsdp_policies(precision, root=True), **extra)
    return stage


def _fsdp_policies(precision: Precision, plan: "Plan | None" = None, *,
                   root: bool = False) -> dict[str, Any]:
    """Keyword arguments of ``fully_shard``/``replicate`` beyond the mesh: the mixed-precision
    policy (none when fp32) and, when ``plan`` offloads its parameters
    (``offload=optimizer+params``), FSDP2's CPU offload policy."""
    policy = mixed_precision_policy(precision, root=root)
    out: dict[str, Any] = {} if policy is None else {"mp_policy": policy}
    offload = offload_policy(plan) if plan is not None else None
    if offload is not None:
        out["offload_policy"] = offload
    return out


def make_optimizer(params: Iterable[nn.Parameter], plan: "Plan", mesh: DeviceMesh | None,
                   optimizer_class: type[torch.optim.Optimizer], **kwargs: Any
                   ) -> torch.optim.Optimizer:
    """``optimizer_class`` over the local parameters; ZeRO-1 shards its state over dp
    (``ZeroRedundancyOptimizer``; with tp > 1 the parameters are already dp-sharded by FSDP2).
    Under ``offload=optimizer`` (this pipeline rank's own) it steps on the host
    (:func:`~fxplan.runtime.train.host_optimizer.host_offloaded`)."""
    params = list(params)
    plan = rank_plan(plan, mesh)
    if plan.offload == "optimizer":
        optimizer_class = host_offloaded(optimizer_class)
    if plan.zero_stage == 1 and plan.dp > 1 and zero1_fallback(plan) is None and mesh is not None:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=optimizer_class,
                                       process_group=mesh["dp"].get_group(), **kwargs)
    return optimizer_class(params, **kwargs)
