"""``tp_layout(graph, placements)``: the tensor-parallel layout the cost model prices.

Two ways to read a layout, chosen by the placement map a configuration carries:

- no map, or a map of node outputs alone → the default Megatron layout with those outputs
  overridden (:func:`fxplan.cost_model.megatron_layout.megatron_tp_layout`);
- a map that also names consumer inputs or parameters (the intra-op solver's answer) →
  priced edge by edge (:func:`fxplan.cost_model.priced_layout.build_priced`).

Layouts are memoised per graph (in ``graph.memo``) and placement map.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fxplan.cost_model.megatron_layout import TPLayout, megatron_tp_layout
from fxplan.cost_model.priced_layout import build_priced, is_priced

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["tp_layout"]


def tp_layout(graph: CapturedGraph,
              placements: tuple[tuple[str, str], ...] | None = None) -> TPLayout:
    """The layout of ``graph`` under ``placements`` (the default Megatron layout for ``None``)."""
    key = ("tp_layout", placements or ())
    if key not in graph.memo:
        given = dict(placements or ())
        graph.memo[key] = (build_priced(graph, given) if is_priced(given)
                           else megatron_tp_layout(graph, given))
    return graph.memo[key]
