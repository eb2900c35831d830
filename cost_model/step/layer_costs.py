"""Per-layer cost profiles of a captured graph, computed once and reused by every estimate.

A graph splits into *segments*: the nodes before the first layer (``pre``: embeddings), one
segment per layer (``NodeInfo.layer``) and the nodes after the last layer (``post``: final
norm, head, loss). Layers of one :class:`~passes.node_info.RepeatedBlock` have the same
structure, so one profile serves all of them: the planner's thousands of candidates touch a
handful of profiles, keyed on ``(segment, tp, sp, recompute, microbatch, device,
placements)``.

A :class:`SegmentCost` is per microbatch and per tp rank, with the captured quantities
scaled by ``k = microbatch / b₀`` (``b₀`` the capture's batch) and the work of split nodes
divided by ``t`` (:mod:`cost_model.parallel.megatron_layout`; with sequence parallelism the
replicated ops run on ``1/t`` of the sequence too):

- ``forward_s = Σ_n node_time(n)``, ``backward_s = Σ_n node_time(n, backward)``
  (:func:`cost_model.compute.op_time.node_time_s`, the function the intra-op solver prices nodes
  with, on the rank's share ``k / divisor`` of the node's work), each view node's host cost
  (``view_op_us``/``view_backward_op_us``: no kernel, 0 on the GPU specs), the first touch of
  the saved activations (:func:`cost_model.host.host_overhead.first_touch_s`, forward), plus under ``tp > 1`` the
  DTensor dispatch of every node that runs on DTensors, ordinary and view ops
  (:mod:`cost_model.host.dtensor_dispatch`) and the styles' boundaries (from_local, to_local's
  backward, redistributions without communication), ``recompute_s`` = forward time of the recomputed nodes
  (the attention core for ``selective``, the whole layer for ``full``; ``pre``/``post``
  are never recomputed, as in Megatron);
- tensor-parallel collectives per microbatch, as ``(kind, bytes)`` in nccl-tests sizes:
  forward — all-reduce of each row-parallel output and vocab-parallel embedding output
  (sequence parallel: reduce-scatter, plus an all-gather of each column-parallel input);
  under ``fp8`` the linear layers' products are priced by :mod:`cost_model.compute.fp8` instead;
  backward — all-reduce of each column-parallel input gradient (sequence parallel:
  reduce-scatter, plus an all-gather of each row-parallel output gradient; ``_tp_collectives``);
  full recompute repeats the forward ones. With sequence parallelism
  each collective of a linear layer also carries the seconds of the GEMM it can be pipelined
  with (``tp_forward_gemm_s``, ``tp_backward_gemm_s``, 0 for the others): the layer's forward
  GEMM, or one of its two backward GEMMs (``tp_overlap``, :mod:`cost_model.step.stage_costs`).
  ``tp_sm_forward``/``tp_sm_backward`` list the collectives that, so overlapped, run as
  kernels holding SMs beside their GEMM (Transformer Engine's userbuffers: the ``pipeline``
  reduce-scatter of each row-parallel output, and in the backward the ``bulk`` reduce-scatter
  of each column-parallel input gradient and the ``bulk`` all-gather of that input for the
  weight gradient; the all-gathers by ``ring_exchange`` run on copy engines);
  Priced placements (:mod:`cost_model.parallel.priced_layout`) instead
  contribute the collectives of ``reshard_cost`` on every edge whose tp placement changes,
  forward and backward (:mod:`cost_model.comm.edge_reshard`), and split exactly the nodes their
  placements split;
- activations (:mod:`cost_model.memory.activations`), local parameter elements by tied-canonical
  name, the bytes of the segment's output (the pipeline message) and the forward
  matrix-product FLOPs of the whole microbatch (Megatron's FLOP convention), all of them and
  the recomputed ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import torch

from fxplan.cost_model.memory.activations import (ActivationBytes, attention_core, itemsize,
                                    segment_activations, tensor_bytes)
from fxplan.cost_model.compute.attention_kernel import (BACKWARD_SPEED, CAUSAL_SPEED, FusedAttention,
                                               fused_attention_core, prices_fused_attention)
from fxplan.cost_model.compute.op_time import BACKWARD, node_time_s, op_time_s
from fxplan.core.config_error import CostModelError
from fxplan.core.placements import PlacementMap
from fxplan.cost_model.comm.edge_reshard import edge_collectives
from fxplan.cost_model.compute.fp8 import converted, fp8_node_time_s, fp8_working_bytes
from fxplan.cost_model.host.dtensor_dispatch import (boundary_s, dispatch_s, dtensor_ops,
                                                style_boundaries)
from fxplan.cost_model.host.host_overhead import first_touch_s
from fxplan.cost_model.comm.mesh import LogicalMesh
from fxplan.passes.node_info import MATMUL_CLASSES
from fxplan.cost_model.parallel.megatron_layout import CONST, SHARD, TPLayout, used_params
from fxplan.cost_model.parallel.tp_layout import tp_layout

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster, DeviceGroup
    from fxplan.passes.captured_graph import CapturedGraph
    from fxplan.passes.node_info import NodeInfo

__all__ = ["GraphSegments", "SegmentCost", "attention_seconds", "graph_segments",
           "segment_cost", "work_divisor"]

@dataclass(frozen=True)
class GraphSegments:
    """The graph cut into ``pre``, layers (in order) and ``post``, plus model facts.

    ``layers[i]`` is ``(key, names)``: the profile key (the block signature, or the layer
    index for a layer outside any repeated block) and the node names of a representative
    layer. ``batch`` is the capture's (dim 0 of its first batched input); ``seq`` dim 1 of
    its first 2-D integer (token) input, ``None`` for a model without one; ``heads`` the attention heads (``None``
    without attention); ``tp_widths`` the dimensions tensor parallelism splits.
    """

    pre: tuple[str, ...]
    layers: tuple[tuple[str, tuple[str, ...]], ...]
    post: tuple[str, ...]
    batch: int
    seq: int | None
    heads: int | None
    tp_widths: dict[str, int]

    def names(self, key: str) -> tuple[str, ...]:
        if key == "pre":
            return self.pre
        if key == "post":
            return self.post
        for layer_key, names in self.layers:
            if layer_key == key:
                return names
        raise KeyError(key)


@dataclass(frozen=True)
class SegmentCost:
    """One segment, one microbatch, one tp rank (module docstring)."""

    forward_s: float
    backward_s: float
    recompute_s: float
    tp_forward: tuple[tuple[str, float], ...]
    tp_backward: tuple[tuple[str, float], ...]
    activations: ActivationBytes
    params: dict[str, float]
    output_bytes: float
    matmul_flops: float
    recompute_flops: float
    tp_forward_gemm_s: tuple[float, ...] = ()
    tp_backward_gemm_s: tuple[float, ...] = ()
    tp_sm_forward: tuple[tuple[str, float], ...] = ()
    tp_sm_backward: tuple[tuple[str, float], ...] = ()
    #: the part of ``backward_s`` that computes weight gradients: half the backward of each
    #: matrix product with a parameter operand (its two equal backward GEMMs, ``dX = dY·Wᵀ``
    #: and ``dW = Xᵀ·dY``); what a zero-bubble schedule defers to its ``W`` op. Other
    #: parameters' gradients (norms, biases, the embedding's scatter) stay with the input
    #: gradient: small, and torch's ``stage_backward_weight`` runs them either way.
    weight_grad_share: float = 0.0

    @property
    def param_count(self) -> float:
        return sum(self.params.values())


def graph_segments(graph: CapturedGraph) -> GraphSegments:
    """Segments and facts of ``graph`` (memoised in ``graph.memo``)."""
    if "segments" not in graph.memo:
        graph.memo["segments"] = _segments(graph)
    return graph.memo["segments"]


def _segments(graph: CapturedGraph) -> GraphSegments:
    pre: list[str] = []
    post: list[str] = []
    by_layer: dict[int, list[str]] = {}
    for node, info in graph.nodes():
        if info.layer is not None:
            by_layer.setdefault(info.layer, []).append(node.name)
        elif by_layer:
            post.append(node.name)
        else:
            pre.append(node.name)
    signature = {layer: block.signature for block in graph.blocks for layer in block.layers}
    representative: dict[str, tuple[str, ...]] = {}
    layers = []
    for layer in sorted(by_layer):
        key = signature.get(layer, f"layer{layer}")
        representative.setdefault(key, tuple(by_layer[layer]))
        layers.append((key, representative[key]))
    batched = [(shape, dtype) for shape, dtype in graph.inputs.values() if shape]
    if not batched:
        raise CostModelError(f"graph {graph.name!r} has no batched input to scale microbatches by")
    batch = batched[0][0][0]
    seq = _token_seq(batched)
    layout = tp_layout(graph)
    infos = graph.infos_by_name
    heads, widths = None, {}
    for name in layout.column:
        info = infos[name]
        widths[f"{name}.out_features"] = info.shape[-1]
    nodes = graph.nodes_by_name
    for name in layout.vocab:  # its own table (nn.Embedding) or a get_attr input (ATen)
        weight = next(p for p in used_params(nodes[name], graph))
        widths["vocab"] = graph.params[weight].shape[0]
    for _, names in layers[:1]:
        for name in attention_core(graph, names, layout):
            shape = infos[name].shape
            if isinstance(shape, tuple) and len(shape) == 4 and isinstance(shape[0], int):
                heads = shape[1]
                break
    return GraphSegments(tuple(pre), tuple(layers), tuple(post), batch, seq, heads, widths)


def _token_seq(batched: list[tuple[tuple[int, ...], Any]]) -> int | None:
    """The sequence length: dim 1 of the first 2-D integer (token id) input, else ``None``
    (images, feature vectors: no sequence, so no tokens/s and no sequence parallelism)."""
    for shape, dtype in batched:
        if len(shape) == 2 and not dtype.is_floating_point and not dtype.is_complex \
                and dtype != torch.bool:
            return shape[1]
    return None


def segment_cost(graph: CapturedGraph, key: str, *, tp: int, sequence_parallel: bool,
                 recompute: str, microbatch: int, device: DeviceGroup,
                 placements: PlacementMap | None = None,
                 cluster: Cluster | None = None, fp8: bool = False) -> SegmentCost:
    """The cached :class:`SegmentCost` of segment ``key`` (``"pre"``, ``"post"`` or a layer key).

    ``fp8`` prices the linear layers' matrix products in FP8 (:mod:`cost_model.compute.fp8`).

    ``cluster`` prices the reshards of priced placements (:mod:`cost_model.parallel.priced_layout`) on
    the tp group ``0 … tp−1``; the other layouts do not need it."""
    sp = sequence_parallel and tp > 1
    policy = recompute if key not in ("pre", "post") else "none"
    mesh = None
    if tp > 1 and tp_layout(graph, placements).priced:
        if cluster is None:
            raise CostModelError("priced placements need the cluster to price their reshards")
        mesh = LogicalMesh(cluster, (tp,), ("tp",))
    cache_key = ("segment", key, tp, sp, policy, microbatch, _unplaced(device), placements,
                 mesh, fp8)
    hit = graph.memo.get(cache_key)
    if hit is None:
        hit = graph.memo[cache_key] = _segment_cost(graph, key, tp, sp, policy, microbatch,
                                                    device, placements, mesh, fp8)
    return hit


@lru_cache(maxsize=256)
def _unplaced(device: DeviceGroup) -> DeviceGroup:
    """``device`` as a segment's price sees it: the group's size and place in the cluster
    (``nodes``, ``first_rank``, ``first_node``) enter no segment's price (the tp collectives'
    do, and the mesh is its own key), so the graph's memo serves every size of a cluster
    (``fxplan compare`` plans one captured graph on 8 sizes of each kind)."""
    return replace(device, nodes=1, first_rank=0, first_node=0)


def work_divisor(name: str, layout: TPLayout, tp: int, sp: bool) -> int:
    """How many ways the work of node ``name`` is split over the tp ranks."""
    if layout.priced:
        return tp if name in layout.split else 1
    if name in layout.column or name in layout.row or layout.state.get(name) == SHARD:
        return tp
    if name in layout.vocab:
        return 1
    return tp if sp and layout.state.get(name) != CONST else 1


def _node_times(memo: dict[tuple[str, float], tuple[float, float]], name: str,
                info: NodeInfo, device: DeviceGroup, shard: float) -> tuple[float, float]:
    """:func:`~fxplan.cost_model.compute.op_time.node_time_s` of node ``name``'s forward and
    backward on ``1/shard`` of its work, memoized in ``memo`` (one per graph and device): the
    recompute policies of a segment, and its sequence-parallel variants, price the same
    nodes."""
    key = (name, shard)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = (node_time_s(info, device, shard_factor=shard),
                           node_time_s(info, device, shard_factor=shard, backward=True))
    return hit


def _segment_cost(graph: CapturedGraph, key: str, tp: int, sp: bool, policy: str,
                  microbatch: int, device: DeviceGroup,
                  placements: PlacementMap | None,
                  mesh: LogicalMesh | None, fp8: bool = False) -> SegmentCost:
    segments = graph_segments(graph)
    names = segments.names(key)
    layout = tp_layout(graph, placements)
    scale = microbatch / segments.batch
    infos = graph.infos_by_name
    recomputed: set[str] = set()
    if policy == "full":
        recomputed = set(names)
    elif policy == "selective":
        recomputed = set(attention_core(graph, names, layout))
    forward = backward = recompute = flops = recompute_flops = fp8_working = 0.0
    host = device.host         # CPU host costs (HostCosts), None on the GPU specs
    fused = fused_attention_core(graph, names, layout) if prices_fused_attention(device) else None
    if fused is not None:
        fwd, bwd = _fused_times(fused, infos[fused.output], device,
                                work_divisor(fused.output, layout, tp, sp) / scale)
        forward, backward = fwd, bwd
        if recomputed & fused.nodes:
            recompute += fwd
    tp_fwd: list[tuple[str, float]] = []
    tp_bwd: list[tuple[str, float]] = []
    params: dict[str, float] = {}
    gemm_fwd: list[float] = []
    gemm_bwd: list[float] = []
    sm_fwd: list[tuple[str, float]] = []
    sm_bwd: list[tuple[str, float]] = []
    weight_grad = 0.0
    times = graph.memo.setdefault(("node_times", device), {})
    for name in names:
        info = infos[name]
        fwd = bwd = 0.0
        if fused is None or name not in fused.nodes:
            # One pricing path with the intra-op solver: node_time_s on this rank's share.
            shard = work_divisor(name, layout, tp, sp) / scale
            if fp8 and converted(info):
                fwd = fp8_node_time_s(info, device, shard_factor=shard, backward=False)
                bwd = fp8_node_time_s(info, device, shard_factor=shard, backward=True)
                fp8_working = max(fp8_working, fp8_working_bytes(info, shard))
            else:
                fwd, bwd = _node_times(times, name, info, device, shard)
            if host and info.op_class == "view":   # no kernel, but its dispatch (CPU hosts)
                fwd += host.view_op_us * 1e-6
                bwd += host.view_backward_op_us * 1e-6
            if host and tp > 1:   # the node's ops on DTensors and its styles' boundaries
                dispatch = dispatch_s(dtensor_ops(graph, name, layout, sp=sp,
                                                  split=work_divisor(name, layout, tp, sp) > 1),
                                      host)
                style = boundary_s(style_boundaries(graph, name, layout, sp=sp,
                                                    in_layer=key not in ("pre", "post")), host)
                fwd += dispatch[0] + style[0]
                bwd += dispatch[1] + style[1]
            forward += fwd
            backward += bwd
            if name in recomputed:
                recompute += fwd
        if info.op_class in MATMUL_CLASSES:
            flops += float(info.flops) * scale
            if used_params(graph.nodes_by_name[name], graph):
                weight_grad += bwd / 2
            if name in recomputed:
                recompute_flops += float(info.flops) * scale
        if mesh is not None:
            _edge_collectives(graph, name, layout, scale, mesh, tp_fwd, tp_bwd)
        elif tp > 1:
            n_fwd, n_bwd = len(tp_fwd), len(tp_bwd)
            _tp_collectives(graph, name, layout, scale, sp, tp_fwd, tp_bwd,
                            # userbuffers serve the layers' linears, not the embedding or head
                            held=(sm_fwd, sm_bwd) if key not in ("pre", "post") else None)
            # the GEMM each sequence-parallel collective can pipeline with: the node's forward
            # GEMM, or one of its two equal backward GEMMs (compute.BACKWARD["matmul"])
            gemm = sp and info.op_class in MATMUL_CLASSES
            gemm_fwd += [fwd if gemm else 0.0] * (len(tp_fwd) - n_fwd)
            gemm_bwd += [bwd / 2 if gemm else 0.0] * (len(tp_bwd) - n_bwd)
        for param in used_params(graph.nodes_by_name[name], graph):
            canonical = graph.params[param].tied_to or param
            split = tp if param in layout.sharded_params else 1
            params[canonical] = graph.params[param].numel / split
    if policy == "full":
        tp_bwd = tp_fwd + tp_bwd
        gemm_bwd = gemm_fwd + gemm_bwd
        sm_bwd = sm_fwd + sm_bwd
    activations = segment_activations(graph, names, layout, tp=tp,
                                      sequence_parallel=sp and not layout.priced, recompute=policy,
                                      fused=fused)
    activations = activations.scaled(scale, fp8_working)
    # the saved activations' pages faulted in again on a CPU rank (host_overhead; 0 on GPUs)
    forward += first_touch_s(activations.saved, host)
    if policy != "none" and host and host.first_touch_us_per_mib:
        kept = segment_activations(graph, names, layout, tp=tp,
                                   sequence_parallel=sp and not layout.priced, recompute="none",
                                   fused=fused).saved * scale
        recompute += first_touch_s(max(0.0, kept - activations.saved), host)
    split_output = layout.is_sharded(names[-1]) if layout.priced and names else sp
    output = tensor_bytes(infos[names[-1]]) * scale / (tp if split_output else 1) if names else 0.0
    return SegmentCost(forward, backward, recompute, tuple(tp_fwd), tuple(tp_bwd), activations,
                       params, output, flops, recompute_flops, tuple(gemm_fwd),
                       tuple(gemm_bwd), tuple(sm_fwd), tuple(sm_bwd),
                       weight_grad / backward if backward > 0 else 0.0)


def attention_seconds(graph: CapturedGraph, key: str, *, tp: int, sequence_parallel: bool,
                      microbatch: int, device: DeviceGroup) -> tuple[float, float]:
    """``(forward, backward)`` seconds of segment ``key``'s attention core on one tp rank
    (the fused kernel where the device runs one, else its nodes one by one), part of what
    :func:`segment_cost` adds up; ``(0, 0)`` without a core (memoised)."""
    cache_key = ("attention_s", key, tp, sequence_parallel and tp > 1, microbatch, device)
    if cache_key in graph.memo:
        return graph.memo[cache_key]
    segments = graph_segments(graph)
    names = segments.names(key)
    layout = tp_layout(graph)
    sp = sequence_parallel and tp > 1
    scale = microbatch / segments.batch
    infos = graph.infos_by_name
    fused = fused_attention_core(graph, names, layout) if prices_fused_attention(device) else None
    if fused is not None:
        out = _fused_times(fused, infos[fused.output], device,
                           work_divisor(fused.output, layout, tp, sp) / scale)
    else:
        core = attention_core(graph, names, layout)
        shards = {n: work_divisor(n, layout, tp, sp) / scale for n in core}
        out = (sum(node_time_s(infos[n], device, shard_factor=shards[n]) for n in core),
               sum(node_time_s(infos[n], device, shard_factor=shards[n], backward=True)
                   for n in core))
    graph.memo[cache_key] = out
    return out


def _fused_times(fused: FusedAttention, info: Any, device: DeviceGroup,
                 shard: float) -> tuple[float, float]:
    """(forward, backward) seconds of the fused attention kernel on this rank's share
    ``1/shard`` of the core (:mod:`cost_model.compute.attention_kernel`): a causal kernel runs at
    ``CAUSAL_SPEED`` of the rate, priced as ``1/CAUSAL_SPEED`` times its executed FLOPs."""
    dtype = info.dtype[0] if isinstance(info.dtype, tuple) else info.dtype
    speed = CAUSAL_SPEED if fused.causal else 1.0
    flops, traffic = fused.flops / shard / speed, fused.bytes_moved / shard
    rule = BACKWARD["attention"]
    return (op_time_s("attention", flops, traffic, dtype, device),
            op_time_s("attention", flops * rule.flops / BACKWARD_SPEED, traffic * rule.bytes,
                      dtype, device))


def _edge_collectives(graph: CapturedGraph, name: str, layout: TPLayout, scale: float,
                      mesh: LogicalMesh, fwd: list[tuple[str, float]],
                      bwd: list[tuple[str, float]]) -> None:
    """Append the reshards of priced placements into node ``name``
    (:func:`cost_model.comm.edge_reshard.edge_collectives`), scaled to the microbatch."""
    infos = graph.infos_by_name
    for edge in layout.edges.get(name, ()):
        info = infos[edge.producer]
        shape = info.shape if isinstance(info.shape[0], int) else info.shape[0]
        dtype = info.dtype[0] if isinstance(info.dtype, tuple) else info.dtype
        forward, backward = edge_collectives(
            (edge.src,), (edge.dst,), (edge.consumer_split,), edge.requires_grad, tuple(shape),
            itemsize(dtype), mesh)
        fwd.extend((kind, nbytes * scale) for kind, nbytes in forward)
        bwd.extend((kind, nbytes * scale) for kind, nbytes in backward)


def _tp_collectives(graph: CapturedGraph, name: str, layout: TPLayout, scale: float, sp: bool,
                    fwd: list[tuple[str, float]], bwd: list[tuple[str, float]],
                    held: tuple[list[tuple[str, float]], list[tuple[str, float]]] | None = None
                    ) -> None:
    """Append the tp collectives node ``name`` implies (module docstring); under sequence
    parallelism also, to ``held`` (forward, backward), those Transformer Engine's userbuffers
    run on SMs when overlapped (module docstring: ``tp_sm_forward``).

    The collectives follow the runtime (:mod:`fxplan.runtime.styles.tp_styles`, measured with
    ``benchmarks/dtensor_comm_counts.py``) but for one: the runtime hands the loss the LM
    head's whole output (``ColwiseParallel(output_layouts=Replicate())``, one forward
    all-gather), which is not priced here, so that this default layout prices what the
    intra-op solver's layout does (the loss vocabulary-parallel, as Megatron computes it).
    Under sp a replicated embedding looked up with constant indices (GPT's positions) costs
    no collective: each tp rank looks up its own positions
    (``runtime.styles.tp_positions.PositionShard``) and the table's partial gradient joins the
    replicated parameters' all-reduce (:mod:`cost_model.comm.partial_grads`). A column-parallel
    input gathered under sp is saved gathered (the gather is a ``PrepareModuleInput`` before
    the module), so the weight gradient gathers nothing again."""
    infos = graph.infos_by_name
    out_bytes = tensor_bytes(infos[name]) * scale
    if name in layout.row or name in layout.vocab:
        fwd.append(("reduce_scatter" if sp else "all_reduce", out_bytes))
        if sp:
            bwd.append(("all_gather", out_bytes))
            if held is not None and name in layout.row:   # TE "pipeline" reduce-scatter
                held[0].append(("reduce_scatter", out_bytes))
    elif name in layout.column:
        source = layout.inputs[name][0]
        in_bytes = tensor_bytes(infos[source]) * scale
        if sp:
            fwd.append(("all_gather", in_bytes))
            if held is not None:   # TE "bulk": gather the input, scatter its gradient
                held[1].extend((("all_gather", in_bytes), ("reduce_scatter", in_bytes)))
        bwd.append(("reduce_scatter" if sp else "all_reduce", in_bytes))
    elif name in layout.gathers:
        fwd.append(("all_gather", out_bytes))
