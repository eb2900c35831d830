"""The step of a plan without pipeline parallelism: a plain loop of gradient accumulation.

With ``pp = 1`` (and one local stage) there is nothing to schedule: the ``m`` microbatches of
this replica's slice run one after the other, each forward, loss and backward, as a
hand-written training loop does:

    for j = 1 … m:   L_j = loss_fn(stage(x_j), y_j);   L_j.backward()      (grads accumulate)
    g ← g / m                                                               (mean over microbatches)

so the accumulated gradient is that of the mean loss ``(1/m) Σ_j L_j`` — the same sums in the
same order as ``torch.distributed.pipelining``'s schedules (unscaled losses backwarded, one
division by ``m`` at the end, inputs split with ``tensor_split`` along dim 0), hence the same
values. What differs is *when* the data-parallel reduction runs: the pipeline stage turns
FSDP's gradient sync off for every backward and reduces all blocks in one pass after the last
(``perform_reduce_grad``), keeping the gathered parameters until then; here gradient sync is
off for microbatches ``1 … m−1`` only (FSDP2 ``set_requires_gradient_sync(False)``, DDP
``no_sync``), so the last microbatch's backward reduce-scatters (all-reduces) each block as its
backward finishes — once per step, overlapping the rest of the backward. ZeRO-3 keeps sync
on in every backward (:func:`reduce_every_microbatch`): each block is reduce-scattered and
resharded after each microbatch's backward, so no unsharded gradient outlives a microbatch. The reduction averages over ``dp``; the
division by ``m`` after it gives ``(1/dp) Σ_d (1/m) Σ_j ∇L_j^d``, the pipeline's gradient.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["accumulate_microbatches", "grad_sync", "reduce_every_microbatch"]


def grad_sync(module: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
    """Gradient reduction over dp on (``enabled``) or off for the backward run inside: DDP's
    ``no_sync``; FSDP2 / ``replicate``'s ``set_requires_gradient_sync`` on every FSDP module
    of ``module`` (the blocks and the stage root); nothing for an unwrapped stage."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(module, DistributedDataParallel):
        return contextlib.nullcontext() if enabled else module.no_sync()
    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            sub.set_requires_gradient_sync(enabled, recurse=False)
    return contextlib.nullcontext()


def reduce_every_microbatch(plan: "Plan") -> bool:
    """Whether the data-parallel gradient reduction runs in every microbatch's backward
    rather than the last one only: under ZeRO-3 with ``dp > 1``, whose point is that no rank
    holds a whole stage's parameters or gradients. Deferring the reduce-scatter to the last
    backward would keep ``4·ψ_stage`` bytes of unsharded fp32 gradients (FSDP2 accumulates
    in its ``reduce_dtype``) between microbatches, and torch's pipeline stage would keep
    every block gathered as well; reducing each time costs ``m`` reduce-scatters per step,
    which is what the cost model prices for ZeRO-3 (a re-gather and a reduce-scatter per
    block per microbatch, :func:`fxplan.cost_model.host.host_overhead.zero3_exposed_s`)."""
    return plan.zero_stage == 3 and plan.dp > 1


def accumulate_microbatches(module: nn.Module, args: tuple[torch.Tensor, ...],
                            target: torch.Tensor, num_microbatches: int,
                            loss_fn: Callable[[Any, torch.Tensor], torch.Tensor],
                            losses: list[torch.Tensor], *, reduce_every: bool = False) -> None:
    """Forward, loss and backward of ``module`` over ``num_microbatches`` chunks of ``args``
    and ``target`` (dim 0), gradients accumulated and divided by ``num_microbatches``, the dp
    reduction in the last backward only (module docstring) — in every backward when
    ``reduce_every`` (ZeRO-3: :func:`reduce_every_microbatch`);
    each microbatch's loss is appended to ``losses``."""
    m = num_microbatches
    arg_chunks = [torch.tensor_split(arg, m, 0) for arg in args]
    target_chunks = torch.tensor_split(target, m, 0)
    for j in range(m):
        last = j == m - 1
        with grad_sync(module, enabled=last or reduce_every):
            output = module(*(chunks[j] for chunks in arg_chunks))
            loss = loss_fn(output, target_chunks[j])
            loss.backward()
        losses.append(loss)
    if m != 1:
        for param in module.parameters():
            if param.grad is not None:
                param.grad.div_(m)
