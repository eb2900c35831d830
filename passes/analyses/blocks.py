"""Module paths, layers and repeated blocks.

A *layer container* is a ``ModuleList``/``Sequential``/``ModuleDict`` of two or more child modules that are
not ``torch.nn`` leaves (of one, when no container of two or more is found: a model built with
one block) (transformer blocks, residual blocks, ``nn.TransformerEncoderLayer``
in ``nn.TransformerEncoder.layers``), outermost only: ``model.layers.N`` (Llama),
``transformer.h.N`` (GPT-2), ``bert.encoder.layer.N`` (BERT). Each child is
a layer; layers are numbered in the order the graph first runs them, across containers.

A layer's *signature* hashes, in graph order, every node's op, its target with the layer's
own prefix removed (``h.7.attn.qkv`` → ``attn.qkv``), its arguments (nodes of the same layer
by position, nodes outside by order of first use, constants by value), its shape and dtype,
and the shapes and dtypes of the parameters it owns. The layer index appears nowhere, so
identical blocks hash alike and form one :class:`RepeatedBlock`: the planner solves one and
reuses the answer for all.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import torch
import torch.fx

from fxplan.passes.analyses.lifted import constant_key
from fxplan.passes.analyses.structural_blocks import segment_signature, structural_layers
from fxplan.passes.node_info import NodeInfo, ParamInfo, RepeatedBlock, target_name


def module_path(node: torch.fx.Node) -> str:
    """Qualified name of the innermost module ``node`` runs in (``""``: the root)."""
    if node.op == "call_module":
        return str(node.target)
    if node.op == "get_attr":
        return str(node.target).rpartition(".")[0]
    stack = node.meta.get("nn_module_stack")
    return next(reversed(stack.values()))[0] if stack else ""


#: Modules whose children may be layers, numbered ``layers.N`` (a ``ModuleDict`` with integer keys,
#: as torchtitan's ``layers["N"]``).
_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)


def layer_containers(model: torch.nn.Module, smallest: int = 2) -> list[str]:
    """Qualified names of the outermost containers of at least ``smallest`` children whose
    children are layers."""
    found: list[str] = []
    for name, m in model.named_modules():
        if not isinstance(m, _CONTAINERS) or len(m) < smallest:
            continue
        if any(c == "" or name.startswith(f"{c}.") for c in found):
            continue  # nested in a layer: part of that layer
        if all(not _is_torch_leaf(child) for child in m.children()):
            found.append(name)
    return found


def _is_torch_leaf(m: torch.nn.Module) -> bool:
    """A ``torch.nn`` module without submodules (``Linear``, ``ReLU``): never a layer. A
    composite one (``nn.TransformerEncoderLayer``) is a layer like a user's block."""
    return m.__module__.startswith("torch.nn") and next(m.children(), None) is None


def assign_layers(gm: torch.fx.GraphModule, containers: list[str],
                  infos: dict[str, NodeInfo]) -> dict[int, tuple[str, list[str]]]:
    """Set ``info.layer`` for nodes inside a layer; returns layer → (prefix, node names)."""
    patterns = [re.compile(rf"^{re.escape(c)}{'.' if c else ''}(\d+)(?:\.|$)") for c in containers]
    index: dict[str, int] = {}
    layers: dict[int, tuple[str, list[str]]] = {}
    for node in gm.graph.nodes:
        info = infos[node.name]
        for container, pattern in zip(containers, patterns):
            match = pattern.match(info.module_path)
            if match:
                prefix = f"{container}.{match[1]}" if container else match[1]
                layer = index.setdefault(prefix, len(index))
                info.layer = layer
                layers.setdefault(layer, (prefix, []))[1].append(node.name)
                break
    return layers


def layer_signature(gm: torch.fx.GraphModule, prefix: str, names: list[str],
                    infos: dict[str, NodeInfo], params: dict[str, ParamInfo]) -> str:
    """Structural hash of one layer (see the module docstring); 16 hex digits."""
    position = {name: i for i, name in enumerate(names)}
    external: dict[str, int] = {}
    nodes = {n.name: n for n in gm.graph.nodes}

    def ref(value: torch.fx.Node) -> str:
        if value.name in position:
            return f"%{position[value.name]}"
        return f"$in{external.setdefault(value.name, len(external))}"

    def relative(target: Any) -> str:
        text = target_name(target)
        if text == prefix:  # the layer itself, kept as a leaf module
            return "<layer>"
        return text[len(prefix) + 1:] if text.startswith(prefix + ".") else text

    parts = []
    for name in names:
        node, info = nodes[name], infos[name]
        args = torch.fx.node.map_arg((node.args, node.kwargs), ref)  # slices included
        owned = [(relative(p), params[p].shape, str(params[p].dtype)) for p in info.params]
        parts.append(repr((node.op, constant_key(node, relative(node.target)), args,
                           info.shape, str(info.dtype), owned)))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


#: How :func:`find_blocks` found the layers (``CapturedGraph.block_method``).
HIERARCHY, STRUCTURE, NONE = "module hierarchy", "graph structure", "none"


def find_blocks(gm: torch.fx.GraphModule, model: torch.nn.Module, infos: dict[str, NodeInfo],
                params: dict[str, ParamInfo]
                ) -> tuple[list[RepeatedBlock], dict[int, str], str]:
    """Number layers, sign them and group layers with equal signatures (in layer order).
    Returns the blocks, each layer's module path (or name) and the method that found them:
    the module hierarchy's layer containers, else the graph's structure
    (:mod:`fxplan.passes.analyses.structural_blocks`: repeated segments between cuts of the
    parameter-dependent stream), else none."""
    containers = layer_containers(model)
    layers = assign_layers(gm, containers, infos)
    if not layers:  # a model of one block (``layers=1``): its container holds one layer
        layers = assign_layers(gm, layer_containers(model, smallest=1), infos)
    method = HIERARCHY if layers else NONE
    if not layers:
        layers = structural_layers(gm, infos, params)
        method = STRUCTURE if layers else NONE
    groups: dict[str, tuple[list[int], list[list[str]]]] = {}
    by_name = {n.name: n for n in gm.graph.nodes}
    for layer, (prefix, names) in sorted(layers.items()):
        signature = (layer_signature(gm, prefix, names, infos, params) if method == HIERARCHY
                     else segment_signature([by_name[n] for n in names], infos, params))
        for name in names:
            infos[name].block_signature = signature
        entry = groups.setdefault(signature, ([], []))
        entry[0].append(layer)
        entry[1].append(names)
    blocks = [RepeatedBlock(sig, ls, ns) for sig, (ls, ns) in groups.items()]
    return blocks, {layer: prefix for layer, (prefix, _) in layers.items()}, method
