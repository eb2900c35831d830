"""``tp_layout(graph, placements)``: the tensor-parallel layout the cost model prices.

Two ways to read a layout, chosen by the placement map a configuration carries:

- no map, or a map of node outputs alone → the default Megatron layout with those outputs
  tp placements imposed (:func:`fxplan.cost_model.parallel.megatron_layout.megatron_tp_layout`);
- a map that also names consumer inputs or parameters (the intra-op solver's answer) →
  priced edge by edge (:func:`fxplan.cost_model.parallel.priced_layout.build_priced`).

Layouts are memoised per graph (in ``graph.memo``) and placement map.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fxplan.core.placements import PlacementMap
from fxplan.cost_model.parallel.megatron_layout import TPLayout, megatron_tp_layout
from fxplan.cost_model.parallel.priced_layout import build_priced, is_priced

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["tp_layout"]


def tp_layout(graph: CapturedGraph, placements: PlacementMap | None = None) -> TPLayout:
    """The layout of ``graph`` under ``placements`` (the default Megatron layout for ``None``;
    of a map of outputs alone, the tp entry — the last axis — of each output counts)."""
    key = ("tp_layout", placements)
    if key not in graph.memo:
        if placements is not None and is_priced(placements):
            graph.memo[key] = build_priced(graph, placements)
        else:
            given = {} if placements is None else {n: p[-1] for n, p in placements.nodes.items()}
            graph.memo[key] = megatron_tp_layout(graph, given)
    return graph.memo[key]
