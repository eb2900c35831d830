"""Repeated blocks from graph structure, for models without numbered layer containers.

When no ``ModuleList``/``Sequential`` of layers exists (blocks held as attributes
``block_a``, ``block_b`` of one class, or a functional model looping over a list of weight
tensors), the layers are found in the graph itself:

1. **Stream and cuts.** A node is on the *stream* when it depends on a trainable parameter
   (side values — masks from ``torch.ones``, positions, rotary tables from buffers — are not).
   Stream node ``v`` at position ``i`` of the graph order is a *cut* (a layer-like boundary)
   when no earlier stream node is used after it: every value the rest of the graph needs from
   before ``v`` is ``v`` itself (the residual stream between two residual adds).
2. **Segments** are the nodes from one cut (exclusive) to the next (inclusive). A segment's
   signature hashes, in order, each node's op, its target (a parameter read as ``<param>`` with
   its shape and dtype, never its name), its arguments (nodes of the segment by position,
   others by order of first use, constants by value), shape and dtype.
3. **Repeats.** The run of ``k ≥ 2`` consecutive groups of ``p`` segments with equal
   signatures, each reading a parameter, that covers the most nodes (then the smallest ``p``, then the earliest) gives
   the layers: group ``j`` is layer ``j``, named by the longest module path its nodes share
   (``block_a``), else ``graph-layer-j``.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import torch
import torch.fx

from fxplan.passes.node_info import NodeInfo, ParamInfo, target_name

__all__ = ["structural_layers", "segment_signature"]


def _stream(gm: torch.fx.GraphModule, params: dict[str, ParamInfo]) -> set[str]:
    """Names of nodes that depend on a trainable parameter."""
    trainable = set(params)
    stream: set[str] = set()
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            if target_name(node.target) in trainable:
                stream.add(node.name)
        elif node.op == "call_module":
            owns = any(n.startswith(f"{node.target}.") for n in trainable)
            if owns or any(a.name in stream for a in node.all_input_nodes):
                stream.add(node.name)
        elif node.op != "placeholder" and any(a.name in stream for a in node.all_input_nodes):
            stream.add(node.name)
    return stream


def _segments(gm: torch.fx.GraphModule, stream: set[str]) -> list[list[torch.fx.Node]]:
    """The graph's nodes cut at every stream cut (module docstring, step 1)."""
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    position = {n.name: i for i, n in enumerate(nodes)}
    segments: list[list[torch.fx.Node]] = [[]]
    reach = -1  # the last position an earlier stream activation is used at
    for i, node in enumerate(nodes):
        segments[-1].append(node)
        if node.name in stream and node.op != "get_attr" and reach <= i:
            segments.append([])
        if node.name in stream and node.op != "get_attr":
            last = max((position.get(u.name, len(nodes)) for u in node.users), default=i)
            reach = max(reach, last)
    return [s for s in segments if s]


def segment_signature(nodes: list[torch.fx.Node], infos: dict[str, NodeInfo],
                      params: dict[str, ParamInfo]) -> str:
    """Structural hash of a run of nodes, blind to parameter names (module docstring)."""
    position = {n.name: i for i, n in enumerate(nodes)}
    external: dict[str, int] = {}

    def ref(value: torch.fx.Node) -> str:
        if value.name in position:
            return f"%{position[value.name]}"
        return f"$in{external.setdefault(value.name, len(external))}"

    parts = []
    for node in nodes:
        info = infos[node.name]
        target: Any = node.target
        if node.op in ("get_attr", "call_module"):
            owned = [(params[p].shape, str(params[p].dtype)) for p in info.params if p in params]
            target = ("<param>", owned) if node.op == "get_attr" else (
                type(node.graph.owning_module.get_submodule(str(node.target))).__name__, owned)
        else:
            target = target_name(target)
        args = torch.fx.node.map_arg((node.args, node.kwargs), ref)
        parts.append(repr((node.op, target, args, info.shape, str(info.dtype))))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _best_run(signatures: list[str], sizes: list[int], weighted: list[bool]
              ) -> tuple[int, int, int] | None:
    """``(start, period, count)`` of the repeated run covering most nodes (step 3); a layer
    must read a parameter (``weighted``), so repeated parameter-free ops are no layers."""
    m = len(signatures)
    best: tuple[int, int, int, int] | None = None  # (covered, -period, -start) ordering
    for period in range(1, m // 2 + 1):
        for start in range(0, m - 2 * period + 1):
            if not any(weighted[start:start + period]):
                continue
            unit = signatures[start:start + period]
            count = 1
            while signatures[start + count * period:start + (count + 1) * period] == unit:
                count += 1
            if count < 2:
                continue
            covered = sum(sizes[start:start + count * period])
            key = (covered, -period, -start, count)
            if best is None or key > best:
                best = key
    if best is None:
        return None
    return -best[2], -best[1], best[3]


def _name(nodes: list[torch.fx.Node], infos: dict[str, NodeInfo], index: int) -> str:
    paths = [infos[n.name].module_path for n in nodes if infos[n.name].module_path]
    common = os.path.commonprefix([p.split(".") for p in paths]) if paths else []
    return ".".join(common) or f"graph-layer-{index}"


def structural_layers(gm: torch.fx.GraphModule, infos: dict[str, NodeInfo],
                      params: dict[str, ParamInfo]) -> dict[int, tuple[str, list[str]]]:
    """Layers found from graph structure: layer → (name, node names); sets ``info.layer``.
    Empty when no segment run repeats."""
    segments = _segments(gm, _stream(gm, params))
    signatures = [segment_signature(s, infos, params) for s in segments]
    weighted = [any(infos[n.name].params for n in s) for s in segments]
    run = _best_run(signatures, [len(s) for s in segments], weighted)
    if run is None:
        return {}
    start, period, count = run
    layers: dict[int, tuple[str, list[str]]] = {}
    for j in range(count):
        nodes = [n for s in segments[start + j * period:start + (j + 1) * period] for n in s]
        layers[j] = (_name(nodes, infos, j), [n.name for n in nodes])
        for node in nodes:
            infos[node.name].layer = j
    return layers
