"""Attention priced as one fused (flash) kernel where the devices run one.

A model may spell attention out (``QKᵀ``, scale, mask, softmax, dropout, ``·V``: the
*attention core* of :func:`cost_model.memory.activations.attention_core`), but on devices whose spec
says ``fused_attention: true`` (H100/H200: Megatron-Core through Transformer Engine, PyTorch
SDPA) the training stack runs it as one FlashAttention-style kernel. Priced op by op, the
core reads and writes the ``b·a·s²`` scores several times (at s = 4096 that is most of a small
model's layer time); fused, the scores never reach HBM. Whether attention is fused is the
device group's explicit assumption (``DeviceGroup.fused_attention``), reported by
``fxplan clusters show`` and overridable per group (``dgx-h100:h100.fused_attention=false``).

For a core with query/key/value ``q, k, v`` (``b·a`` heads of ``s × d``) and output ``o``, one
microbatch, as priced by :mod:`cost_model.compute.op_time` with op class ``attention``:

- FLOPs executed, forward: ``F = Σ`` of the core's two matrix products ``= 4·b·a·s²·d``; with a
  causal mask (the core masks its scores with a fixed mask, or an SDPA node says
  ``is_causal``) the kernel skips the blocks above the diagonal and computes the diagonal
  ones whole: ``F·(1 + 128/s)/2`` (FlashAttention's 128-row tiles). The model FLOPs (MFU,
  Megatron's convention) still count the full square.
- bytes, forward: ``q, k, v`` read, ``o`` written, and the log-sum-exp statistics
  (``b·a·s`` fp32) written — ``O(s·d)`` per head instead of ``O(s²)``.
- backward: :data:`cost_model.compute.op_time.BACKWARD` ``["attention"]`` (one kernel, 2.5× the
  FLOPs: it recomputes the scores, as flash does, then 4 more products; 2× the bytes), at
  ``BACKWARD_SPEED = 0.83`` of the forward kernel's FLOP rate: measured on H100 SXM5, head
  dim 128, s = 4096 (Shah et al. 2024, FlashAttention-3, forward/backward figures;
  ``benchmarks/data/hardware.md``), backward/forward TFLOP/s is cuDNN 499/609 = 0.82,
  FlashAttention-3 542/638 = 0.85, FlashAttention-2 310/368 = 0.84.
- causal: the kernel runs its executed blocks at ``CAUSAL_SPEED = 0.88`` of the full-square
  rate (the diagonal tiles are partly masked, the work per query tile is uneven, so the
  last wave is ragged). Measured on H100 SXM5, head dim 128, s = 4096, forward (Shah et al.
  2024, FlashAttention-3; ``benchmarks/data/hardware.md``), with the paper counting the
  causal half ``F/2`` and this module the executed ``F·(1 + 128/s)/2``: cuDNN
  518·(33/32)/609 = 0.88, FlashAttention-3 579·(33/32)/638 = 0.94, FlashAttention-2
  319·(33/32)/368 = 0.89; the cuDNN figure (whose non-causal 609 the ``attention``
  efficiency 0.6 stands for) is used. The paper gives no causal backward figures: the
  backward is assumed to lose the same share.
- saved for the backward: ``q, k, v, o`` and the statistics — ``O(s)`` per head, no ``s²``
  term (Korthikanti et al.'s ``5·a·s²·b`` bytes disappear).

The efficiency of the kernel is the device's ``attention`` curve (``compute_efficiency``
``attention`` and ``cost_model/data/efficiency.json``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from fxplan.cost_model.memory.activations import attention_core, tensor_bytes

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cost_model.parallel.megatron_layout import TPLayout
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["BACKWARD_SPEED", "CAUSAL_SPEED", "FusedAttention", "FLASH_TILE", "causal_fraction", "fused_attention_core",
           "prices_fused_attention"]

#: Rows of the query (and key) tiles of FlashAttention-2/3's forward kernel at head dim 128.
FLASH_TILE = 128

#: Backward FLOP rate of a flash kernel relative to its forward (module docstring).
BACKWARD_SPEED = 0.83

#: FLOP rate of a causal flash kernel (on the blocks it executes) relative to a full-square
#: one (module docstring).
CAUSAL_SPEED = 0.88

#: Ops that mask the scores inside an attention core.
_MASK_OPS = frozenset({"masked_fill", "where"})


@dataclass(frozen=True)
class FusedAttention:
    """The fused kernel that stands for an attention core, at the capture's batch.

    ``nodes`` are the core's nodes (priced by this kernel instead of one by one); ``output``
    the node whose value is ``o``; ``flops`` the FLOPs the kernel executes (causal: about
    half of ``model_flops``); ``bytes_moved`` its forward traffic; ``saved_bytes`` what it
    keeps for the backward. ``out_kept_by``: the op outside the core that keeps the output
    ``o`` as its saved input (``out_bytes`` of it), reached through views and a layout copy —
    a GPU's kernel writes ``o`` in the layout the out-projection reads, so that copy is a view
    there and the kernel's ``o`` and that op's input are one storage, counted once."""

    nodes: frozenset[str]
    output: str
    flops: float
    model_flops: float
    bytes_moved: float
    saved_bytes: float
    causal: bool
    out_kept_by: str | None = None
    out_bytes: float = 0.0


def prices_fused_attention(device: Any) -> bool:
    """Whether ``device`` (a ``DeviceGroup``) runs attention as a fused kernel."""
    return bool(getattr(device, "fused_attention", False))


def causal_fraction(seq: int, tile: int = FLASH_TILE) -> float:
    """Share of the ``s×s`` square a causal flash kernel computes: ``(1 + tile/s)/2`` (the
    ``n(n+1)/2`` tiles on and below the diagonal of ``n = s/tile``), 1 for ``s ≤ tile``."""
    if seq <= tile:
        return 1.0
    return (1 + tile / seq) / 2


def _op_names(node: Any) -> set[str]:
    """The words of a node's target: ``masked_fill`` (method), ``where`` (function),
    ``aten.masked_fill.Scalar`` → {aten, masked_fill, scalar}; trailing ``_`` (in place) off."""
    text = getattr(node.target, "__name__", None) or str(node.target)
    return {w.rstrip("_") for w in re.split(r"[^a-z0-9_]+", text.lower()) if w}


#: Position of ``is_causal`` among the positional arguments of each SDPA variant
#: (``F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)``; ATen's
#: flash variant ``(q, k, v, dropout_p, is_causal)``; its efficient and cuDNN variants
#: ``(q, k, v, attn_bias, compute_log_sumexp, dropout_p, is_causal)``).
_IS_CAUSAL_AT = {"scaled_dot_product_attention": 5,
                 "scaled_dot_product_flash_attention": 4,
                 "scaled_dot_product_flash_attention_for_cpu": 4,
                 "scaled_dot_product_efficient_attention": 6,
                 "scaled_dot_product_cudnn_attention": 6}


def _is_causal_sdpa(node: Any) -> bool:
    if node.kwargs.get("is_causal"):
        return True
    names = {n.lstrip("_") for n in _op_names(node)}
    for name, index in _IS_CAUSAL_AT.items():
        if name in names:
            return len(node.args) > index and node.args[index] is True
    return False


def fused_attention_core(graph: CapturedGraph, names: Sequence[str],
                         layout: TPLayout) -> FusedAttention | None:
    """The :class:`FusedAttention` of the segment ``names``, ``None`` without an attention
    core. A core that is a single fused node (SDPA) keeps its captured traffic and saved
    bytes; only the causal skip is applied to it."""
    core = attention_core(graph, names, layout)
    if not core:
        return None
    nodes = graph.nodes_by_name
    infos = graph.infos_by_name
    ordered = [n for n in names if n in core]
    products = [n for n in ordered if infos[n].op_class in ("matmul", "attention")]
    if not products:
        return None
    output = products[-1]
    model_flops = float(sum(infos[n].flops or 0 for n in products))
    fused_nodes = [n for n in products if infos[n].op_class == "attention"]
    kept_by, kept_bytes = None, 0.0   # an SDPA node shares its output via NodeInfo.saved_shared
    if fused_nodes:
        causal = any(_is_causal_sdpa(nodes[n]) for n in fused_nodes)
        seq = _query_rows(infos[output])
        info = infos[output]
        traffic = float((info.bytes_read or 0) + (info.bytes_written or 0))
        saved = float(sum(infos[n].saved_bytes for n in ordered))
    else:
        causal = any(_op_names(nodes[n]) & _MASK_OPS for n in ordered)
        seq = _query_rows(infos[output])
        inputs = _core_inputs(graph, core, layout)
        out_bytes = float(tensor_bytes(infos[output]))
        stats = _stats_bytes(infos[output])
        traffic = inputs + out_bytes + stats
        saved = inputs + out_bytes + stats
        kept_by = _consumer_keeping(graph, core, output)
        kept_bytes = out_bytes if kept_by else 0.0
    executed = model_flops * (causal_fraction(seq) if causal else 1.0)
    return FusedAttention(frozenset(core), output, executed, model_flops, traffic, saved, causal,
                          kept_by, kept_bytes)


#: Ops that copy a tensor into another layout (``.contiguous()``, ATen's ``clone``): a view of
#: a fused kernel's output, which is written in the layout its reader wants.
_LAYOUT_COPIES = frozenset({"contiguous", "clone"})


def _consumer_keeping(graph: CapturedGraph, core: frozenset[str], output: str) -> str | None:
    """The matrix product outside ``core`` whose saved input is the core's output, reached
    through views and layout copies (:attr:`FusedAttention.out_kept_by`); ``None`` if none."""
    nodes = graph.nodes_by_name
    infos = graph.infos_by_name
    out_bytes = tensor_bytes(infos[output])
    frontier = [output]
    while frontier:
        for user in nodes[frontier.pop()].users:
            info = infos.get(user.name)
            if user.name in core or info is None:
                continue
            if info.op_class == "view" or _op_names(user) & _LAYOUT_COPIES:
                frontier.append(user.name)
            elif info.op_class == "matmul" and info.saved_bytes >= out_bytes:
                return user.name
    return None


def _query_rows(info: Any) -> int:
    """``s``: the second-to-last dimension of the attention output ``(…, s, d)``."""
    shape = info.shape if isinstance(info.shape[0], int) else info.shape[0]
    return int(shape[-2])


def _stats_bytes(info: Any) -> float:
    """The fp32 log-sum-exp per query row: ``numel(o)/d · 4``."""
    shape = info.shape if isinstance(info.shape[0], int) else info.shape[0]
    rows = 1
    for d in shape[:-1]:
        rows *= int(d)
    return float(rows * 4)


def _core_inputs(graph: CapturedGraph, core: frozenset[str], layout: TPLayout) -> float:
    """Bytes of the floating-point activations the core reads from outside (``q, k, v``;
    views followed back to their storage; masks, parameters and buffers left out)."""
    nodes = graph.nodes_by_name
    infos = graph.infos_by_name
    bases: set[str] = set()
    for name in core:
        for source in layout.inputs.get(name, ()):
            if source in core:
                continue
            while source in infos and infos[source].op_class == "view" \
                    and layout.inputs.get(source):
                source = layout.inputs[source][0]
            if source in core or source not in infos \
                    or nodes[source].op in ("get_attr", "placeholder"):
                continue
            dtype = infos[source].dtype
            dtype = dtype[0] if isinstance(dtype, tuple) else dtype
            if dtype is None or not dtype.is_floating_point:
                continue
            bases.add(source)
    return float(sum(tensor_bytes(infos[b]) for b in bases))
