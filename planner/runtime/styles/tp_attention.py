"""Head-parallel ``nn.MultiheadAttention``: a ``ParallelStyle`` for its fused input projection.

``nn.MultiheadAttention`` keeps q, k and v in one parameter, ``in_proj_weight`` of shape
``(3E, E)`` (rows ``[W_q; W_k; W_v]``, each ``(E, E)`` with the ``H`` heads as consecutive
blocks of ``E/H`` rows), and its forward splits the projection by size. Column-parallel
Linear styles cannot split it: a contiguous row shard ``S(0)`` of the fused weight gives rank 0
all of ``W_q`` and half of ``W_k``. The head-parallel layout gives tp rank ``r`` (of ``t``) the
rows of its head group ``h ∈ [r·H/t, (r+1)·H/t)`` in each of the three blocks:

    in_proj_weight_r = [W_q[r·E/t:(r+1)·E/t]; W_k[…]; W_v[…]]       ((3E/t, E))
    in_proj_bias_r   = the same rows of the bias                     ((3E/t,))

which is DTensor's ``_StridedShard(0, split_factor=3)`` (split into 3 pieces, each piece
sharded over tp). The bias (``3E`` values) is stored whole (``Replicate`` over tp) and sliced to
its rows in the forward (``redistribute`` to the strided shard; its backward all-gathers the
gradient): FSDP2 shards a parameter over dp on another dim than the tp one when that one is
strided (:func:`fxplan.runtime.styles.data_parallel.fsdp_shard_dim`), and a 1-D one has none. And ``out_proj`` is row-parallel (``weight`` ``Shard(1)``, ``bias``
``Replicate``). The forward on rank ``r`` (``x`` replicated, as for a column-parallel Linear):

    q, k, v = split₃(x · in_proj_weight_rᵀ + in_proj_bias_r)         (H/t heads each)
    o_r     = softmax(q kᵀ/√d + mask) v                               (its H/t heads)
    y       = Σ_r o_r · out_proj.weight_rᵀ  + out_proj.bias          (all-reduce over tp)

and in the backward the gradient of ``x`` is all-reduced (Megatron's ``f``/``g`` pair:
``from_local(Replicate).to_local(grad_placements=Partial)`` on the way in, ``Partial →
Replicate`` on the way out). Under sequence parallelism the input is a DTensor sharded on the
sequence: it is all-gathered on the way in (its gradient reduce-scattered) and the output
reduce-scattered back to the input's placements (a DTensor, as the residual stream). Attention weights (``need_weights=True``) are the head average,
``Σ_r Σ_{h∈r} A_h / H``, all-reduced the same way.

A plan asks for it with the tp tokens ``in_proj_weight S(0)`` (``in_proj_bias S(0)``) and
``out_proj.weight S(1)`` (``out_proj.bias R``) — the column/row pair of the cost model's
Megatron layout, which prices the attention core as split over tp (:mod:`cost_model.parallel.megatron_layout`).
Only self-attention with one embedding size (``_qkv_same_embed_dim``), no ``bias_k``/``bias_v``
or ``add_zero_attn`` and ``H`` divisible by ``t`` is expressible; a 3-D ``attn_mask`` (per
head) is refused at run time.
"""

from __future__ import annotations

import math
import types
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel.style import ParallelStyle
from torch.distributed.tensor.placement_types import _StridedShard

from fxplan.runtime.apply.strided import restrided

__all__ = ["HeadParallelAttention", "attention_unsupported"]

#: The fused projection's layout over tp: 3 pieces (q, k, v), each sharded.
QKV = _StridedShard(0, split_factor=3)


def attention_unsupported(module: nn.MultiheadAttention, tp: int) -> Optional[str]:
    """Why ``module`` cannot run head-parallel over ``tp`` ranks, or ``None``."""
    if not module._qkv_same_embed_dim or module.in_proj_weight is None:
        return "q, k and v have separate embedding sizes (no fused in_proj_weight)"
    if module.bias_k is not None or module.add_zero_attn:
        return "bias_k/bias_v or add_zero_attn is set"
    if module.num_heads % tp:
        return f"{module.num_heads} heads do not divide by tp={tp}"
    return None


def _shard(param: torch.Tensor, mesh: Any, placement: Any, src_data_rank: Optional[int]
           ) -> nn.Parameter:
    if param.is_meta:  # materialised later from the full value (fxplan.runtime.apply.build)
        local = torch.empty(_local_shape(param.shape, placement, mesh.size()), dtype=param.dtype,
                            device="meta")
        tensor = DTensor.from_local(local, mesh, [placement], run_check=False,
                                    shape=param.shape, stride=param.stride())
    else:
        tensor = distribute_tensor(param.detach(), mesh, [placement], src_data_rank=src_data_rank)
    return nn.Parameter(tensor, requires_grad=param.requires_grad)


def _local_shape(shape: torch.Size, placement: Any, n: int) -> tuple[int, ...]:
    out = list(shape)
    if isinstance(placement, (Shard, _StridedShard)):  # same local size (not a subclass)
        out[placement.dim] //= n
    return tuple(out)


class HeadParallelAttention(ParallelStyle):
    """The module docstring's layout and forward for one ``nn.MultiheadAttention``."""

    def __init__(self) -> None:
        super().__init__()
        self.src_data_rank: Optional[int] = 0

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"HeadParallelAttention applies to nn.MultiheadAttention, not "
                            f"{type(module).__name__}")
        reason = attention_unsupported(module, device_mesh.size())
        if reason:
            raise ValueError(f"nn.MultiheadAttention cannot run head-parallel: {reason}")
        rank = self.src_data_rank
        module.in_proj_weight = _shard(module.in_proj_weight, device_mesh, QKV, rank)
        if module.in_proj_bias is not None:  # kept whole: see the module docstring
            module.in_proj_bias = _shard(module.in_proj_bias, device_mesh, Replicate(), rank)
        out = module.out_proj
        out.weight = _shard(out.weight, device_mesh, Shard(1), rank)
        if out.bias is not None:
            out.bias = _shard(out.bias, device_mesh, Replicate(), rank)
        module.forward = types.MethodType(_head_parallel_forward, module)
        module._fxplan_tp_mesh = device_mesh
        return module


def _local(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return t.to_local() if isinstance(t, DTensor) else t


def _float_mask(mask: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    """``nn.MultiheadAttention``'s mask convention: a boolean ``True`` masks out (``-inf``)."""
    if mask is None or mask.is_floating_point():
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, -math.inf)


def _head_parallel_forward(self: nn.MultiheadAttention, query: torch.Tensor, key: torch.Tensor,
                           value: torch.Tensor, key_padding_mask: Optional[torch.Tensor] = None,
                           need_weights: bool = True, attn_mask: Optional[torch.Tensor] = None,
                           average_attn_weights: bool = True, is_causal: bool = False
                           ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``nn.MultiheadAttention.forward`` on this rank's heads (module docstring)."""
    if not (query is key and key is value):
        raise NotImplementedError("head-parallel nn.MultiheadAttention runs self-attention only "
                                  "(query, key and value the same tensor)")
    mesh = self._fxplan_tp_mesh
    batched = query.dim() == 3
    sharded = query.placements if isinstance(query, DTensor) else None
    if sharded is not None:  # sequence parallel: all-gather (backward: reduce-scatter dx)
        if not batched:
            raise NotImplementedError("head-parallel nn.MultiheadAttention under sequence "
                                      "parallelism takes batched inputs")
        x = query.redistribute(mesh, [Replicate()]).to_local(grad_placements=[Partial()])
    else:                    # replicated: backward all-reduces dx
        x = DTensor.from_local(query, mesh, [Replicate()], run_check=False).to_local(
            grad_placements=[Partial()])
    x = x if batched else x.unsqueeze(1 if not self.batch_first else 0)
    if not self.batch_first:
        x = x.transpose(0, 1)                                    # (N, L, E)
    n, length, _ = x.shape
    heads = self.num_heads // mesh.size()
    bias = self.in_proj_bias
    if isinstance(bias, DTensor):  # this head group's rows; backward: all-gather the gradient
        bias = restrided(bias, [QKV]).to_local()
    qkv = F.linear(x, _local(self.in_proj_weight), bias)
    q, k, v = qkv.unflatten(-1, (3, heads, self.head_dim)).permute(2, 0, 3, 1, 4)  # (N, h, L, d)
    mask = _float_mask(attn_mask, q.dtype)
    if mask is not None and mask.dim() == 3:
        raise NotImplementedError("head-parallel nn.MultiheadAttention takes a 2-D attn_mask "
                                  "(a per-head 3-D mask is not split over tp)")
    padding = _float_mask(key_padding_mask, q.dtype)
    if padding is not None:
        padding = padding.reshape(n, 1, 1, length)
        mask = padding if mask is None else mask + padding
    dropout = self.dropout if self.training else 0.0
    weights = None
    if need_weights:
        if not average_attn_weights:
            raise NotImplementedError("head-parallel nn.MultiheadAttention returns head-averaged "
                                      "attention weights only (average_attn_weights=True)")
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        probs = torch.softmax(scores if mask is None else scores + mask, dim=-1)
        if is_causal and mask is None:
            raise NotImplementedError("is_causal without attn_mask and need_weights=True")
        o = F.dropout(probs, dropout, self.training) @ v
        weights = probs.sum(1) / self.num_heads
    else:
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                           is_causal=is_causal and mask is None)
    o = o.transpose(1, 2).reshape(n, length, heads * self.head_dim)
    y = F.linear(o, _local(self.out_proj.weight))               # a partial sum over tp
    if not self.batch_first:
        y = y.transpose(0, 1)
    if not batched:
        y = y.squeeze(1 if not self.batch_first else 0)
    y = DTensor.from_local(y, mesh, [Partial()], run_check=False)
    if sharded is not None:  # reduce-scatter back to the sequence shards (a DTensor)
        y = y.redistribute(mesh, sharded)
        if self.out_proj.bias is not None:
            y = y + self.out_proj.bias
    else:                    # all-reduce
        y = y.redistribute(mesh, [Replicate()]).to_local()
        if self.out_proj.bias is not None:
            y = y + _local(self.out_proj.bias)
    if weights is not None:
        weights = DTensor.from_local(weights, mesh, [Partial()], run_check=False).redistribute(
            mesh, [Replicate()]).to_local()
    return y, weights
