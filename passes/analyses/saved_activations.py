"""Activation memory: the bytes autograd saves for backward, measured per node.

While capture runs the graph on fake tensors with autograd on, every tensor an op hands to
autograd passes through ``torch.autograd.graph.saved_tensors_hooks``. The
:class:`SavedTensorRecorder` charges it to the fx node being executed, counting each storage
once (views of one buffer share it) and never parameters or buffers (model state, not
activations). This is what the op really saves: ``linear`` keeps its input, ``softmax`` its
output, ``gelu`` its input, ``layer_norm`` its input plus mean and rstd, dropout its mask.

Target device: a GPU runs dropout as one fused kernel that keeps a 1-byte ``bool`` mask; the
CPU runs a composite that keeps a mask in the input's dtype. :class:`FusedDropout` routes
``F.dropout`` in training to ``torch.native_dropout`` (the fused op) so that the measurement
matches the GPU. With that, a GPT layer with explicit attention in 16-bit precision saves
Korthikanti et al.'s (2022) ``34·s·b·h + 5·a·s²·b`` bytes plus O(s·b) normalisation
statistics (mean and rstd of both layer norms).

Attention with dropout: ``F.scaled_dot_product_attention(…, dropout_p > 0)`` in training runs
on the CPU by its composite (math) kernel, which keeps the ``s×s`` probabilities and dropout
mask per head; a GPU runs it as a fused kernel that keeps ``q, k, v``, the output, the
log-sum-exp per query row and its random-number state (and the additive bias a mask becomes)
— Hugging Face's GPT-2 small, 1024 tokens, bf16: 8 MiB against 153 MiB per layer. :class:`FusedAttentionDropout` routes such a call to the
GPU's kernel (flash without a mask, memory-efficient with one; their autograd formulas run on
fake CPU tensors), so that the saved bytes are the GPU's.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode


class SavedTensorRecorder:
    """Charges each newly saved storage's bytes to ``current`` (a node name), and notes the
    later nodes that save a storage again (:attr:`shared`)."""

    def __init__(self, state: Iterable[torch.Tensor] = ()) -> None:
        self.current: str | None = None
        self.saved: dict[str, int] = defaultdict(int)
        self._state: set[StorageWeakRef] = {StorageWeakRef(t.untyped_storage()) for t in state}
        self._first: dict[StorageWeakRef, tuple[str | None, int]] = {}  # → node charged, bytes
        self._again: dict[StorageWeakRef, list[str]] = {}  # storage → later savers, in order
        self._alive: list[torch.Tensor] = []  # keeps storages alive so weak refs stay unique

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = StorageWeakRef(t.untyped_storage())
        if key in self._state:
            return t
        if key not in self._first:
            nbytes = t.untyped_storage().nbytes()
            self._first[key] = (self.current, nbytes)
            self._alive.append(t)
            if self.current is not None:
                self.saved[self.current] += nbytes
        elif self.current is not None and self.current != self._first[key][0]:
            later = self._again.setdefault(key, [])
            if self.current not in later:
                later.append(self.current)
        return t

    @property
    def shared(self) -> dict[str, tuple[tuple[int, tuple[str, ...]], ...]]:
        """Per node, the storages it was charged for that later nodes save too: ``(bytes,
        (later savers…))`` each — the storage stays alive while any of its savers' saved
        tensors do."""
        out: dict[str, list[tuple[int, tuple[str, ...]]]] = defaultdict(list)
        for key, later in self._again.items():
            first, nbytes = self._first[key]
            if first is not None:
                out[first].append((nbytes, tuple(later)))
        return {name: tuple(rows) for name, rows in out.items()}

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        """Context manager that records while it is open."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)


class FusedDropout(TorchFunctionMode):
    """``F.dropout(x, p, training=True)`` and export's ``aten.dropout(x, p, train=True)`` →
    ``torch.native_dropout`` (the GPU's fused op)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten.dropout.default or func is torch.dropout:  # export's ATen op
            x, p, training = (*args, *kwargs.values())[:3]
            if training and 0.0 < p < 1.0:
                return torch.native_dropout(x, p, True)[0]
        if func is F.dropout:
            x = args[0]
            p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
            training = args[2] if len(args) > 2 else kwargs.get("training", True)
            inplace = args[3] if len(args) > 3 else kwargs.get("inplace", False)
            if training and not inplace and 0.0 < p < 1.0:
                return torch.native_dropout(x, p, True)[0]
        return func(*args, **kwargs)


#: Positions of ``attn_mask, dropout_p, is_causal`` in ``F.scaled_dot_product_attention``'s and
#: ATen's ``scaled_dot_product_attention`` arguments (``query, key, value`` before them).
_SDPA_OPTIONS = ("attn_mask", "dropout_p", "is_causal")


class FusedAttentionDropout(TorchFunctionMode):
    """``F.scaled_dot_product_attention`` (and export's ATen op) with ``dropout_p > 0`` while
    autograd records → the GPU's fused kernel: ``aten._scaled_dot_product_flash_attention``
    without a mask, ``aten._scaled_dot_product_efficient_attention`` with one (a boolean mask
    as the additive bias a GPU builds from it); its output, the same values' shape and layout.
    A call whose key has fewer heads than its query beside a mask keeps the CPU's kernel."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if (func is F.scaled_dot_product_attention
                or func is torch.ops.aten.scaled_dot_product_attention.default):
            routed = _fused_with_dropout(args, kwargs)
            if routed is not None:
                return routed
        return func(*args, **kwargs)


def _fused_with_dropout(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The GPU kernel's output for an attention call with dropout (:class:`FusedAttentionDropout`),
    ``None`` for a call the CPU's kernel keeps."""
    if len(args) < 3:   # query, key and value named: the CPU's kernel
        return None
    q, k, v = args[:3]
    options = dict(zip(_SDPA_OPTIONS, args[3:]))
    options.update((name, kwargs[name]) for name in _SDPA_OPTIONS if name in kwargs)
    mask, p = options.get("attn_mask"), float(options.get("dropout_p") or 0.0)
    causal, scale = bool(options.get("is_causal", False)), kwargs.get("scale")
    if p <= 0.0 or not torch.is_grad_enabled():
        return None
    aten = torch.ops.aten
    if mask is None:
        return aten._scaled_dot_product_flash_attention(q, k, v, p, causal, scale=scale)[0]
    if k.shape[-3] != q.shape[-3]:
        return None
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(
            mask.logical_not(), float("-inf"))
    bias = mask.expand(*q.shape[:-1], k.shape[-2])
    return aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, p, causal,
                                                        scale=scale)[0]
