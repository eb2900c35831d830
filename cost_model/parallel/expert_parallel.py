"""Expert parallelism (EP): a mixture of experts' experts split over ``ep`` ranks, priced.

**Which layers.** A layer is a mixture of experts when it holds *expert parameters*: the 3-D
parameters ``[E, ·, ·]`` of batched expert weights (:mod:`examples.models.moe`'s
``w1 [E, h, f]``; ``transformers`` ≥ 5's Mixtral/Qwen2-MoE ``gate_up_proj [E, 2f, h]``), all
with the same ``E``. Experts kept as a ``ModuleList`` of 2-D linears are not recognised (the
layer is then priced as a dense one). The *dispatch* is the token operand of the layer's first
expert matrix product (``[E, C, h]`` with capacity, or ``[k·T, h]`` routed rows without) and
the *combine* the output of its last one, both as captured (batch ``b₀``), scaled to the
microbatch ``b`` by ``b / b₀`` as every other quantity of :mod:`cost_model.step.layer_costs`.

**Layout** (Megatron-Core, DeepSpeed-MoE: EP ranks come out of the data-parallel dimension,
``ep | dp``). The ``dp`` ranks of a stage, ``d_0 … d_{dp−1}`` (stride ``tp``), form
``dp/ep`` *EP groups* of ``ep`` consecutive ones, ``{d_{g·ep} … d_{g·ep+ep−1}}`` (consecutive,
so a group stays inside a node where it fits), and ``ep`` *expert-data-parallel* groups
``{d_j, d_{j+ep}, …}`` of ``dp/ep`` ranks holding the same experts. ``E mod ep = 0``; each rank
holds ``E/ep`` experts.

**Routed rows** (``ρ``, :attr:`MoELayer.routed`). Under ``ep > 1`` the runtime
(:mod:`fxplan.runtime.styles.expert_parallel`) sends and computes only the rows routed, not the
``E·C`` slots of the capacity buffer the captured graph holds (``C = ⌈k·c·T/E⌉``). The model
assumes **balanced routing**: every expert gets ``k·T/E`` of a layer's ``T`` tokens' ``k·T``
assignments, capped at its capacity, so the rows routed are ``min(E·C, k·T)`` and

    ρ = min(1, k·T / R)

with ``R`` the captured dispatch's rows (``E·C``; ``k·T`` for routed experts without capacity,
``ρ = 1``), ``k`` and ``T`` read off the layer's top-``k`` node. Skewed routing sends more
rows to some ranks than this prices (the runtime's compact buffer is as wide as its busiest
local expert); ``ep = 1`` runs the layer's own forward, the full capacity buffer, and is
priced from the capture unchanged.

**Communication** per MoE layer and microbatch. Each rank's routed rows (``ρ·S_d`` bytes,
``S_d`` the captured dispatch) go out by one all-to-all over its EP group (the rows of expert
``e`` to the rank holding ``e``; ``(ep−1)/ep`` of them leave the rank), after a small
all-to-all of the ``E`` per-expert counts (8 bytes each: the split sizes), and the expert
outputs come back by a second one of ``ρ·S_c`` bytes (combine): 3 all-to-alls in the forward,
2 in the backward (the gradients of combine and of dispatch), the forward's again when full
recompute re-runs it. Under tensor parallelism (:mod:`fxplan.runtime.styles.expert_tp`; sequence
parallelism off) the tp ranks hold the same tokens and each dispatches ``1/tp`` of the routed
rows, so the sizes are ``ρ·S/tp``, and the outputs are all-gathered over tp (``ρ·S_c`` bytes,
forward) as are the row gradients (``ρ·S_d``, backward). An all-to-all of ``S`` bytes over
``n`` ranks on ``m`` nodes, at most ``k`` per node, is :mod:`cost_model.comm.collectives`' direct
algorithm::

    t_a2a(S) = α + (n − m)·h_i + (m − 1)·h_e + max((k−1)/n · S/B_i,  (n−k)/n · S/B_r)

every rank sends ``S/n`` to each peer at once, so the transfer ends when the slowest link a
rank crosses has carried its share: NVLink (``B_i``) for the ``k−1`` peers in its node, its
share of the node's NICs (``B_r``) for the ``n−k`` outside. Inside one node only the first term
is left; across nodes on 25 Gb/s Ethernet the second dominates by two orders of magnitude.
The all-to-alls sit on the critical path (the experts wait for their tokens), priced with the
tensor-parallel collectives.

**Compute** per rank (:func:`expert_work`): ``E/ep`` experts over the rows the EP group routes
to them, ``ρ·k·T``-sized in balance: the *expert nodes* (the expert products and the
operations between them, and the output bias) are priced on ``ρ·scale/tp`` of their captured
work in place of the layout's share (the tp ranks split the rows; the experts are whole on
each), and their saved activations likewise. The routing, dispatch and combine operations stay
as captured.

**Memory and gradients.** A rank holds ``Ψ_e/ep`` of a stage's ``Ψ_e`` expert parameters
and all of its ``Ψ − Ψ_e`` others; ZeRO shards the others over ``dp`` and the experts over
their expert-data-parallel group of ``dp/ep``::

    states = ZeRO(Ψ − Ψ_e, dp, z) + ZeRO(Ψ_e/ep, dp/ep, z)

(:func:`model_states`), and the experts' gradients (``k_g·Ψ_e/ep`` bytes) are reduced over
the ``dp/ep`` ranks instead of ``dp``. With ``z = 3`` EP saves no memory (both forms hold
``Ψ_e/dp``); its gain is the experts' gradient traffic and ZeRO-3's gathers.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

import numpy as np

from fxplan.core.config_error import CostModelError
from fxplan.cost_model.comm.collectives import collective_time_s
from fxplan.cost_model.compute.op_time import node_time_s
from fxplan.cost_model.step.layer_costs import SegmentCost, graph_segments, work_divisor
from fxplan.cost_model.parallel.megatron_layout import used_params
from fxplan.cost_model.parallel.tp_layout import tp_layout
from fxplan.cost_model.memory.breakdown import ModelStates, OptimizerSpec, ADAM_MIXED, model_state_bytes
from fxplan.passes.node_info import MATMUL_CLASSES

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster, DeviceGroup
    from fxplan.core.placements import PlacementMap
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["MoELayer", "ExpertWork", "moe_layers", "num_experts", "ep_groups",
           "alltoall_seconds", "expert_work", "ep_segment", "model_states", "check_ep"]


@dataclass(frozen=True)
class MoELayer:
    """One mixture-of-experts layer profile, at the capture's batch ``b₀`` (module docstring):
    ``routed`` is ``ρ``, the expected routed rows over the captured ones, and
    ``expert_nodes`` the nodes whose work is per routed row (the expert products and what lies
    between them)."""

    experts: int
    expert_params: frozenset[str]
    dispatch_bytes: float
    combine_bytes: float
    routed: float = 1.0
    expert_nodes: tuple[str, ...] = ()
    #: canonical name → elements of each expert parameter, whole (all ``E`` experts)
    expert_numel: tuple[tuple[str, float], ...] = ()


def _expert_params(graph: CapturedGraph, names: tuple[str, ...]) -> dict[str, int]:
    """Expert parameters (3-D) the segment's nodes use, canonical name → leading dim."""
    out: dict[str, int] = {}
    for name in names:
        for param in used_params(graph.nodes_by_name[name], graph):
            info = graph.params.get(param)
            if info is not None and len(info.shape) == 3:
                out[info.tied_to or param] = int(info.shape[0])
    return out


def _nbytes(node: object) -> float:
    info = getattr(node, "meta", {}).get("fxplan")
    if info is None or not isinstance(info.shape, tuple) or not all(
            isinstance(d, int) for d in info.shape):
        return 0.0
    return float(math.prod(info.shape)) * _itemsize(info.dtype)


def _itemsize(dtype: object) -> int:
    import torch

    return torch.empty((), dtype=dtype).element_size() if isinstance(dtype, torch.dtype) else 4


def _expert_matmuls(graph: CapturedGraph, names: tuple[str, ...], experts: int) -> list:
    """The segment's matrix products over the experts: a 3-D output ``[E, ·, ·]`` (batched
    experts) or a grouped product (``grouped_mm``), in graph order."""
    nodes = graph.nodes_by_name
    out = []
    for name in names:
        node = nodes[name]
        info = graph.info(node)
        if info.op_class not in MATMUL_CLASSES:
            continue
        grouped = "grouped_mm" in str(node.target)
        batched = isinstance(info.shape, tuple) and len(info.shape) == 3 and info.shape[0] == experts
        if grouped or batched:
            out.append(node)
    return out


def moe_layers(graph: CapturedGraph) -> dict[str, MoELayer]:
    """Profile key → :class:`MoELayer` for the graph's mixture-of-experts layers (memoised)."""
    if "moe_layers" in graph.memo:
        return graph.memo["moe_layers"]
    found: dict[str, MoELayer] = {}
    for key, names in graph_segments(graph).layers:
        if key in found:
            continue
        params = _expert_params(graph, names)
        counts = set(params.values())
        if len(counts) != 1:
            continue
        experts = counts.pop()
        matmuls = _expert_matmuls(graph, names, experts)
        if not matmuls:
            continue
        first, last = matmuls[0], matmuls[-1]
        token_side = first.args[0] if first.args else None
        found[key] = MoELayer(experts, frozenset(params), _nbytes(token_side), _nbytes(last),
                              _routed_share(graph, names, token_side, experts),
                              _expert_nodes(graph, names, first.name, last.name, params),
                              tuple((p, float(graph.params[p].numel)) for p in sorted(params)
                                    if p in graph.params))
    graph.memo["moe_layers"] = found
    return found


def _routed_share(graph: CapturedGraph, names: tuple[str, ...], token_side: object,
                  experts: int) -> float:
    """``ρ = min(1, k·T / R)``: the expected routed rows ``k·T`` (``k`` and ``T`` read off the
    segment's top-``k`` node over the router's ``[T, E]``) over the captured dispatch's rows
    ``R`` (``E·C`` with capacity, ``k·T`` without: ``ρ = 1``); 1 when no top-``k`` is found."""
    info = getattr(token_side, "meta", {}).get("fxplan")
    shape = getattr(info, "shape", None)
    if not isinstance(shape, tuple) or len(shape) < 2:
        return 1.0
    rows = math.prod(shape[:-1])
    nodes = graph.nodes_by_name
    for name in names:
        node = nodes[name]
        if "topk" not in str(node.target) or not node.args:
            continue
        k = node.args[1] if len(node.args) > 1 else node.kwargs.get("k")
        scores = graph.info(node.args[0]) if hasattr(node.args[0], "meta") else None
        score_shape = getattr(scores, "shape", None)
        if isinstance(k, int) and isinstance(score_shape, tuple) and score_shape and \
                score_shape[-1] == experts and rows:
            return min(1.0, k * math.prod(score_shape[:-1]) / rows)
    return 1.0


def _expert_nodes(graph: CapturedGraph, names: tuple[str, ...], first: str, last: str,
                  params: Mapping[str, int]) -> tuple[str, ...]:
    """The operations from the first expert product to the last (graph order), and those
    after it that use an expert parameter (the output bias): the work done per dispatched
    row."""
    nodes = graph.nodes_by_name
    start, end = names.index(first), names.index(last)
    out = [n for n in names[start:end + 1] if nodes[n].op != "get_attr"]
    for name in names[end + 1:]:
        if nodes[name].op == "get_attr":
            continue
        used = used_params(graph.nodes_by_name[name], graph)
        if any((graph.params[p].tied_to or p) in params for p in used if p in graph.params):
            out.append(name)
    return tuple(out)


def num_experts(graph: CapturedGraph) -> int | None:
    """``E`` of the graph's MoE layers (the smallest, should they differ), ``None`` without."""
    layers = moe_layers(graph)
    return min(layer.experts for layer in layers.values()) if layers else None


def check_ep(graph: CapturedGraph, ep: int) -> None:
    """``ep = 1``, or the graph has mixture-of-experts layers whose ``E`` it divides."""
    if ep == 1:
        return
    experts = num_experts(graph)
    if experts is None:
        raise CostModelError(f"ep={ep} needs a mixture of experts, and the graph has no "
                             "expert parameters (3-D [E, ·, ·] batched expert weights)")
    if experts % ep:
        raise CostModelError(f"ep={ep} does not divide the {experts} experts ({experts} mod "
                             f"{ep} = {experts % ep}): each rank holds E/ep experts")


def ep_groups(dp_group: tuple[int, ...], ep: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(EP group, expert-data-parallel group)`` of the first rank of ``dp_group``."""
    return tuple(dp_group[:ep]), tuple(dp_group[::ep])


def alltoall_seconds(layer: MoELayer, *, scale: float, tp: int, ep_group: tuple[int, ...],
                     cluster: Cluster, recompute_full: bool,
                     tp_group: tuple[int, ...] = ()) -> tuple[float, float]:
    """``(forward, backward)`` seconds of one microbatch's exchanges in ``layer`` (module
    docstring, "Communication"): the per-expert counts (``8·E`` bytes) and the dispatch and
    combine all-to-alls of the routed rows (``ρ·scale`` of the captured sizes, ``1/tp`` per tp
    rank) in the forward, the two row all-to-alls in the backward; with ``tp > 1`` the
    all-gather over ``tp_group`` of the outputs (forward) and of the row gradients (backward).
    The backward re-runs the forward's under full recompute."""
    if len(ep_group) <= 1:
        return 0.0, 0.0
    rows = layer.routed * scale
    dispatch = collective_time_s("all_to_all", layer.dispatch_bytes * rows / tp, ep_group, cluster)
    combine = collective_time_s("all_to_all", layer.combine_bytes * rows / tp, ep_group, cluster)
    counts = collective_time_s("all_to_all", 8.0 * layer.experts, ep_group, cluster)
    forward, backward = counts + dispatch + combine, dispatch + combine
    if tp > 1 and len(tp_group) > 1:
        forward += collective_time_s("all_gather", layer.combine_bytes * rows, tp_group, cluster)
        backward += collective_time_s("all_gather", layer.dispatch_bytes * rows, tp_group,
                                      cluster)
    return forward, backward + (forward if recompute_full else 0.0)


@dataclass(frozen=True)
class ExpertWork:
    """How the segment prices the expert nodes' work (``priced_*``) and what the runtime does
    (``runtime_*``): forward and backward seconds, saved activation bytes, per microbatch."""

    priced_forward: float
    priced_backward: float
    priced_saved: float
    runtime_forward: float
    runtime_backward: float
    runtime_saved: float


def expert_work(graph: CapturedGraph, layer: MoELayer, *, tp: int, sequence_parallel: bool,
                microbatch: int, device: DeviceGroup,
                placements: PlacementMap | None = None) -> ExpertWork:
    """The expert nodes priced as :func:`cost_model.step.layer_costs.segment_cost` prices them
    (node ``n`` on ``1/d_n`` of the captured work times ``scale = b/b₀``, ``d_n`` its layout's split) and as
    the runtime runs them under ``ep > 1``: the ``ρ·scale`` routed rows, ``1/tp`` of them per
    tp rank (:mod:`fxplan.runtime.styles.expert_tp`), whatever the layout says (module docstring,
    "Compute")."""
    scale = microbatch / graph_segments(graph).batch
    sp = sequence_parallel and tp > 1
    layout = tp_layout(graph, placements)
    out = [0.0] * 6
    runtime_share = tp / (scale * layer.routed)
    for name in layer.expert_nodes:
        info = graph.info(graph.nodes_by_name[name])
        share = work_divisor(name, layout, tp, sp) / scale
        out[0] += node_time_s(info, device, shard_factor=share)
        out[1] += node_time_s(info, device, shard_factor=share, backward=True)
        saved_split = tp if (name in layout.saves_sharded or sp) else 1
        out[2] += info.saved_bytes * scale / saved_split
        out[3] += node_time_s(info, device, shard_factor=runtime_share)
        out[4] += node_time_s(info, device, shard_factor=runtime_share, backward=True)
        out[5] += info.saved_bytes / runtime_share
    return ExpertWork(*out)


def ep_segment(seg: SegmentCost, layer: MoELayer | None, ep: int,
               work: ExpertWork | None = None, recompute: str = "none") -> SegmentCost:
    """``seg`` with its expert parameters at ``1/ep`` of their whole size (what one rank
    holds: whole experts, never split over tp, whatever the layout) and, given
    ``work`` (:func:`expert_work`), its expert nodes' time and saved activations as the runtime
    runs them (the recompute re-runs their forward under ``full``; under ``full`` only the
    layer's input is saved, which the experts do not change)."""
    if layer is None or ep == 1:
        return seg
    whole = dict(layer.expert_numel)
    params = {k: (whole.get(k, n) / ep if k in layer.expert_params else n)
              for k, n in seg.params.items()}
    if work is None:
        return dataclasses.replace(seg, params=params)
    d_fwd = work.runtime_forward - work.priced_forward
    d_bwd = work.runtime_backward - work.priced_backward
    saved = seg.activations.saved
    if recompute != "full":
        saved = max(0.0, saved + work.runtime_saved - work.priced_saved)
    return dataclasses.replace(
        seg, params=params, forward_s=max(0.0, seg.forward_s + d_fwd),
        backward_s=max(0.0, seg.backward_s + d_bwd),
        recompute_s=max(0.0, seg.recompute_s + d_fwd) if recompute == "full" else seg.recompute_s,
        activations=dataclasses.replace(seg.activations, saved=saved))


def model_states(params: float | np.ndarray, expert_params: float | np.ndarray, *, dp: int,
                 ep: int, zero_stage: int, optimizer: OptimizerSpec = ADAM_MIXED,
                 offload: str = "none", dtensor: bool = True,
                 accumulates: bool = False) -> ModelStates:
    """``ZeRO(Ψ − Ψ_e, dp, z) + ZeRO(Ψ_e, dp/ep, z)`` with ``params`` = ``Ψ`` and
    ``expert_params`` = ``Ψ_e`` the rank's local counts (experts already ``1/ep``); arrays
    give one entry per rank (:func:`~fxplan.cost_model.memory.breakdown.model_state_bytes`;
    a rank without experts adds their ``0.0``, which leaves its sum exact). ``dtensor``,
    ``accumulates``: as there (``ep > 1`` makes the parameters DTensors)."""
    dense = model_state_bytes(params - expert_params, dp, zero_stage, optimizer, offload=offload,
                              dtensor=dtensor, accumulates=accumulates)
    if not np.any(expert_params):
        return dense
    experts = model_state_bytes(expert_params, dp // ep, zero_stage, optimizer, offload=offload,
                                dtensor=dtensor, accumulates=accumulates)
    return ModelStates(dense.params + experts.params, dense.grads + experts.grads,
                       dense.optimizer + experts.optimizer, dense.host + experts.host)


def expert_share(params: Mapping[str, float], layers: Mapping[str, MoELayer]) -> float:
    """Local elements of ``params`` (canonical or ``L<i>:``-prefixed names) that are experts'."""
    names = set().union(*(layer.expert_params for layer in layers.values())) if layers else set()
    return sum(n for k, n in params.items() if k.rpartition(":")[2] in names)
