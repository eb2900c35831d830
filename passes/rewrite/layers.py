"""Outline the repeated blocks of a flat fx graph into one submodule each.

A captured transformer is one flat graph. Every later step of the emitted program works per
repeated block (recompute wraps a block, FSDP shards a block, a pipeline stage is a range of
blocks), so this pass partitions the nodes

    embed      every node before the first block node (embedding, positions, …)
    layer_i    the nodes of block ``i`` (and block-less glue that follows it)
    head       every node after the last block (final norm, LM head)

and rewrites the graph with :func:`torch.fx.passes.split_module.split_module` into a top-level
graph that calls ``embed``, ``layer_0`` … ``layer_{L-1}``, ``head``. Parameters keep their
identity (a tied embedding/LM-head weight is still one ``Parameter`` shared by ``embed`` and
``head``), and nodes keep their names inside the submodules, so plan placements keyed by node
name still apply.

A node's block comes from ``node.meta["fxplan"].layer`` when capture annotated it, otherwise from
``node.meta["nn_module_stack"]``: the module path ``<prefix>.<i>`` whose ``prefix`` holds the most
distinct indices (``h`` or ``transformer.h`` in a GPT).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from torch import fx
from torch.fx.passes.split_module import split_module

from fxplan.passes.rewrite.base import PassResult, RewritePass

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["OutlineLayers", "node_layers", "layer_submodule_names", "EMBED", "HEAD"]

EMBED, HEAD = "embed", "head"
_INDEXED = re.compile(r"^(.*)\.(\d+)$")


def _module_paths(node: fx.Node) -> list[str]:
    stack = node.meta.get("nn_module_stack") or {}
    paths = []
    for key, value in stack.items():
        paths.append(value[0] if isinstance(value, tuple) and isinstance(value[0], str) else key)
    return paths


def _block_prefix(gm: fx.GraphModule) -> str | None:
    indices: dict[str, set[int]] = {}
    for node in gm.graph.nodes:
        for path in _module_paths(node):
            match = _INDEXED.match(path)
            if match:
                indices.setdefault(match.group(1), set()).add(int(match.group(2)))
    if not indices:
        return None
    return max(indices, key=lambda prefix: (len(indices[prefix]), -prefix.count(".")))


def node_layers(gm: fx.GraphModule) -> dict[str, int | None]:
    """Block index of each node that belongs to a repeated block (``None`` otherwise)."""
    layers: dict[str, int | None] = {}
    prefix = _block_prefix(gm)
    pattern = re.compile(rf"^{re.escape(prefix)}\.(\d+)(\.|$)") if prefix is not None else None
    for node in gm.graph.nodes:
        info = node.meta.get("fxplan")
        layer = getattr(info, "layer", None)
        if layer is None and pattern is not None:
            for path in _module_paths(node):
                match = pattern.match(path)
                if match:
                    layer = int(match.group(1))
                    break
        layers[node.name] = layer
    return layers


def layer_submodule_names(num_layers: int) -> list[str]:
    """``["embed", "layer_0", …, "layer_{L-1}", "head"]``, the order of the outlined graph."""
    return [EMBED, *(f"layer_{i}" for i in range(num_layers)), HEAD]


class OutlineLayers(RewritePass):
    """Flat graph → ``embed``, ``layer_i``…, ``head`` submodules (see the module docstring)."""

    name = "outline-layers"

    def run(self, gm: fx.GraphModule, plan: "Plan") -> PassResult:
        if getattr(gm, "meta", {}).get("fxplan_outlined"):
            return PassResult(gm, False)
        layers = node_layers(gm)
        found = sorted({layer for layer in layers.values() if layer is not None})
        if not found:
            return PassResult(gm, False)
        if found != list(range(len(found))):
            raise self.error(f"repeated blocks {found} are not numbered 0…{len(found) - 1}")
        num_layers = len(found)
        # Partition id: 0 = embed, i + 1 = layer i, L + 1 = head; block-less nodes join the
        # partition of the block before them (embed before the first, head after the last).
        partition: dict[str, int] = {}
        current, last_seen = 0, -1
        for node in gm.graph.nodes:
            layer = layers[node.name]
            if layer is not None:
                if layer < last_seen:
                    raise self.error(f"block {layer} follows block {last_seen} in graph order", node)
                last_seen = layer
                current = layer + 1
            partition[node.name] = current
        last_block_node = max(
            (i for i, node in enumerate(gm.graph.nodes) if layers[node.name] is not None)
        )
        for i, node in enumerate(gm.graph.nodes):
            if i > last_block_node and node.op not in ("placeholder", "output"):
                partition[node.name] = num_layers + 1
        split = split_module(gm, gm, lambda node: partition[node.name], keep_original_order=True)
        names = layer_submodule_names(num_layers)
        for node in split.graph.nodes:
            if node.op == "call_module" and node.target.startswith("submod_"):
                new_name = names[int(node.target.split("_", 1)[1])]
                setattr(split, new_name, getattr(split, node.target))
                delattr(split, node.target)
                node.target = new_name
                node.name = new_name
        split.graph.lint()
        split.recompile()
        split.meta["fxplan_outlined"] = True
        split.meta["fxplan_num_layers"] = num_layers
        return PassResult(split, True)
