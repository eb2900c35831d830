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
