"""Pipeline stages and schedules from ``torch.distributed.pipelining``.

Stage ``k`` of ``S = pp·v`` runs on pipeline rank ``k mod pp`` (``v = 1`` unless the schedule is
``interleaved:v``). Each local stage becomes a :class:`PipelineStage` with static input/output
shapes of one microbatch (from :class:`~fxplan.core.stage_io.StageIO`), communicating over the
``pp`` process group, and the plan's schedule drives them:

    gpipe           ScheduleGPipe                  all forwards, then all backwards
    1f1b            Schedule1F1B                   warm-up, one-forward-one-backward, cool-down
    interleaved:v   ScheduleInterleaved1F1B        v stages per rank, bubble ÷ v
    zb[:v]          ScheduleInterleavedZeroBubble  backward split into input and weight
                                                   gradients, the weight's in the bubbles
    zbv             ScheduleZBVZeroBubble          the same, 2 stages per rank in a V
    dualpipev       ScheduleDualPipeV              DeepSeek's DualPipe in the same V: forward
                                                   and backward of two microbatches paired,
                                                   run one after the other (m ≥ 2·pp)

Under ``zbv`` and ``dualpipev`` rank ``r`` holds stages ``r`` and ``2·pp − 1 − r``
(:func:`local_stage_indices`), so the first and the last stage are both on rank 0. The
zero-bubble schedules run each split backward as torch's ``stage_backward_input`` (the
autograd graph kept) and, later, ``stage_backward_weight`` (``dualpipev`` splits some of its
backwards and runs the others whole). ``ScheduleDualPipeV``'s ``OVERLAP_F_B`` pairs run their
forward, then their backward, as no custom overlap function is registered.

The batch given to ``step`` is split into ``num_microbatches`` chunks along dim 0; the loss is
computed per microbatch on the last stage and gradients are scaled by ``1/num_microbatches``
(``scale_grads``), so the accumulated gradient is that of the mean loss over the local batch.
With ``pp = 1`` no schedule is built: :class:`~fxplan.runtime.apply.sharded_module.ShardedModule` runs
its one stage as a plain gradient-accumulation loop (:mod:`fxplan.runtime.train.accumulate`), which
lets FSDP/DDP reduce each block during the last backward instead of in a pass after it.

**The dp reduction with ``pp > 1``.** torch's ``PipelineStage`` turns FSDP2's (and
``replicate``'s) gradient sync and resharding off for *every* microbatch's backward, the last
included, and reduces every FSDP group in one pass after it (``perform_reduce_grad``: each
group's ``post_backward`` by hand, then the root's final callback), so no reduce-scatter
overlaps the backward and ZeRO-3 keeps every block gathered until the pass. Under GPipe and
1F1B each stage is built as :class:`ReduceInLastBackward`: the last microbatch's backward runs
with sync and resharding on, as a hand-written accumulation loop's last backward does, so each
block's reduce-scatter is issued by FSDP's own post-backward hook as that block's backward
finishes, and the pass after the schedule only divides by ``m`` (``scale_grads``). The sums
are the same in the same order — ``Σ_{j<m} g_j`` accumulated unsharded with sync off, ``+ g_m``,
then one reduce over dp, then ``/ m`` — so the gradients equal the deferred pass's. Under
ZeRO-2/3 the stage reduces in every microbatch's backward instead
(``ParallelConfig.reduces_every_microbatch``): ``Σ_j reduce(g_j)``, the
same sum in another order. DDP needs
nothing: torch arms its reducer for the last backward (``prepare_for_backward``), whose
buckets all-reduce inside that backward already. The interleaved schedule keeps torch's
``REDUCE_GRAD`` action (issued right after each stage's last backward, with its own
unshard/reshard actions around it). The zero-bubble schedules (``zb[:v]``, ``zbv``,
``dualpipev``) cannot: a microbatch's weight gradients exist only after its ``W`` op, later
than any hook DDP or FSDP2 reduces in, so with ``dp > 1`` their stages run unwrapped
(``REDUCE_GRAD`` then only divides by ``m``) and :class:`~fxplan.runtime.train.dp_reduce.
AfterStepReduction` averages every gradient over dp once the step has run its last ``W``
(:mod:`fxplan.core.zero_bubble_dp`; ZeRO-0, and ZeRO-1 with its sharded optimizer).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.fsdp import FSDPModule
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                          ScheduleInterleaved1F1B,
                                          ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble)
from torch.distributed.pipelining._backward import stage_backward

from fxplan.core.stage_io import StageIO
from fxplan.core.zero_bubble_dp import after_step_refusal
from fxplan.core.torch_support import FEATURES, installed_torch, torch_has
from fxplan.runtime.apply.offload import RuntimeSupportError

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["local_stage_indices", "build_schedule", "ReduceInLastBackward",
           "zero_bubble_refusal"]

logger = logging.getLogger("fxplan.runtime")


#: The schedules that take a list of stages per rank, by :class:`~fxplan.core.schedule.Schedule`
#: kind.
_MULTI: dict[str, type] = {"interleaved": ScheduleInterleaved1F1B,
                           "zb": ScheduleInterleavedZeroBubble, "zbv": ScheduleZBVZeroBubble}
if torch_has("pipelining_dualpipev"):
    from torch.distributed.pipelining import ScheduleDualPipeV

    _MULTI["dualpipev"] = ScheduleDualPipeV


def zero_bubble_refusal(plan: "Plan") -> str | None:
    """Why the runtime cannot run ``plan``'s zero-bubble schedule, or ``None``. torch runs a
    split backward as ``stage_backward_input`` then ``stage_backward_weight`` over the kept
    autograd graph, and in the supported torch (2.11 – 2.13, tested on CPU ranks) that works
    for plain and tensor-parallel stages. torch's own activation checkpoints do not survive the
    second pass (on torch 2.13: the composable ``checkpoint`` enters its recompute context
    twice and fails, a selective checkpoint refuses the second backward of its region,
    ``torch.utils.checkpoint``'s full recompute reruns the block's forward in both passes and
    its ``GraphExecGroup`` refuses a saved tensor both passes unpack); the runtime's full
    recompute beside a split backward is :func:`~fxplan.passes.rewrite.split_recompute.
    kept_checkpoint`, one recompute read by both passes. Selective recompute needs none: the
    attention holds no weights, so the weight pass never reads what it saved (it starts from
    the inputs of the weights' ops), and checkpointed alone — the graph rewrite's outlined
    attention core, each fused attention call at module level
    (:class:`fxplan.runtime.apply.recompute.AttentionCheckpoint`) — it is recomputed once,
    in the input-gradient pass.
    With ``dp > 1`` the stages are not wrapped (DDP's reducer would all-reduce before the
    weight gradients exist, FSDP2's reduce-scatter deadlocks) and their gradients are
    averaged after the step (:mod:`fxplan.runtime.train.dp_reduce`; ``offload=optimizer``
    then steps on the host as anywhere); what needs FSDP2 — ZeRO-2/3 (``optimizer+params``
    included), ZeRO-1 beside tp or ep — is refused
    (:func:`fxplan.core.zero_bubble_dp.after_step_refusal`)."""
    if not plan.config.splits_backward:
        return None
    for feature in (("pipelining_zbv",) if plan.schedule.v_shape else ()) + (
            ("pipelining_dualpipev",) if plan.schedule.kind == "dualpipev" else ()):
        if not torch_has(feature):
            return (f"schedule {plan.schedule} needs {FEATURES[feature][2]}, which this torch "
                    f"({installed_torch()}) does not have; use zb or zb:2, or upgrade torch")
    return after_step_refusal(plan.config)


def local_stage_indices(plan: "Plan", pp_rank: int) -> list[int]:
    """Stages this pipeline rank runs: ``k`` with ``k mod pp = pp_rank``, or under ``zbv``
    and ``dualpipev`` the V ``pp_rank`` and ``2·pp − 1 − pp_rank`` (torch's
    ``stage_index_to_group_rank`` of style ``"v"``)."""
    return [plan.schedule.virtual_stage(pp_rank, c, plan.pp) for c in range(plan.virtual_stages)]


class ReduceInLastBackward(PipelineStage):
    """A ``PipelineStage`` whose FSDP2 / ``replicate`` gradient reduction runs inside the last
    microbatch's backward, block by block, instead of in a pass after the schedule (module
    docstring) — inside *every* microbatch's backward when ``reduce_every`` (ZeRO-2/3 with
    ``dp > 1``: no unsharded gradient is kept between microbatches, as the stage memory
    model counts), the blocks resharded after each backward unless ``gathered`` (ZeRO-2:
    resharded after the last one only). For GPipe and 1F1B, whose schedule calls
    ``perform_reduce_grad`` once after the stage's last backward; any other stage behaves as
    torch's."""

    _reduced_in_backward = False
    reduce_every = False
    gathered = False

    def backward_maybe_with_nosync(self, backward_type: str, bwd_kwargs: dict,
                                   last_backward: bool = False) -> Any:
        if not ((last_backward or self.reduce_every) and backward_type == "full"
                and isinstance(self.submod, FSDPModule)):
            return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)
        # what perform_reduce_grad would switch on afterwards, switched on for this backward:
        # FSDP's post-backward hooks reduce-scatter (and reshard) each group as it finishes,
        # and its final callback (queued by the root's pre-backward hook) waits for them
        self.submod.set_is_last_backward(True)
        self.submod.set_reshard_after_backward(last_backward or not self.gathered)
        self.submod.set_requires_gradient_sync(True)
        self._reduced_in_backward = True
        grads = stage_backward(bwd_kwargs["stage_output"], bwd_kwargs["output_grads"],
                               bwd_kwargs["input_values"])
        return grads, None

    def perform_reduce_grad(self, grad_scale_factor: int) -> None:
        if not self._reduced_in_backward:
            super().perform_reduce_grad(grad_scale_factor)
            return
        self._reduced_in_backward = False  # reduced already: only the division by m is left
        self.scale_grads(grad_scale_factor)


def build_schedule(plan: "Plan", modules: Sequence[tuple[int, nn.Module]],
                   stage_io: Sequence[StageIO], group: ProcessGroup, device: torch.device,
                   loss_fn: Callable[..., torch.Tensor]) -> Any:
    """PipelineStages for ``modules`` (``(stage index, module)``) and the plan's schedule."""
    refusal = zero_bubble_refusal(plan)
    if refusal:
        raise RuntimeSupportError(refusal)
    num_stages = plan.pp * plan.virtual_stages
    multi = plan.schedule.kind in _MULTI
    stage_class = PipelineStage if multi else ReduceInLastBackward
    stages = [
        stage_class(module, index, num_stages, device,
                      input_args=_on(stage_io[index].inputs, device),
                      output_args=_on(stage_io[index].outputs, device), group=group)
        for index, module in modules
    ]
    for stage in stages:
        if isinstance(stage, ReduceInLastBackward):   # its pipeline rank's own ZeRO stage
            own = plan.config.at_pipeline_rank(plan.schedule.placement(stage.stage_index,
                                                                       plan.pp)[0])
            stage.reduce_every = own.reduces_every_microbatch
            stage.gathered = own.keeps_blocks_gathered
    n = plan.num_microbatches
    if multi:
        return _MULTI[plan.schedule.kind](stages, n, loss_fn=loss_fn)
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
