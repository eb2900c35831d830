"""The data-parallel gradient reduction of a zero-bubble pipeline: one explicit pass after the
schedule's step (why: :mod:`fxplan.core.zero_bubble_dp`).

With ``dp`` replicas each rank's stages hold the gradient of its own samples, scaled by
``1/m`` by the schedule; :class:`AfterStepReduction` makes every replica's gradient the
average, as DDP does::

    g  ←  Σ_{r ∈ dp group} g_r / dp

The local stages' trainable parameters are taken once, in order and without repeats (a weight
tied inside a rank once), each gradient — the local shard of a tensor-parallel DTensor's, which
every dp replica holds alike — is copied into fp32 buckets of at most :data:`BUCKET_MIB` MiB
(DDP's default cap), each bucket divided by ``dp`` and all-reduced (a sum) over the dp group,
then copied back in the gradient's own dtype. A trainable parameter without a gradient gets
zeros, so every replica reduces the same buckets. The expert weights of expert parallelism
are left out: :class:`fxplan.runtime.styles.expert_parallel.ExpertGradSync` reduces them over
their expert-data-parallel group, as beside DDP.

As DDP does when it wraps a module, the constructor broadcasts the stages' parameters and
buffers from the dp group's first rank, so the replicas start equal. Unlike DDP's
``broadcast_buffers`` nothing is broadcast before each step: a buffer the forward changes
(batch-norm statistics) stays each replica's own; a transformer's buffers (positions, masks)
do not change.
"""

from __future__ import annotations

from typing import Collection, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["BUCKET_MIB", "AfterStepReduction"]

#: Bucket cap in MiB of fp32 gradient (DDP's ``bucket_cap_mb`` default).
BUCKET_MIB = 25


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (the same storage), else ``tensor``."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class AfterStepReduction:
    """Averages the gradients of ``modules`` over ``group`` (``dp`` ranks) when called, after
    the schedule's step (module docstring); ``skip``: parameters another reduction owns."""

    def __init__(self, modules: Sequence[nn.Module], group: dist.ProcessGroup, dp: int,
                 skip: Collection[nn.Parameter] = (), bucket_mib: float = BUCKET_MIB) -> None:
        skipped = {id(p) for p in skip}
        unique: dict[int, nn.Parameter] = {}
        for module in modules:
            for param in module.parameters():
                if param.requires_grad and id(param) not in skipped:
                    unique.setdefault(id(param), param)
        self.params = list(unique.values())
        self.group, self.dp = group, dp
        self.bucket_elements = max(1, int(bucket_mib * 2**20) // 4)
        self._broadcast(modules)

    def _broadcast(self, modules: Sequence[nn.Module]) -> None:
        """Parameters and buffers from the group's first rank, one flat tensor per dtype."""
        tensors: dict[int, torch.Tensor] = {}
        for module in modules:
            for tensor in [*module.parameters(), *module.buffers()]:
                tensors.setdefault(id(tensor), tensor)
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for tensor in tensors.values():
            local = _local(tensor.detach())
            if local.numel():
                by_dtype.setdefault(local.dtype, []).append(local)
        with torch.no_grad():
            for dtype, group in by_dtype.items():
                wire = torch.uint8 if dtype == torch.bool else dtype
                flat = torch.cat([t.reshape(-1).to(wire) for t in group])
                dist.broadcast(flat, group=self.group, group_src=0)
                self._scatter_back(flat, group)

    @staticmethod
    def _scatter_back(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
        offset = 0
        for tensor in tensors:
            n = tensor.numel()
            tensor.copy_(flat[offset:offset + n].view(tensor.shape).to(tensor.dtype))
            offset += n

    def _grads(self) -> list[torch.Tensor]:
        out = []
        for param in self.params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            out.append(_local(param.grad))
        return out

    def _buckets(self, grads: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
        bucket: list[torch.Tensor] = []
        size = 0
        for grad in grads:
            if bucket and size + grad.numel() > self.bucket_elements:
                yield bucket
                bucket, size = [], 0
            bucket.append(grad)
            size += grad.numel()
        if bucket:
            yield bucket

    @torch.no_grad()
    def __call__(self) -> None:
        for bucket in self._buckets(self._grads()):
            flat = torch.cat([g.reshape(-1).to(torch.float32) for g in bucket])
            flat.div_(self.dp)
            dist.all_reduce(flat, group=self.group)
            self._scatter_back(flat, bucket)
