"""Context parallelism (CP): every sample's sequence split over ``cp`` ranks, priced.

**Layout** (Megatron-Core, torchtitan: CP ranks come out of the data-parallel dimension,
``cp | dp``). The ``dp`` ranks of a stage, ``d_0 … d_{dp−1}`` (stride ``tp``), form ``dp/cp``
*CP groups* of ``cp`` consecutive ones, ``{d_{g·cp} … d_{g·cp+cp−1}}`` (consecutive, so a
group stays inside a node where it fits). A CP group processes the same samples, each rank a
``1/cp`` share of every sequence; the global batch is split over the ``dp/cp`` groups, so
``batch = (dp/cp)·b·m``. Parameters, ZeRO shards and the gradient reduction stay over all
``dp`` ranks (a CP rank's gradient is a partial sum over its tokens, as a dp rank's is over
its samples). The sequence is cut into ``2·cp`` chunks and rank ``r`` holds chunks ``r`` and
``2·cp−1−r`` (the load-balanced causal split), so ``2·cp | s`` and every rank does the same
causal attention work.

**Compute and activations** per rank and microbatch are ``1/cp`` of the ``cp = 1`` segment
(:func:`cp_segment`): every op but attention is per token; attention's queries are the
rank's ``s/cp`` tokens against all ``s`` keys under the causal mask, and the load-balanced
split gives each rank ``1/cp`` of the causal square's blocks. So, with ``f, b, r`` the
``cp = 1`` forward, backward and recompute seconds, ``a`` and ``w`` its saved and working
bytes, ``o`` its output (pipeline message) and ``S_k`` the tp collectives' sizes::

    f/cp, b/cp, r/cp,  a/cp + [recompute ≠ full]·(cp−1)/cp·KV,  w/cp + KV,  o/cp,  S_k/cp

the parameters unchanged. ``KV`` is the layer's keys and values over the whole sequence for
the rank's heads (``2·b·s·h_kv·d·bytes/tp``, :func:`cp_layers` reads them off the captured
attention core): the gathered buffer is live while the layer's attention runs (working
bytes), and the attention kernel keeps it for the backward (saved bytes, the rank's own
``1/cp`` of it already counted in ``a/cp``) unless full recompute rebuilds it. The same
division by ``cp`` applies to the matrix-product FLOPs, since the step counts ``dp·m``
pipeline-microbatches and ``m`` is ``cp`` times the ``cp = 1`` count. The per-op efficiency
at the ``s/cp``-token shapes is taken to be that of the ``s``-token ones (true where CP is
used: ``s/cp`` is thousands of tokens).

**K/V exchange**, per layer and microbatch, ``KV`` bytes for the rank's tp shard, over the
CP group of ``n = cp`` ranks on ``m`` nodes (:mod:`cost_model.comm.collectives`, α-β with the
intra-node vs network bandwidths):

- *all-gather* (what the runtime runs, :data:`~fxplan.core.config_fields.CP_ATTENTION`): forward
  ``t_AG(KV)``, backward ``t_RS(KV)`` (the reduce-scatter of ``dK, dV``), both on the
  critical path, one collective each for K and V together (the runtime stacks them; counted
  per layer in ``tests/runtime/test_context_parallel.py``); full recompute repeats the
  forward's all-gather in the backward (selective recompute keeps the gathered K/V: its
  re-run all-gather is served from the checkpoint's cache)::

      forward = t_AG(KV)        backward = t_RS(KV) + [full]·t_AG(KV)

- *ring attention*: ``cp − 1`` passes of a ``KV/cp`` block to the next rank of the ring
  (``t_p`` = the slowest neighbour pair's send/recv), each overlapped with the attention on
  the block in hand (``A/cp`` of the rank's attention seconds ``A``), so the exposed time is
  bounded below by the transfer::

      forward = (cp−1)·max(0, t_p(KV/cp) − A_f/cp)
      backward = (cp−1)·max(0, t_p(2·KV/cp) − A_b/cp) + [full]·forward

  (the backward passes ``K, V`` and the ``dK, dV`` partial sums).

:func:`kv_exchange` prices both; the plan is priced with the runtime's all-gather, and
:attr:`KVExchange.cheaper` names the cheaper (for the report: at long sequences the ring
hides its transfers under the attention, the all-gather does not).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fxplan.core.config_error import CostModelError
from fxplan.core.config_fields import CP_ATTENTION
from fxplan.cost_model.memory.activations import ActivationBytes, attention_core, tensor_bytes
from fxplan.cost_model.comm.collectives import collective_time_s
from fxplan.cost_model.step.layer_costs import SegmentCost, attention_seconds, graph_segments
from fxplan.cost_model.parallel.tp_layout import tp_layout

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster, DeviceGroup
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["CPLayer", "KVExchange", "cp_layers", "cp_group", "check_cp", "cp_segment",
           "kv_exchange", "kv_bytes", "layer_exchange"]


@dataclass(frozen=True)
class CPLayer:
    """One attention layer's K and V, at the capture's batch ``b₀``, all heads (bytes)."""

    kv_bytes: float


@dataclass(frozen=True)
class KVExchange:
    """``(forward, backward)`` seconds per microbatch of both K/V exchanges (module
    docstring); :attr:`priced` is the runtime's."""

    allgather: tuple[float, float]
    ring: tuple[float, float]

    @property
    def priced(self) -> tuple[float, float]:
        """The exchange the runtime runs (:data:`~fxplan.core.config_fields.CP_ATTENTION`)."""
        return self.allgather if CP_ATTENTION == "allgather" else self.ring

    @property
    def cheaper(self) -> str:
        """``"allgather"`` or ``"ring"``, whichever exposes fewer seconds (ties: all-gather)."""
        return "ring" if sum(self.ring) < sum(self.allgather) else "allgather"


def _base(graph: CapturedGraph, name: object, inputs: dict) -> str | None:
    """The node owning the storage of ``name``: views of the whole tensor followed back, and
    a copy of an expansion (grouped-query attention's ``repeat_kv``: ``expand`` then
    ``reshape``) followed to the unexpanded ``K``/``V``, which is what the CP group exchanges.
    A view that is a piece of a larger tensor (``K`` as a ``split`` of a fused QKV
    projection's output) is its own storage: the runtime exchanges K and V, not Q."""
    infos = graph.infos_by_name
    nodes = graph.nodes_by_name
    name = getattr(name, "name", None)
    while name in infos and inputs.get(name):
        source = inputs[name][0]
        if "expand" in str(getattr(nodes.get(source), "target", "")) or (
                infos[name].op_class == "view" and source in infos
                and tensor_bytes(infos[source]) <= tensor_bytes(infos[name])):
            name = source
        else:
            break
    return name if name in infos else None


def _kv_nodes(graph: CapturedGraph, core: frozenset[str], names: tuple[str, ...]) -> set[str]:
    """The storage nodes of ``K`` and ``V``: a fused node's 2nd and 3rd operands, or the
    second operands of the core's first (``QKᵀ``) and last (``PV``) products."""
    infos = graph.infos_by_name
    nodes = graph.nodes_by_name
    inputs = tp_layout(graph).inputs
    products = [n for n in names if n in core and infos[n].op_class in ("matmul", "attention")]
    if not products:
        return set()
    first, last = nodes[products[0]], nodes[products[-1]]
    if infos[first.name].op_class == "attention":
        operands = list(first.args[1:3])
    else:
        operands = [first.args[1] if len(first.args) > 1 else None,
                    last.args[1] if len(last.args) > 1 else None]
    return {b for b in (_base(graph, o, inputs) for o in operands) if b is not None}


def cp_layers(graph: CapturedGraph) -> dict[str, CPLayer]:
    """Profile key → :class:`CPLayer` for every layer with an attention core (memoised)."""
    if "cp_layers" in graph.memo:
        return graph.memo["cp_layers"]
    found: dict[str, CPLayer] = {}
    layout = tp_layout(graph)
    for key, names in graph_segments(graph).layers:
        if key in found:
            continue
        core = attention_core(graph, names, layout)
        kv = _kv_nodes(graph, core, names) if core else set()
        if kv:
            found[key] = CPLayer(float(sum(tensor_bytes(graph.infos_by_name[n]) for n in kv)))
    graph.memo["cp_layers"] = found
    return found


def check_cp(graph: CapturedGraph, cp: int) -> None:
    """``cp = 1``, or the graph has a token sequence that ``2·cp`` chunks divide."""
    if cp == 1:
        return
    seq = graph_segments(graph).seq
    if seq is None:
        raise CostModelError(f"cp={cp} splits the sequence, and the graph has no token "
                             "sequence (a 2-D integer input)")
    if seq % (2 * cp):
        raise CostModelError(f"cp={cp} cuts seq={seq} into 2·cp = {2 * cp} chunks (the "
                             f"load-balanced causal split): {seq} mod {2 * cp} = "
                             f"{seq % (2 * cp)}")


def cp_group(dp_group: tuple[int, ...], cp: int) -> tuple[int, ...]:
    """The CP group of the first rank of ``dp_group``: its ``cp`` first ranks."""
    return tuple(dp_group[:cp])


def kv_bytes(layer: CPLayer | None, *, scale: float, tp: int) -> float:
    """``KV``: the rank's tp share of one microbatch's keys and values, ``scale = b/b₀``."""
    return 0.0 if layer is None else layer.kv_bytes * scale / tp


def cp_segment(seg: SegmentCost, cp: int, kv: float, recompute: str) -> SegmentCost:
    """``seg`` (priced at ``cp = 1``) as one of ``cp`` ranks runs it, with ``kv`` the layer's
    gathered K/V bytes (0 for a segment without attention; module docstring)."""
    if cp == 1:
        return seg
    held = kv * (cp - 1) / cp if recompute != "full" else 0.0
    acts = ActivationBytes(seg.activations.saved / cp + held, seg.activations.working / cp + kv,
                           seg.activations.weights_read)
    return dataclasses.replace(
        seg, forward_s=seg.forward_s / cp, backward_s=seg.backward_s / cp,
        recompute_s=seg.recompute_s / cp,
        tp_forward=tuple((k, n / cp) for k, n in seg.tp_forward),
        tp_backward=tuple((k, n / cp) for k, n in seg.tp_backward),
        tp_forward_gemm_s=tuple(g / cp for g in seg.tp_forward_gemm_s),
        tp_backward_gemm_s=tuple(g / cp for g in seg.tp_backward_gemm_s),
        tp_sm_forward=tuple((k, n / cp) for k, n in seg.tp_sm_forward),
        tp_sm_backward=tuple((k, n / cp) for k, n in seg.tp_sm_backward),
        activations=acts, output_bytes=seg.output_bytes / cp,
        matmul_flops=seg.matmul_flops / cp, recompute_flops=seg.recompute_flops / cp)


def _ring_pass_s(nbytes: float, group: tuple[int, ...], cluster: Cluster) -> float:
    """The slowest neighbour send/recv of ``nbytes`` around the ring ``group``."""
    n = len(group)
    return max(collective_time_s("send_recv", nbytes, (group[i], group[(i + 1) % n]), cluster)
               for i in range(n))


def kv_exchange(kv: float, *, group: tuple[int, ...], cluster: Cluster,
                attention_s: tuple[float, float], recompute_full: bool) -> KVExchange:
    """Both exchanges of ``kv`` bytes over the CP ``group``; ``attention_s`` the rank's
    attention ``(A_f, A_b)`` seconds at its ``1/cp`` share (module docstring)."""
    cp = len(group)
    if cp <= 1 or kv <= 0:
        return KVExchange((0.0, 0.0), (0.0, 0.0))
    gather = collective_time_s("all_gather", kv, group, cluster)
    scatter = collective_time_s("reduce_scatter", kv, group, cluster)
    allgather = (gather, scatter + (gather if recompute_full else 0.0))
    a_f, a_b = attention_s
    ring_f = (cp - 1) * max(0.0, _ring_pass_s(kv / cp, group, cluster) - a_f / cp)
    ring_b = (cp - 1) * max(0.0, _ring_pass_s(2 * kv / cp, group, cluster) - a_b / cp)
    return KVExchange(allgather, (ring_f, ring_b + (ring_f if recompute_full else 0.0)))


def layer_exchange(graph: CapturedGraph, key: str, *, group: tuple[int, ...], tp: int,
                   sequence_parallel: bool, microbatch: int, recompute: str,
                   device: DeviceGroup, cluster: Cluster) -> KVExchange:
    """:func:`kv_exchange` of layer ``key`` for one microbatch over the CP ``group``
    (no exchange for a layer without attention)."""
    layer = cp_layers(graph).get(key)
    cp = len(group)
    if layer is None or cp <= 1:
        return KVExchange((0.0, 0.0), (0.0, 0.0))
    scale = microbatch / graph_segments(graph).batch
    a_f, a_b = attention_seconds(graph, key, tp=tp, sequence_parallel=sequence_parallel,
                                 microbatch=microbatch, device=device)
    return kv_exchange(kv_bytes(layer, scale=scale, tp=tp), group=group, cluster=cluster,
                       attention_s=(a_f / cp, a_b / cp), recompute_full=recompute == "full")
