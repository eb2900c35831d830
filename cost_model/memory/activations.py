"""Activation memory of a graph segment (a layer, or the nodes before/after the layers).

Measured, not modelled: capture records, per node, the bytes autograd saves for backward
(``NodeInfo.saved_bytes``, :mod:`passes.analyses.saved_activations`). Per tp rank, a node's
saved bytes are divided by ``t`` when the tensors it saves are split
(:mod:`cost_model.parallel.megatron_layout`: the node reads a ``SHARD`` activation, or sequence
parallelism is on). For one microbatch of a segment ``L``:

- ``none``:       ``A = Σ_{n∈L} saved(n) / f(n)``
- ``selective``:  the attention core ``K ⊂ L`` is recomputed in the backward, so its saved
  tensors are replaced by its inputs:
  ``A = Σ_{n∈L∖K} saved(n)/f(n) + Σ_{x∈in(K)} bytes(x)/f(x) + shared(K)``, where
  ``shared(K)`` are the bytes charged to ``K`` that a node outside ``K`` saves too (the
  storage outlives the recompute: a Llama's attention output, a view of which its
  out-projection keeps as its input)
- ``full``:       only the segment's inputs are kept: ``A = Σ_{x∈in(L)} bytes(x)/f(x)``

``in(S)`` are the storages the set ``S`` reads from outside (views followed back to the node
that made the storage; parameters and buffers excluded). The attention core is every node
between two parameter-free matrix products (``QKᵀ`` … ``·V``: descendants of one that are
ancestors of another, both included), or a fused attention node.

While a recomputed part runs again in the backward its activations exist once more, for one
microbatch: the *working* bytes, ``Σ_{n∈K} saved(n)/f(n)`` (selective) or the segment's
``none`` total (full).

For a GPT layer in 16-bit precision (``s`` sequence, ``b`` microbatch, ``h`` hidden, ``a``
heads) this gives Korthikanti et al. (2022) exactly, plus the layer norms' statistics
(``O(s·b)``, which the paper neglects): ``sbh(34 + 5as/h)``; with tp ``sbh(10 + 24/t +
5as/(ht))``; with tp and sequence parallelism ``sbh(34/t + 5as/(ht))``; selective drops the
``5as/(ht)`` term; full keeps ``2sbh`` (``2sbh/t`` with sequence parallelism).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import torch

from fxplan.cost_model.parallel.megatron_layout import SHARD, TPLayout

if TYPE_CHECKING:  # pragma: no cover
    import torch.fx

    from fxplan.passes.captured_graph import CapturedGraph
    from fxplan.passes.node_info import NodeInfo

__all__ = ["ActivationBytes", "attention_core", "itemsize", "segment_activations", "tensor_bytes"]


@dataclass(frozen=True)
class ActivationBytes:
    """Per tp rank, per microbatch (at the capture's batch): ``saved`` kept until the
    backward, ``working`` alive while the recomputed part runs again; ``weights_read``:
    whether a split backward's weight pass reads the recomputed part's saved tensors again
    (a whole block's, whose linear layers hold the weights; not the attention core's of
    selective recompute, which holds none: the weight pass starts from the inputs of the
    weights' ops, which the input-gradient pass left behind)."""

    saved: float
    working: float
    weights_read: bool = True

    @property
    def kept(self) -> float:
        """``max(working − saved, 0)`` where :attr:`weights_read`, else 0: what a recomputed
        segment holds beyond ``saved`` while its recompute is kept — from a split backward's
        input-gradient pass to its weight-gradient pass
        (:mod:`fxplan.passes.rewrite.split_recompute`): its activations again, which include
        the checkpointed inputs (the recompute reads the same storage); 0 for a segment not
        recomputed, and for selective recompute, whose attention core is recomputed in the
        input-gradient pass and freed there."""
        return max(self.working - self.saved, 0.0) if self.weights_read else 0.0

    def scaled(self, factor: float, extra_working: float = 0.0) -> "ActivationBytes":
        """Every byte times ``factor`` (a microbatch of ``factor`` captured batches), plus
        ``extra_working`` alive during the recompute."""
        return ActivationBytes(self.saved * factor, self.working * factor + extra_working,
                               self.weights_read)


def tensor_bytes(info: NodeInfo) -> int:
    """Bytes of a node's value from its shape and dtype (0 for non-tensors)."""
    shape, dtype = info.shape, info.dtype
    if shape is None or dtype is None:
        return 0
    if isinstance(dtype, tuple):
        return sum(math.prod(s) * itemsize(d) for s, d in zip(shape, dtype))
    return math.prod(shape) * itemsize(dtype)


def itemsize(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype``."""
    return torch.empty((), dtype=dtype, device="meta").element_size()


def _is_free_product(node: torch.fx.Node, info: NodeInfo, layout: TPLayout) -> bool:
    """A matrix product of two activations (no parameter), or a fused attention node."""
    if info.op_class == "attention":
        return True
    return (info.op_class == "matmul" and not info.params
            and len(layout.inputs.get(node.name, ())) >= 2)


def attention_core(graph: CapturedGraph, names: Sequence[str],
                   layout: TPLayout) -> frozenset[str]:
    """Nodes of ``names`` between parameter-free matrix products (module docstring)."""
    nodes = graph.nodes_by_name
    members = set(names)
    products = {n for n in names if _is_free_product(nodes[n], graph.info(nodes[n]), layout)}
    fused = {n for n in products if graph.info(nodes[n]).op_class == "attention"}
    after: set[str] = set()                      # strict descendants of a product
    for n in names:
        if any(i in products or i in after for i in layout.inputs.get(n, ()) if i in members):
            after.add(n)
    before: set[str] = set()                     # strict ancestors of a product
    for n in reversed(names):
        users = (u.name for u in nodes[n].users if u.name in members)
        if any(u in products or u in before for u in users):
            before.add(n)
    return frozenset(fused | (products & (after | before)) | (after & before))


def _base(name: str, graph: CapturedGraph, nodes: dict[str, torch.fx.Node],
          layout: TPLayout) -> str:
    """Follow views back to the node that owns the storage."""
    while graph.info(nodes[name]).op_class == "view" and layout.inputs.get(name):
        name = layout.inputs[name][0]
    return name


def _inputs_bytes(graph: CapturedGraph, group: set[str], layout: TPLayout,
                  divisor: Callable[..., int]) -> float:
    nodes = graph.nodes_by_name
    bases = {_base(i, graph, nodes, layout) for n in group for i in layout.inputs.get(n, ())
             if i not in group}
    bases -= group
    return sum(tensor_bytes(graph.info(nodes[b])) / divisor(b, output=True) for b in bases)


def segment_activations(graph: CapturedGraph, names: Sequence[str], layout: TPLayout, *,
                        tp: int, sequence_parallel: bool, recompute: str,
                        fused: Any = None) -> ActivationBytes:
    """:class:`ActivationBytes` of the segment ``names`` (graph order) under ``recompute``.

    ``fused``: a :class:`cost_model.compute.attention_kernel.FusedAttention` (``nodes``, ``output``,
    ``saved_bytes``, ``out_kept_by``, ``out_bytes``; not imported here, that module builds on
    this one): the attention core runs as one fused kernel, which saves ``fused.saved_bytes``
    (``q, k, v, o`` and its statistics, no ``s×s`` tensor) in place of what the core's nodes
    save; where the op ``out_kept_by`` keeps ``o`` as its input, once for both."""
    nodes = graph.nodes_by_name

    def divisor(name: str, output: bool = False) -> int:
        """``t`` when the saved tensors of ``name`` (its output, if ``output``) are split."""
        if output:
            split = layout.state.get(name) == SHARD
        else:
            split = name in layout.saves_sharded
        return tp if split or sequence_parallel else 1

    def saved(group: Iterable[str]) -> float:
        group = list(group)
        if fused is None or not fused.nodes.intersection(group):
            return sum(graph.info(nodes[n]).saved_bytes / divisor(n) for n in group)
        outside = sum(graph.info(nodes[n]).saved_bytes / divisor(n) for n in group
                      if n not in fused.nodes)
        once = (fused.out_bytes / divisor(fused.out_kept_by)
                if fused.out_kept_by in group else 0.0)   # the kernel's o is that op's input
        return outside + fused.saved_bytes / divisor(fused.output) - once

    everything = saved(names)
    if recompute == "none":
        return ActivationBytes(everything, 0.0)
    if recompute == "full":
        return ActivationBytes(_inputs_bytes(graph, set(names), layout, divisor), everything)
    if recompute != "selective":
        raise ValueError(f"unknown recompute policy {recompute!r}")
    core = attention_core(graph, names, layout)
    if not core:
        return ActivationBytes(everything, 0.0)
    kept = saved(n for n in names if n not in core) + _still_saved(graph, core, divisor)
    return ActivationBytes(kept + _inputs_bytes(graph, set(core), layout, divisor), saved(core),
                           weights_read=False)


def _still_saved(graph: CapturedGraph, group: frozenset[str],
                 divisor: Callable[..., int]) -> float:
    """Bytes charged to nodes of ``group`` whose storage a node outside it saves too
    (``NodeInfo.saved_shared``): recomputing ``group`` does not free them."""
    nodes = graph.nodes_by_name
    return sum(nbytes / divisor(n) for n in group
               for nbytes, later in graph.info(nodes[n]).saved_shared
               if any(m not in group for m in later))
