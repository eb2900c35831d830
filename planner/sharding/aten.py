"""ATen ops (what ``torch.export`` records) → the op identity of their ``torch`` spelling.

A graph captured by ``torch.export`` calls ``aten.linear.default``, ``aten.view.default``,
``aten.add.Tensor``, … where a ``symbolic_trace`` graph calls ``F.linear``, ``x.view``,
``operator.add``. Their arguments are in the same order (ATen's schema is the method's:
``self`` first), so one rule serves both: :func:`aten_identity` maps an ATen overload to the
key its rule is registered under — a ``torch`` function for the functional ops (table
below), else the method name (``"view"``, ``"add"``, ``"permute"``, ``"silu"``). ATen ops
whose arguments differ from every ``torch`` spelling keep their own rules, registered under
the overload (``aten.embedding(weight, indices)``, ``aten.slice``, ``aten.select``,
``aten.expand``). An op whose key has no rule is replicated and reported, as any other.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from fxplan.passes.analyses.ops import aten_key

__all__ = ["aten_identity", "is_aten"]

aten = torch.ops.aten

#: ATen packet names whose rule is registered under a ``torch`` function or an overload.
_FUNCTIONS: dict[str, Any] = {
    "linear": F.linear,
    "scaled_dot_product_attention": F.scaled_dot_product_attention,
    "layer_norm": F.layer_norm,
    "batch_norm": F.batch_norm,
    "cross_entropy_loss": F.cross_entropy,
    "cat": torch.cat,
    "conv1d": F.conv1d, "conv2d": F.conv2d, "conv3d": F.conv3d,
    "embedding": aten.embedding.default,
    "slice": aten.slice.Tensor,
    "select": aten.select.int,
    "expand": aten.expand.default,
    "unsafe_view": "view",
    "split_with_sizes": "split",
}
if hasattr(F, "rms_norm"):
    _FUNCTIONS["rms_norm"] = F.rms_norm


def is_aten(target: Any) -> bool:
    return isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket))


def aten_identity(op: "torch._ops.OpOverload | torch._ops.OpOverloadPacket") -> Any:
    """The rule key of an ATen op: a ``torch`` function, an overload or a method name."""
    name = aten_key(op)
    return _FUNCTIONS.get(name, name)
