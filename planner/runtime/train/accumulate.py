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
backward finishes — once per step, overlapping the rest of the backward. ZeRO-2 and ZeRO-3
keep sync on in every backward (``ParallelConfig.reduces_every_microbatch``): each block is
reduce-scattered after each microbatch's backward, so no unsharded gradient outlives a
microbatch (deferred, FSDP2 would keep ``4·ψ_stage`` bytes of unsharded fp32 gradients, its
``reduce_dtype``, where the memory model counts ``1/dp`` of them); ZeRO-3 reshards each block
after it, ZeRO-2 keeps the blocks gathered until the last backward
(``ParallelConfig.keeps_blocks_gathered``). The reduction averages over ``dp``; the
division by ``m`` after it gives ``(1/dp) Σ_d (1/m) Σ_j ∇L_j^d``, the pipeline's gradient.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch import nn

__all__ = ["accumulate_microbatches", "grad_sync", "reshard_after_backward"]


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


def reshard_after_backward(module: nn.Module, enabled: bool) -> None:
    """FSDP2's ``set_reshard_after_backward`` on every FSDP module of ``module``."""
    from torch.distributed.fsdp import FSDPModule

    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            sub.set_reshard_after_backward(enabled, recurse=False)


def accumulate_microbatches(module: nn.Module, args: tuple[torch.Tensor, ...],
                            target: torch.Tensor, num_microbatches: int,
                            loss_fn: Callable[[Any, torch.Tensor], torch.Tensor],
                            losses: list[torch.Tensor], *, reduce_every: bool = False,
                            gathered: bool = False) -> None:
    """Forward, loss and backward of ``module`` over ``num_microbatches`` chunks of ``args``
    and ``target`` (dim 0), gradients accumulated and divided by ``num_microbatches``, the dp
    reduction in the last backward only (module docstring) — in every backward when
    ``reduce_every`` (ZeRO-2/3), the blocks resharded in the last backward only when
    ``gathered`` (ZeRO-2); each microbatch's loss is appended to ``losses``."""
    m = num_microbatches
    arg_chunks = [torch.tensor_split(arg, m, 0) for arg in args]
    target_chunks = torch.tensor_split(target, m, 0)
    for j in range(m):
        last = j == m - 1
        if gathered:
            reshard_after_backward(module, last)
        with grad_sync(module, enabled=last or reduce_every):
            output = module(*(chunks[j] for chunks in arg_chunks))
            loss = loss_fn(output, target_chunks[j])
            loss.backward()
        losses.append(loss)
    if m != 1:
        for param in module.parameters():
            if param.grad is not None:
                param.grad.div_(m)
