"""Constants ``torch.export`` lifts out of a forward (``transformer.h.1.self_attention.
lifted_tensor_2``): numbered across the whole model, so the same constant has another number in
each layer. Layers are compared by the constant's value, not its number (the unroll's proof that
a layer repeats, the repeated blocks' signatures)."""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.fx

__all__ = ["LIFTED", "constant_key"]

#: The name of a lifted constant; group 1 is the name without its number.
LIFTED = re.compile(r"(lifted_tensor|_tensor_constant)_?\d+$")


def constant_key(node: torch.fx.Node, target: str) -> Any:
    """``target`` (a ``get_attr`` node's, maybe renamed) as layers compare it: a lifted
    constant by its name without the number and its value (the elements when small, else a hash
    of its bytes; ``None`` when it has none to read), any other target as it is."""
    if node.op != "get_attr" or not LIFTED.search(target):
        return target
    owner: Any = node.graph.owning_module
    try:
        for part in str(node.target).split("."):
            owner = getattr(owner, part)
    except AttributeError:
        owner = None
    value: Any = None
    if isinstance(owner, torch.Tensor) and not owner.is_meta:
        value = (tuple(owner.flatten().tolist()) if owner.numel() <= 64
                 else hash(owner.detach().cpu().numpy().tobytes()))
    return LIFTED.sub(r"\1", target), value
