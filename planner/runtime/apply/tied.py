"""Gradient sync for a weight shared by two pipeline stages (tied embedding / LM head).

In one process the tied weight ``W`` is one Parameter and autograd sums both uses:
``∂L/∂W = ∂L/∂W|_embed + ∂L/∂W|_head``. Split across pipeline ranks, the first and the last stage
each hold a copy (initialised equal) and each sees only its own term. After backward (and after
the dp reduction) the copies' gradients are summed over the group of pipeline ranks that hold
``W`` — one group per ``(dp, tp)`` coordinate, so each shard meets its counterpart — and both
copies take the same optimizer step and stay equal (Megatron's embedding group).

With a ZeRO stage per pipeline rank (``zero_stages``) the holders may keep the gradient in
different layouts: sharded over dp where FSDP2 wraps the rank's stage, whole where DDP or
``replicate`` does. Then the sharded copy is gathered over dp before the sum and its own shard
taken back after it (:meth:`TiedGradSync._sum_whole`), so both sum the same whole gradient.

With an offload per pipeline rank (``offload_stages``) an offloading holder steps its copy on
the host — torch's single-tensor loop on the CPU, after the gradient went down
(``offload=optimizer``, :mod:`fxplan.runtime.train.host_optimizer`) or where FSDP2's
``CPUOffloadPolicy`` keeps it (``optimizer+params``, whose host gradient is summed on the
device and copied back, :meth:`TiedGradSync._sum_on`) — and a non-offloading one on the
device. On CPU devices both steps are the same loop on the same kind of core and the copies
stay equal; on GPUs the device's kernels may round otherwise than the host's, and the copies
would drift apart, so such a plan is refused (:func:`offload_refusal`), and the search keeps
both holders' offload alike (:mod:`fxplan.inter_op.stage_zero`).

Groups are created on every process in the same order (``new_group`` is collective over the
default group), from the plan alone: which stages use ``W`` is the same on every rank.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Iterable, Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate

from fxplan.runtime.apply.mesh import rank_at
from fxplan.runtime.apply.offload import RuntimeSupportError

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["TiedGradSync", "offload_refusal", "same_rank_refusal"]


def same_rank_refusal(plan: "Plan", users: Mapping[str, Iterable[int]]) -> str | None:
    """Why the runtime cannot keep a weight tied when two of the stages that use it run on one
    pipeline rank (``zbv``, ``dualpipev`` put the first and the last stage on rank 0), or
    ``None``: each stage holds its own copy of a tied weight, and the copies are kept equal by
    summing their gradients across pipeline ranks (this module), not between two stages of one
    rank."""
    for fqn in sorted(users):
        stages = sorted(set(users[fqn]))
        ranks = [plan.schedule.placement(k, plan.pp)[0] for k in stages]
        if len(set(ranks)) < len(ranks):
            return (f"schedule {plan.schedule} runs stages {stages} on pipeline rank(s) {ranks}, "
                    f"and the weight {fqn!r} is tied between them (embedding and head): the "
                    "runtime keeps a tied weight's copies equal across pipeline ranks only. "
                    "Choose another schedule (zb, interleaved) or untie the weight")
    return None


def offload_refusal(plan: "Plan", users: Mapping[str, Iterable[int]],
                    device_type: str) -> str | None:
    """Why the runtime cannot keep a weight tied between a pipeline rank that offloads and one
    that does not on ``device_type`` devices (module docstring), or ``None``: on ``cpu`` both
    copies step with the same loop on the same kind of core."""
    if device_type == "cpu" or plan.config.offload_stages is None:
        return None
    for fqn in sorted(users):
        ranks = sorted({plan.schedule.placement(k, plan.pp)[0] for k in users[fqn]})
        offloads = {plan.config.offload_of(r) != "none" for r in ranks}
        if len(offloads) > 1:
            return (f"the weight {fqn!r} is tied between pipeline ranks {ranks}, whose offload "
                    f"differs (offload={plan.config.offload_text}): the offloading rank steps "
                    "its copy on the host's CPU and the other on the GPU, whose kernels may "
                    "round otherwise, so the copies would drift apart. Give both ranks the "
                    "same offload (offload_stages) or untie the weight")
    return None


class TiedGradSync:
    """All-reduce (sum) the gradients of weights held by more than one pipeline rank.

    ``users``: for each shared parameter name, the stage indices whose modules use it.
    """

    def __init__(self, plan: "Plan", mesh: DeviceMesh, users: Mapping[str, Iterable[int]]) -> None:
        self.groups: dict[str, dist.ProcessGroup] = {}
        #: the device type the groups' backend reduces on (the mesh's)
        self.device_type = mesh.device_type
        #: tied weights whose copy here is not the one on their first pipeline rank (a global
        #: gradient norm counts each weight once: on its first stage)
        self.not_first: set[str] = set()
        #: tied weights whose holders keep the gradient in different dp layouts (module
        #: docstring): summed whole
        self.whole: set[str] = set()
        refusal = same_rank_refusal(plan, users) or offload_refusal(plan, users,
                                                                    mesh.device_type)
        if refusal:
            raise RuntimeSupportError(refusal)
        coordinate = mesh.get_coordinate()
        names = mesh.mesh_dim_names or ()
        mine = dict(zip(names, coordinate)) if coordinate is not None else None
        for fqn in sorted(users):
            pp_ranks = sorted({plan.schedule.placement(k, plan.pp)[0] for k in users[fqn]})
            if len(pp_ranks) < 2:
                continue
            layouts = {plan.config.at_pipeline_rank(p).shards_params_with_fsdp for p in pp_ranks}
            if len(layouts) > 1:
                self.whole.add(fqn)
            for dp, tp in itertools.product(range(plan.dp), range(plan.tp)):
                ranks = [rank_at(mesh, pp=p, dp=dp, tp=tp) for p in pp_ranks]
                group = dist.new_group(ranks)
                if mine is not None and mine["dp"] == dp and mine["tp"] == tp and mine["pp"] in pp_ranks:
                    self.groups[fqn] = group
                    if mine["pp"] != pp_ranks[0]:
                        self.not_first.add(fqn)

    def __call__(self, params: Mapping[str, nn.Parameter]) -> None:
        for fqn, group in self.groups.items():
            param = params.get(fqn)
            if param is None or param.grad is None:
                continue
            grad = param.grad
            if isinstance(grad, DTensor) and grad.placements != param.placements:
                # autograd may leave a DTensor grad in another layout than its parameter
                grad = grad.redistribute(param.device_mesh, param.placements)
                param.grad = grad
            if fqn in self.whole and isinstance(grad, DTensor):
                self._sum_whole(grad, group, self.device_type)
                continue
            local = grad._local_tensor if isinstance(grad, DTensor) else grad
            self._sum_on(local, group, self.device_type)

    @staticmethod
    def _sum_on(local: torch.Tensor, group: dist.ProcessGroup, device_type: str) -> None:
        """Sum ``local`` in place over ``group``, on a ``device_type`` device: a gradient FSDP2's
        CPU offload keeps in host memory is summed on the rank's accelerator (NCCL reduces no
        host memory) and copied back."""
        if local.device.type == device_type:
            dist.all_reduce(local, op=dist.ReduceOp.SUM, group=group)
            return
        on_device = local.to(device_type)   # the current device of that type
        dist.all_reduce(on_device, op=dist.ReduceOp.SUM, group=group)
        local.copy_(on_device)

    @classmethod
    def _sum_whole(cls, grad: DTensor, group: dist.ProcessGroup, device_type: str) -> None:
        """Sum ``grad`` over ``group`` as the whole gradient over dp: gathered on its ``dp``
        mesh dim (other dims, tp, kept), summed, and this rank's shard taken back in place."""
        names = grad.device_mesh.mesh_dim_names or ()
        gathered = tuple(Replicate() if name == "dp" else p
                         for name, p in zip(names, grad.placements))
        if gathered == tuple(grad.placements):
            cls._sum_on(grad._local_tensor, group, device_type)
            return
        whole = grad.redistribute(grad.device_mesh, gathered)
        dist.all_reduce(whole._local_tensor, op=dist.ReduceOp.SUM, group=group)
        grad._local_tensor.copy_(whole.redistribute(grad.device_mesh,
                                                    grad.placements)._local_tensor)
