"""Head-parallel attention with one fused QKV ``nn.Linear`` (the model zoo's GPT).

The zoo's ``CausalSelfAttention`` projects with one Linear ``qkv`` of weight ``(3h, h)`` (rows
``[W_q; W_k; W_v]``, each with the ``a`` heads as consecutive blocks of ``d = h/a`` rows), splits
its output by size (``split(self.hidden)``) and views each part as ``(b, t, self.heads, d)``; a
row-parallel ``proj`` follows. A column-parallel ``qkv`` (contiguous ``S(0)`` rows) gives tp rank
0 all of ``W_q`` and half of ``W_k``, and the split by the global ``hidden`` fails on the local
``3h/t`` columns. The head-parallel layout (as for ``nn.MultiheadAttention``,
:mod:`fxplan.runtime.styles.tp_attention`) gives tp rank ``r`` of ``t`` the rows of its head group
``[r·a/t, (r+1)·a/t)`` in each of the three blocks — DTensor's ``_StridedShard(0,
split_factor=3)`` —, and the module's local sizes ``heads = a/t``, ``hidden = h/t`` are set on the
module, so its own forward, unchanged, runs its ``a/t`` heads:

    x_r   = x                   (backward: ∂x all-reduced over tp, Megatron's f)
    qkv_r = x_r · W_rᵀ + b_r    (W_r = [W_q,r; W_k,r; W_v,r], b_r the same rows of the bias)
    q, k, v = split(qkv_r, h/t)  → (b, a/t, t, d) each;  o_r = attention(q, k, v)
    y     = Σ_r o_r · proj.weight_rᵀ + proj.bias      (proj: RowwiseParallel, all-reduce or
                                                      reduce-scatter under sp)

The bias is kept whole (``Replicate`` over tp: a 1-D ``_StridedShard`` could not take FSDP2's
dp shard on a further dim) and sliced to ``b_r`` in the forward from the local whole bias;
its gradient, zero outside this rank's rows, is declared ``Partial(sum)`` and joins the
trainer's one flattened reduction of partial gradients (:mod:`fxplan.runtime.apply.partial_grads`)
instead of an all-gather of its own in every backward. Under sequence parallelism the
attention's input arrives sequence-sharded and is all-gathered by a ``PrepareModuleInput``
applied first (``gather``), and passed on as the ``Replicate`` DTensor, so that the gradient
of the input leaves as a partial sum and sequence parallelism's backward reduce-scatters it
(a local tensor would be all-reduced, then sliced). GPT tp plans take this style with or
without context parallelism; in the graph rewrite DTensor all-gathers the fused output at
the q/k/v split (``split`` of a ``Shard(2)`` tensor) and every rank runs the whole attention.

A plan asks for it with the tp tokens ``qkv.weight S(0)`` (``qkv.bias S(0)`` or ``R``) and
``proj.weight S(1)`` — the cost model's Megatron layout.
"""

from __future__ import annotations

import types
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor.parallel.style import ParallelStyle

from fxplan.runtime.styles.tp_attention import QKV, _local, _shard

__all__ = ["FusedQKVAttention", "fused_qkv_unsupported", "is_fused_qkv_attention"]


def is_fused_qkv_attention(module: nn.Module) -> bool:
    """Whether ``module`` has the zoo GPT attention's shape: a Linear ``qkv`` of ``h → 3h``, a
    Linear ``proj`` and integer ``heads``/``hidden``/``head_dim`` with ``hidden = heads·head_dim``."""
    qkv, proj = getattr(module, "qkv", None), getattr(module, "proj", None)
    sizes = [getattr(module, k, None) for k in ("heads", "hidden", "head_dim")]
    if not (isinstance(qkv, nn.Linear) and isinstance(proj, nn.Linear)
            and all(isinstance(v, int) for v in sizes)):
        return False
    heads, hidden, head_dim = sizes
    return (hidden == heads * head_dim == qkv.in_features == proj.in_features
            and qkv.out_features == 3 * hidden)


def fused_qkv_unsupported(module: nn.Module, tp: int) -> Optional[str]:
    """Why ``module`` cannot run head-parallel over ``tp`` ranks, or ``None``."""
    if module.heads % tp:
        return f"{module.heads} heads do not divide by tp={tp}"
    return None


class FusedQKVAttention(ParallelStyle):
    """The module docstring's layout for one fused-QKV attention; ``gather``: a style applied
    first (sequence parallelism's all-gather of the input)."""

    def __init__(self, gather: ParallelStyle | None = None) -> None:
        super().__init__()
        self.gather = gather
        self.src_data_rank: Optional[int] = 0

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        if not is_fused_qkv_attention(module):
            raise TypeError(f"FusedQKVAttention applies to a fused-QKV attention, not "
                            f"{type(module).__name__}")
        tp = device_mesh.size()
        reason = fused_qkv_unsupported(module, tp)
        if reason:
            raise ValueError(f"{type(module).__name__} cannot run head-parallel: {reason}")
        if self.gather is not None:
            self.gather.src_data_rank = self.src_data_rank
            self.gather._apply(module, device_mesh)
        qkv = module.qkv
        qkv.weight = _shard(qkv.weight, device_mesh, QKV, self.src_data_rank)
        if qkv.bias is not None:  # kept whole: see the module docstring
            qkv.bias = _shard(qkv.bias, device_mesh, Replicate(), self.src_data_rank)
        qkv.forward = types.MethodType(_head_parallel_qkv, qkv)
        qkv._fxplan_tp_mesh = device_mesh
        module.heads, module.hidden = module.heads // tp, module.hidden // tp
        return module


def _head_parallel_qkv(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """This rank's ``q``, ``k`` and ``v`` columns (module docstring): ``x`` replicated in (its
    gradient all-reduced), the strided-shard rows of the weight and of the bias."""
    mesh = self._fxplan_tp_mesh
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, mesh, [Replicate()], run_check=False)
    x = x.to_local(grad_placements=[Partial()])
    bias = self.bias
    if isinstance(bias, DTensor):  # this head group's rows of the whole bias (docstring)
        tp = mesh.size()
        whole = bias.to_local(grad_placements=[Partial()])
        bias = whole.view(3, tp, -1)[:, mesh.get_local_rank()].reshape(-1)
    return F.linear(x, _local(self.weight), bias)
