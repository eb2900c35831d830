"""Activation recompute per repeated block, as planned.

``plan.recompute(i)`` for block ``i`` (the config's policy, or the plan's per-block override):

    none       keep every activation autograd saves
    full       wrap ``layer_i`` in ``checkpoint_wrapper`` (non-reentrant): only the block's
               input is saved, the whole block is recomputed in backward; under a split
               backward (zero-bubble schedules) ``kept_checkpoint`` instead, whose recompute
               serves the input-gradient and the weight-gradient pass
               (:mod:`fxplan.passes.rewrite.split_recompute`)
    selective  recompute only the attention core (Korthikanti et al., 2022): the nodes from the
               first activation × activation product (``QKᵀ``) to the second (``·V``), or a fused
               ``scaled_dot_product_attention``, are outlined into ``attn_core`` inside the block
               and that submodule is wrapped — its ``O(s²)`` scores/probabilities are not saved;
               under a split backward too: the core holds no weights, so the weight pass never
               reads what it saved and it is recomputed once, in the input-gradient pass

The pass runs on a module whose children ``layer_i`` are the outlined blocks (a pipeline stage or
the whole outlined graph). Recompute changes memory and time, never values.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

from fxplan.passes.rewrite.base import PassResult, RewritePass
from fxplan.passes.rewrite.split_recompute import kept_checkpoint

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["Recompute", "attention_core"]

_MATMULS = {operator.matmul, torch.matmul, torch.bmm}
_SDPA = {F.scaled_dot_product_attention}


def _is_activation_product(gm: fx.GraphModule, node: fx.Node) -> bool:
    is_product = (node.op == "call_function" and node.target in _MATMULS) or (
        node.op == "call_method" and node.target in ("matmul", "bmm"))
    if not is_product:
        return False
    return all(arg.op not in ("get_attr",) for arg in node.all_input_nodes)


def attention_core(gm: fx.GraphModule) -> list[fx.Node]:
    """The nodes of one block's attention core (see the module docstring); ``[]`` if none."""
    nodes = list(gm.graph.nodes)
    for node in nodes:
        if node.op == "call_function" and node.target in _SDPA:
            return [node]
    products = [i for i, node in enumerate(nodes) if _is_activation_product(gm, node)]
    if len(products) < 2:
        return []
    first, second = products[0], products[1]
    core = set(nodes[first:second + 1])
    # Keep only nodes that depend on the first product (shape arithmetic stays outside).
    keep = {nodes[first]}
    for node in nodes[first + 1:second + 1]:
        if any(arg in keep for arg in node.all_input_nodes):
            keep.add(node)
    return [n for n in nodes if n in core and n in keep]


class Recompute(RewritePass):
    """Wrap blocks (``full``) or their attention cores (``selective``) in checkpoints."""

    name = "recompute"

    def run(self, gm: nn.Module, plan: "Plan") -> PassResult:
        changed = False
        for name, block in list(gm.named_children()):
            if not name.startswith("layer_"):
                continue
            index = int(name.split("_", 1)[1])
            policy = plan.recompute(index)
            if policy == "full":
                if plan.config.splits_backward:
                    kept_checkpoint(block)
                else:
                    setattr(gm, name, checkpoint_wrapper(block))
                changed = True
            elif policy == "selective":
                if not isinstance(block, fx.GraphModule):
                    raise self.error(f"block {name} is not a graph module", name)
                setattr(gm, name, self._selective(block, name))
                changed = True
        return PassResult(gm, changed)

    def _selective(self, block: fx.GraphModule, name: str) -> fx.GraphModule:
        core = attention_core(block)
        if not core:
            raise self.error("selective recompute found no attention core in the block", name)
        fused = fuse_by_partitions(block, [dict.fromkeys(core)], prefix="attn_core_")
        for child_name, child in list(fused.named_children()):
            if child_name.startswith("attn_core_"):
                setattr(fused, child_name, checkpoint_wrapper(child))
        fused.recompile()
        return fused
