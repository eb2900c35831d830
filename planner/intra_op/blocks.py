"""Repeated blocks share one set of decision variables.

Capture groups the layers of a model by structural signature
(:class:`passes.node_info.RepeatedBlock`): node ``k`` of every layer of a block plays the same
role and has the same shapes. Here node ``k`` of every layer is represented by node ``k`` of
the block's first layer, so all layers take the same strategies and the problem has the size
of one layer at any depth. The representative's prices are counted once per layer; an edge
between consecutive layers (the residual stream) becomes an edge between two nodes of the
representative layer, priced with the same strategy on both sides — the block's boundary
placement is consistent by construction.
"""

from __future__ import annotations

import logging
from typing import Mapping, Sequence

from fxplan.passes.captured_graph import CapturedGraph
from fxplan.sharding.api import NodeStrategies

__all__ = ["layer_representatives", "representatives"]

log = logging.getLogger(__name__)


def layer_representatives(graph: CapturedGraph) -> dict[str, str]:
    """Node name → the name of node ``k`` of its block's first layer, for every node of the
    second and later layers of a repeated block."""
    rep: dict[str, str] = {}
    for block in graph.blocks:
        first = block.nodes_per_layer[0]
        for layer in block.nodes_per_layer[1:]:
            if len(layer) != len(first):
                log.warning("block %s: layers of %d and %d nodes; not sharing variables",
                            block.signature[:12], len(first), len(layer))
                continue
            rep.update(zip(layer, first))
    return rep


def representatives(ops: Sequence[NodeStrategies], names: Mapping[str, str]) -> list[int]:
    """``rep[i]``: the index in ``ops`` of the node standing for ``ops[i]`` — its first-layer
    counterpart when both share one strategy list (same role), else itself."""
    index = {op.name: i for i, op in enumerate(ops)}
    rep = list(range(len(ops)))
    for i, op in enumerate(ops):
        r = index.get(names.get(op.name, op.name))
        if r is not None and ops[r].strategies is op.strategies:
            rep[i] = r
    return rep
