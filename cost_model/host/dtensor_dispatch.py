"""DTensor's host work per node under tensor parallelism: which nodes run on DTensors, and how
many ATen ops (and view ops) each of them dispatches.

An op whose operand is a ``DTensor`` goes through sharding propagation and unwrap/re-wrap
before its kernel runs (forward and backward alike); a *view* op (``view``, ``t``) costs
DTensor about twice an ordinary op, its propagation taking the shape (calibration line
"DTensor view op extra", ``benchmarks/local_cpu_calibration.py``). The runtime
(:mod:`fxplan.runtime.styles.tp_styles`, ``parallelize_module``) keeps DTensors only where the
layout needs them; in the default (Megatron) layout a node ``v`` runs on DTensors when

    v is column- or row-parallel or vocab-parallel        (the styles wrap its operands)
    or, under sequence parallelism, v is on the residual stream (state ``REPL``: split along
       the sequence; norms, dropouts, residual adds) and reads a DTensor (the output of a
       vocabulary- or row-parallel node or of such a stream node: the model's inputs and
       what is computed from them alone, e.g. the targets' reshape, stay plain)

and never when ``v`` is ``SHARD`` but not a linear: inside a tensor-parallel region (the
attention core, the MLP activation) the styles hand the module local tensors, and after a
head whose output was gathered (the loss) the tensors are plain again. Without sequence
parallelism the residual stream is plain (the row-parallel output leaves as a local tensor).

ATen ops per such node, forward / backward (counted on gpt-tiny's tp=2 sp step with a
dispatch mode that sees the DTensor-level ops; ``o_f``/``o_b`` ordinary ops, ``w_f``/``w_b``
view ops)::

    linear (F.linear, a ≥3-D input)   o_f = 1 (addmm),  w_f = 3 (t, view, view)
                                      o_b = 1,          w_b = 7 (4 t, 3 view)
    linear on a 2-D input             w_f = 1 (t),      w_b = 4 (t)
    dropout (training)                o_f = 4 (empty_like, bernoulli_, div_, mul),  o_b = 1
    a node that runs no kernel (view) w_f = 1,          w_b = 1
    any other node                    o_f = 1,          o_b = 1

so a node's host seconds are::

    t_fwd = o_f · dtensor_op_us + w_f · dtensor_view_op_us
    t_bwd = o_b · dtensor_backward_op_us + w_b · dtensor_view_op_us

(``o_b = 1`` prices a linear's backward as the calibrated backward of one op, which itself
ran both ``mm``\\ s.) A layout priced edge by edge (the intra-op solver's placements,
:mod:`cost_model.parallel.priced_layout`) keeps the rule it was calibrated with: one op forward and
one backward per kernel-running node its placements split, and per vocabulary-parallel one.

**The styles' boundaries.** Beside the ATen ops, ``parallelize_module``'s styles wrap and
unwrap tensors at each parallelized module, and DTensor redistributes some tensors without
communicating (each rank keeps its slice). Per node (counted on gpt-tiny's tp=2 sp step,
``Redistribute``/``from_local``/``to_local`` wrapped with counters; ``f`` a ``from_local`` in
the forward, ``r_f``/``r_b`` a redistribution without communication forward / backward,
``t_b`` the backward of a ``to_local``)::

    vocabulary-parallel lookup      f = 1, r_f = 1 (indices → _MaskPartial); r_b = 1 (the
                                    weight's gradient Replicate → Shard(0))
    row-parallel linear             f = 1 (its local input shard), r_f = 1 if it has a bias
                                    (the bias Replicate → Partial)
    column-parallel linear          t_b = 1 (its output handed on as a local tensor); outside
                                    the layers (the LM head, output gathered for the loss)
                                    also r_b = 1 (the gradient sliced back)
    under sp, an embedding with     f = 1, r_f = 1 (``PositionShard``: the table's rows of the
    constant indices (positions)    rank's sequence shard)

    t_style_fwd = f · dtensor_from_local_us + r_f · dtensor_local_redistribute_us
    t_style_bwd = t_b · dtensor_to_local_backward_us + r_b · dtensor_local_redistribute_us

On gpt-tiny tp=2 sp this counts f = 6, r_f = 6, t_b = 5, r_b = 2 per step; the runtime ran
6, 6, 9, 4 (the zoo GPT's fused QKV attention also unwraps its strided weight and bias, 4
``to_local`` calls, and each MLP's first linear redistributes its output gradient to the
placement it already has, 2: not counted). A layout priced edge by edge counts none.

All these costs are 0 on the GPU specs (the host runs ahead of asynchronous kernels);
``local-cpu`` measures them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fxplan.cost_model.host.host_overhead import runs_kernel
from fxplan.cost_model.parallel.megatron_layout import CONST, SHARD, TPLayout, used_params
from fxplan.passes.node_info import MATMUL_CLASSES

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import HostCosts
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["LINEAR_VIEWS", "DROPOUT_OPS", "dtensor_ops", "dispatch_s", "style_boundaries",
           "boundary_s"]

#: View ops of ``F.linear`` on a DTensor, forward and backward, by input rank (≥ 3 / 2).
LINEAR_VIEWS = {3: (3, 7), 2: (1, 4)}
#: ATen ops of a training-mode dropout on a DTensor, forward and backward.
DROPOUT_OPS = (4, 1)


def dtensor_ops(graph: CapturedGraph, name: str, layout: TPLayout, *, split: bool,
                sp: bool) -> tuple[int, int, int, int]:
    """``(o_f, o_b, w_f, w_b)`` of node ``name`` (module docstring); ``split``: the node's
    work is divided over tp (what a priced layout's rule reads)."""
    info = graph.infos_by_name[name]
    if layout.priced:
        on = runs_kernel(info) and (split or name in layout.vocab)
        return (1, 1, 0, 0) if on else (0, 0, 0, 0)
    linear = name in layout.column or name in layout.row
    stream = sp and name in _stream(graph, layout)
    if not (linear or name in layout.vocab or stream):
        return 0, 0, 0, 0
    if linear and info.op_class in MATMUL_CLASSES:
        source = layout.inputs[name][0] if layout.inputs.get(name) else None
        shape = graph.infos_by_name[source].shape if source is not None else None
        rank = len(shape) if isinstance(shape, tuple) and isinstance(shape[0], int) else 3
        views = LINEAR_VIEWS[3 if rank >= 3 else 2]
        return 1, 1, views[0], views[1]
    if info.op_class == "dropout":
        return DROPOUT_OPS[0], DROPOUT_OPS[1], 0, 0
    if not runs_kernel(info):   # a view of the stream (its backward a view too)
        return 0, 0, 1, 1
    return 1, 1, 0, 0


def _stream(graph: CapturedGraph, layout: TPLayout) -> frozenset[str]:
    """Under sp, the ``REPL`` nodes that read a DTensor: the output of a vocabulary- or
    row-parallel node (a ``Shard(1)`` DTensor) or of another such node, transitively (the
    model's inputs and what is computed from them alone stay plain). Memoised per layout."""
    key = ("dtensor_stream", id(layout))
    if key not in graph.memo:
        out: set[str] = set()
        sources = layout.vocab | layout.row
        for node in graph.gm.graph.nodes:
            if node.op == "placeholder" or layout.state.get(node.name, CONST) in (CONST, SHARD):
                continue
            if any(a in out or a in sources for a in layout.inputs.get(node.name, ())):
                out.add(node.name)
        graph.memo[key] = (layout, frozenset(out))   # the layout kept: its id stays unique
    return graph.memo[key][1]


def dispatch_s(ops: tuple[int, int, int, int], host: HostCosts) -> tuple[float, float]:
    """``(t_fwd, t_bwd)`` host seconds of a node's DTensor ops ``(o_f, o_b, w_f, w_b)``."""
    o_f, o_b, w_f, w_b = ops
    return ((o_f * host.dtensor_op_us + w_f * host.dtensor_view_op_us) * 1e-6,
            (o_b * host.dtensor_backward_op_us + w_b * host.dtensor_view_op_us) * 1e-6)


def style_boundaries(graph: CapturedGraph, name: str, layout: TPLayout, *, sp: bool,
                     in_layer: bool) -> tuple[int, int, int, int]:
    """``(f, r_f, t_b, r_b)`` of node ``name`` (module docstring, "The styles' boundaries");
    ``in_layer``: the node belongs to a layer (not the embeddings or the head)."""
    if layout.priced:
        return 0, 0, 0, 0
    info = graph.infos_by_name[name]
    if name in layout.vocab:
        return 1, 1, 0, 1
    if name in layout.row:
        params = used_params(graph.nodes_by_name[name], graph)
        bias = any(len(graph.params[p].shape) == 1 for p in params)
        return 1, int(bias), 0, 0
    if name in layout.column:
        return 0, 0, 1, 0 if in_layer else 1
    if sp and info.op_class == "embedding":    # constant indices: PositionShard
        return 1, 1, 0, 0
    return 0, 0, 0, 0


def boundary_s(counts: tuple[int, int, int, int], host: HostCosts) -> tuple[float, float]:
    """``(t_style_fwd, t_style_bwd)`` host seconds of a node's boundaries ``(f, r_f, t_b, r_b)``."""
    f, r_f, t_b, r_b = counts
    return ((f * host.dtensor_from_local_us + r_f * host.dtensor_local_redistribute_us)
            * 1e-6,
            (t_b * host.dtensor_to_local_backward_us
             + r_b * host.dtensor_local_redistribute_us) * 1e-6)
