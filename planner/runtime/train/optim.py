"""Optimizer, learning-rate schedule and gradient clipping for a :class:`ShardedModule`.

**Optimizer.** AdamW (or SGD) over this rank's parameters in two groups — weight decay on
matrices (``ndim ≥ 2``: linear and embedding weights), none on biases and norm gains, as in
nanoGPT — built by :func:`~fxplan.runtime.styles.data_parallel.make_optimizer`, so ZeRO-1 shards its
state over dp. Parameters stay in fp32 (the master weights).

**Schedule**: warm-up + cosine (:mod:`fxplan.core.training`).

**Clipping** by the global norm ``‖g‖ = sqrt(Σ_params Σ_elements g²)`` of the *whole* model's
gradient, as ``torch.nn.utils.clip_grad_norm_`` computes it in one process, then ``g ← g ·
min(1, c / (‖g‖ + 1e-6))``. Sharded, each element must be counted exactly once:

* a DTensor gradient contributes the sum of squares of its local shard, all-reduced over the
  mesh dimensions on which it is ``Shard``-ed (tp shards, FSDP2's dp shards, expert ZeRO's edp
  shards; ``_StridedShard`` included) and not over those
  on which it is ``Replicate``-d (a ``Partial`` gradient is first reduced to its parameter's
  placement);
* a plain gradient (DDP, ZeRO-1) is the same on every dp rank: counted locally;
* pipeline stages hold disjoint parameters: the stage totals are summed over the ``pp`` group,
  except a weight tied across stages (embedding / LM head), whose copies carry the same summed
  gradient after :class:`~fxplan.runtime.apply.tied.TiedGradSync` — counted on its first stage only.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Partial, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from fxplan.runtime.styles.data_parallel import make_optimizer

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.runtime.apply.sharded_module import ShardedModule

__all__ = ["build_optimizer", "set_lr", "global_grad_norm", "clip_grad_norm"]


def param_groups(named: dict[str, torch.nn.Parameter], weight_decay: float) -> list[dict[str, Any]]:
    """Decay on matrices, none on vectors (biases, norm gains); parameters in a fixed order."""
    decay = [p for _, p in sorted(named.items()) if p.ndim >= 2]
    other = [p for _, p in sorted(named.items()) if p.ndim < 2]
    groups = [dict(params=decay, weight_decay=weight_decay), dict(params=other, weight_decay=0.0)]
    return [g for g in groups if g["params"]]


def build_optimizer(sharded: "ShardedModule", name: str, *, lr: float, weight_decay: float = 0.0,
                    betas: tuple[float, float] = (0.9, 0.95)) -> torch.optim.Optimizer:
    """AdamW (``name="adamw"``) or plain SGD (``"sgd"``) over the local parameters."""
    unique: dict[str, torch.nn.Parameter] = {}
    seen: set[int] = set()
    for fqn, param in sharded.named_parameters().items():
        if id(param) not in seen:
            seen.add(id(param))
            unique[fqn] = param
    groups = param_groups(unique, weight_decay)
    if name == "adamw":
        return make_optimizer(groups, sharded.plan, sharded.mesh, torch.optim.AdamW, lr=lr,
                              betas=betas)
    if name == "sgd":
        return make_optimizer(groups, sharded.plan, sharded.mesh, torch.optim.SGD, lr=lr)
    raise ValueError(f"optimizer {name!r}: expected adamw or sgd")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def _grads(sharded: "ShardedModule") -> list[torch.Tensor]:
    """Gradients to count on this rank: each parameter once, tied copies on their first stage."""
    grads, seen = [], set()
    skip = getattr(sharded.tied, "not_first", set())
    for fqn, param in sharded.named_parameters().items():
        if id(param) in seen or param.grad is None or fqn in skip:
            continue
        seen.add(id(param))
        grad = param.grad
        if isinstance(grad, DTensor) and any(isinstance(p, Partial) for p in grad.placements):
            grad = grad.redistribute(param.device_mesh, param.placements)
            param.grad = grad
        grads.append(grad)
    return grads


def _same_order_everywhere(item: tuple[tuple[Any, tuple[int, ...]], Any]) -> tuple[Any, ...]:
    """Sort key of a (mesh, sharded dims) group that is equal on every rank of a stage (the
    mesh's rank layout differs between groups, its shape and names do not): the reductions
    must run in the same order on every rank."""
    (mesh, dims), _ = item
    if mesh is None:
        return (0, 0, (), dims)
    return (1, mesh.ndim, tuple(mesh.mesh_dim_names or ()), dims)


def global_grad_norm(sharded: "ShardedModule") -> torch.Tensor:
    """``‖g‖₂`` of the whole model's gradient, the same on every member rank (collective).
    Each partial sum is reduced on the rank's device (``sharded.device``): under FSDP2's CPU
    offload the gradient shards, and so their norms, live in host memory, which NCCL cannot
    reduce."""
    groups: dict[tuple[Any, tuple[int, ...]], list[torch.Tensor]] = defaultdict(list)
    for grad in _grads(sharded):
        if isinstance(grad, DTensor):
            local = grad.to_local()
            # _StridedShard is not a Shard subclass in torch 2.13: head-parallel fused QKV rows,
            # and FSDP2's dp shard over a dim tp or ep splits too
            dims = tuple(i for i, p in enumerate(grad.placements)
                         if isinstance(p, (Shard, _StridedShard)))
            key = (grad.device_mesh, dims)
        else:
            local, key = grad, (None, ())
        groups[key].append(local.detach())
    # per group Σ‖g_i‖² in fp64 from the per-tensor norms of one fused kernel (as
    # torch.nn.utils.clip_grad_norm_ computes them), not one cast + pow + sum per tensor
    partial = {key: torch.stack(torch._foreach_norm(tensors)).double().pow(2).sum()
                    .to(sharded.device) for key, tensors in groups.items()}
    total = torch.zeros((), dtype=torch.float64, device=sharded.device)
    for (mesh, dims), value in sorted(partial.items(), key=_same_order_everywhere):
        for dim in dims:
            dist.all_reduce(value, group=mesh.get_group(dim))
        total = total + value
    if sharded.plan.pp > 1:
        dist.all_reduce(total, group=sharded.mesh["pp"].get_group())
    return total.sqrt()


def clip_grad_norm(sharded: "ShardedModule", max_norm: float) -> float:
    """Scale every gradient by ``min(1, max_norm / (‖g‖ + 1e-6))``; returns ``‖g‖`` before
    clipping. ``max_norm = 0``: measure only."""
    norm = global_grad_norm(sharded)
    if max_norm > 0:
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        # one fused multiply per device and dtype (offloaded gradients are on the host)
        by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
        for param in sharded.parameters():
            if param.grad is not None:
                grad = param.grad
                local = grad._local_tensor if isinstance(grad, DTensor) else grad
                by_kind[(local.device, local.dtype)].append(local)
        for (device, dtype), locals_ in by_kind.items():
            torch._foreach_mul_(locals_, coef.to(device, dtype))
    return float(norm)
