"""Pipeline stages and schedules from ``torch.distributed.pipelining``.

Stage ``k`` of ``S = pp·v`` runs on pipeline rank ``k mod pp`` (``v = 1`` unless the schedule is
``interleaved:v``). Each local stage becomes a :class:`PipelineStage` with static input/output
shapes of one microbatch (from :class:`~passes.rewrite.stages.StageIO`), communicating over the
``pp`` process group, and the plan's schedule drives them:

    gpipe           ScheduleGPipe            all forwards, then all backwards
    1f1b            Schedule1F1B             warm-up, one-forward-one-backward, cool-down
    interleaved:v   ScheduleInterleaved1F1B  v stages per rank, bubble ÷ v

The batch given to ``step`` is split into ``num_microbatches`` chunks along dim 0; the loss is
computed per microbatch on the last stage and gradients are scaled by ``1/num_microbatches``
(``scale_grads``), so the accumulated gradient is that of the mean loss over the local batch.
With ``pp = 1`` no schedule is built: :class:`~fxplan.runtime.sharded_module.ShardedModule` runs
its one stage as a plain gradient-accumulation loop (:mod:`fxplan.runtime.accumulate`), which
lets FSDP/DDP reduce each block during the last backward instead of in a pass after it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                          ScheduleInterleaved1F1B)

from fxplan.passes.rewrite.stages import StageIO

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["local_stage_indices", "build_schedule"]

logger = logging.getLogger("fxplan.runtime")


def local_stage_indices(plan: "Plan", pp_rank: int) -> list[int]:
    """Stages this pipeline rank runs: ``k`` with ``k mod pp = pp_rank``."""
    return list(range(pp_rank, plan.pp * plan.virtual_stages, plan.pp))


def build_schedule(plan: "Plan", modules: Sequence[tuple[int, nn.Module]],
                   stage_io: Sequence[StageIO], group: ProcessGroup, device: torch.device,
                   loss_fn: Callable[..., torch.Tensor]) -> Any:
    """PipelineStages for ``modules`` (``(stage index, module)``) and the plan's schedule."""
    num_stages = plan.pp * plan.virtual_stages
    stages = [
        PipelineStage(module, index, num_stages, device,
                      input_args=_on(stage_io[index].inputs, device),
                      output_args=_on(stage_io[index].outputs, device), group=group)
        for index, module in modules
    ]
    n = plan.num_microbatches
    if plan.schedule.interleaved:
        return ScheduleInterleaved1F1B(stages, n, loss_fn=loss_fn)
    (stage,) = stages
    schedule_class = ScheduleGPipe if plan.schedule.kind == "gpipe" else Schedule1F1B
    if schedule_class is Schedule1F1B and n < plan.pp:
        # 1F1B with m < pp never reaches its steady state: its order is GPipe's, which torch
        # runs while Schedule1F1B refuses m < pp.
        logger.warning("fallback: 1f1b with %d microbatches < pp=%d runs as GPipe (same order)",
                       n, plan.pp)
        schedule_class = ScheduleGPipe
    return schedule_class(stage, n, loss_fn=loss_fn)


def _on(tensors: tuple[torch.Tensor, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    """Example tensors for static stage metadata; floating ones require grad, so activations
    received from the previous stage get gradients sent back to it."""
    return tuple(torch.empty(t.shape, dtype=t.dtype, device=device,
                             requires_grad=t.dtype.is_floating_point) for t in tensors)
