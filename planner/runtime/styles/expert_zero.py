"""Expert ZeRO: the expert weights' optimizer state, gradients and parameters sharded over the
expert-data-parallel group, per the plan's ZeRO stage.

Under expert parallelism (:mod:`fxplan.runtime.styles.expert_parallel`) each expert weight
``W [E, ·, ·]`` is a DTensor on the ``(edp, ep)`` mesh with placements ``(Replicate(),
Shard(0))``: EP rank ``j`` holds experts ``j·E/ep … (j+1)·E/ep − 1``, the same on each of the
``n = dp/ep`` ranks of its expert-data-parallel group. With ZeRO ≥ 1 and ``n > 1`` each
holder of expert weights (a ``MoELayer``'s ``experts``, a routed experts module) is wrapped by
FSDP2's ``fully_shard`` on that mesh with ``dp_mesh_dims = DataParallelMeshDims(shard="edp")``
(the SPMD mode of torch 2.13's FSDP2: the parameters are DTensors on the mesh, ``Replicate`` on the dp
dim): the ``edp`` placement becomes a shard of the local experts' rows, so a rank holds
``1/n`` of its ``E/ep`` experts' weights (``Shard(0)``; ``_StridedShard`` when ``ep`` also
splits dim 0), their gradients and optimizer state — ``ZeRO(Ψ_e/ep, dp/ep, z)`` of
:func:`fxplan.cost_model.parallel.expert_parallel.model_states`, as the plan priced it:

    ZeRO-1, ZeRO-2   ``reshard_after_forward=False``: gathered once per step (the first
                     forward), gradients reduce-scattered over ``edp`` (ZeRO-1 runs as ZeRO-2,
                     as the dense parameters do under ep: :func:`zero1_fallback`)
    ZeRO-3           ``reshard_after_forward=True``: gathered before the forward and again
                     before the backward, freed after each

**Gradients.** An expert weight on EP rank ``j`` receives ``Σ_{d ∈ EP group} ∇_W loss_d``
through the all-to-all backward; the one-process gradient is ``(1/dp) Σ_d ∇_W loss_d``
(:class:`~fxplan.runtime.styles.expert_parallel.ExpertGradSync`'s docstring), so FSDP's
reduce-scatter over ``edp`` sums and divides by ``dp``
(``set_gradient_divide_factor(dp)``, not its default ``n``; the reduce-scatter a plain sum
and the shard divided after it, ``set_force_sum_reduction_for_comms``: gloo has no
``PREMUL_SUM``, and on NCCL the division is one kernel on the ``1/n`` shard). The holders are wrapped before
the dense blocks, so the blocks' ``fully_shard`` over ``dp`` leaves them to their own group
(nested FSDP modules), and the trainer's gradient-accumulation switch reaches them
(:func:`fxplan.runtime.train.accumulate.grad_sync` visits every FSDP module).

With ``n = 1`` (``ep = dp``) there is nothing to shard: each rank's experts are whole and
:class:`~fxplan.runtime.styles.expert_parallel.ExpertGradSync` divides their gradients by ``dp``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan
    from fxplan.runtime.apply.precision import Precision

__all__ = ["experts_sharded", "shard_expert_states"]


def experts_sharded(plan: "Plan") -> bool:
    """Whether the plan's ZeRO shards the expert weights over their ``dp/ep`` ranks: ``ep > 1``,
    ZeRO ≥ 1 and ``dp/ep > 1`` (module docstring)."""
    ep = plan.config.ep
    return ep > 1 and plan.zero_stage >= 1 and plan.dp // ep > 1


def shard_expert_states(module: nn.Module, plan: "Plan", precision: "Precision | None" = None
                        ) -> bool:
    """Wrap each expert holder of ``module`` (after
    :func:`~fxplan.runtime.styles.expert_parallel.shard_experts`) in FSDP2 over its
    expert-data-parallel dim, as the plan's ZeRO stage says (module docstring), with the
    stage's mixed-precision and offload policies; ``False`` (nothing done) when
    :func:`experts_sharded` is false."""
    if not experts_sharded(plan):
        return False
    from fxplan.core.torch_support import require

    require("fsdp_spmd_mesh_dims", f"{plan.summary} (ZeRO-{plan.zero_stage} beside ep > 1)")
    from torch.distributed.fsdp import DataParallelMeshDims, fully_shard

    from fxplan.runtime.styles.data_parallel import _fsdp_policies
    from fxplan.runtime.styles.expert_parallel import expert_holders
    from fxplan.runtime.apply.precision import Precision

    for holder in expert_holders(module):
        mesh = next(holder.parameters(recurse=False)).device_mesh   # the (edp, ep) mesh
        fully_shard(holder, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="edp"),
                    reshard_after_forward=plan.zero_stage == 3,
                    **_fsdp_policies(precision or Precision(), plan))
        holder.set_gradient_divide_factor(float(plan.dp))
        holder.set_force_sum_reduction_for_comms(True)   # a SUM, then ÷dp: gloo has no PREMUL_SUM
    return True
