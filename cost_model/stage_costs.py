"""Assemble per-stage costs and memory of one configuration from cached segment profiles.

**Ranks.** The mesh is ``pp × dp × tp`` in row-major order (:class:`cost_model.mesh.
LogicalMesh` with axes ``("pp", "dp", "tp")``): rank ``= i_pp·dp·tp + i_dp·tp + i_tp``, so tp
takes consecutive ranks (inside a node where it fits), dp strides by ``tp`` and pipeline
stages by ``dp·tp``. Stage ``s`` is priced on its first data-parallel replica.

**Chunks.** Virtual stage ``j = c·p + s`` (chunk ``c`` of stage ``s``) holds the ``j``-th run
of layers (``ParallelConfig.layers_per_stage``); ``pre`` joins virtual stage 0 and ``post``
the last. Per microbatch, chunk ``(s, c)`` costs (seconds):

- compute: forward ``Σ f_seg``; backward ``Σ (b_seg + r_seg)`` (recompute runs first);
- tp: the segments' collectives over the stage's tp group (on the critical path);
- ZeRO-3: each segment all-gathers its weights (``k_p·Ψ_seg`` bytes) before its forward and
  again before its backward, and reduce-scatters its gradients (``k_g·Ψ_seg``) after it,
  prefetched one segment ahead; the first gather and the last reduce-scatter of a chunk
  cannot hide, and only ``comm_overlap`` of the others can
  (:func:`cost_model.host_overhead.zero3_exposed_s`);
- p2p: the forward sends the chunk's output (``o`` bytes) to the next virtual stage, the
  backward sends the gradient of its input to the previous one; with tp, as Megatron's
  scatter/gather optimisation: each tp rank sends ``o/t`` and the receiver all-gathers
  (unless sequence parallel, where ``o`` is already split).

**Data parallelism** (ZeRO 0–2): one bucket per segment, ready when the last backward of its
chunk has passed it (fractions of that op's time, in backward order ``post``, layers last to
first, ``pre``), all-reduced (ZeRO-0, and ZeRO-1 without tp, which the runtime runs as DDP +
``ZeroRedundancyOptimizer``) or reduce-scattered (ZeRO-2, ZeRO-1 as FSDP2) over dp. After the
backward: ZeRO-2 all-gathers the updated 16-bit weights, ZeRO-1 without tp broadcasts each
parameter tensor from its owner (one collective per tensor); a weight tied across stages
(embedding and LM head) all-reduces its gradient between them. The optimizer step reads and
writes ``step_bytes`` per local parameter (``Ψ/N`` under ZeRO ≥ 1) at memory speed, plus its
per-tensor host loop; only ``comm_overlap`` of each bucket may overlap the backward
(:mod:`cost_model.host_overhead`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np
import torch

from fxplan.cost_model.collectives import collective_time_s
from fxplan.cost_model.compute import op_time_s
from fxplan.core.config import ParallelConfig
from fxplan.cost_model.host_overhead import (dtensor_params, optimizer_host_s, overlapped_buckets,
                                             zero3_exposed_s)
from fxplan.cost_model.layer_costs import GraphSegments, SegmentCost, segment_cost
from fxplan.cost_model.memory import (ADAM_MIXED, GIB, MemoryBreakdown, OptimizerSpec,
                               model_state_bytes)
from fxplan.cost_model.pipeline_schedules import ScheduleOrder
from fxplan.cost_model.simulator import StageCosts

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster, DeviceGroup
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["StagePlan", "buffer_bytes", "build_stages", "rank_memory", "stage_memory",
           "stage_ranks"]


def stage_ranks(config: ParallelConfig, stage: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(tp group, dp group)`` of the first replica of ``stage`` (module docstring)."""
    first = stage * config.dp * config.tp
    return (tuple(range(first, first + config.tp)),
            tuple(first + j * config.tp for j in range(config.dp)))


@dataclass(frozen=True, eq=False)
class StagePlan:
    """Everything the simulator and the memory model need for one configuration."""

    costs: StageCosts
    chunks: tuple[tuple[tuple[SegmentCost, ...], ...], ...]   # [s][c] → segments in order
    params: tuple[dict[str, float], ...]                       # [s] canonical name → local numel
    devices: tuple[DeviceGroup, ...]


def _chunk_keys(segments: GraphSegments, config: ParallelConfig) -> list[list[list[tuple[str, str]]]]:
    """``[s][c]`` → ``(profile key, instance label)`` of the chunk's segments in order; the
    label (``pre``, ``post``, ``L<i>``) names the segment's own copy of its parameters."""
    p, v = config.pp, config.virtual_stages
    counts = config.layers_per_stage(len(segments.layers))
    keys: list[list[list[tuple[str, str]]]] = [[[] for _ in range(v)] for _ in range(p)]
    start = 0
    for j, count in enumerate(counts):
        s, c = j % p, j // p
        chunk = [("pre", "pre")] if j == 0 else []
        chunk += [(key, f"L{start + i}") for i, (key, _) in
                  enumerate(segments.layers[start:start + count])]
        if j == len(counts) - 1:
            chunk.append(("post", "post"))
        keys[s][c] = chunk
        start += count
    return keys


@lru_cache(maxsize=1 << 16)
def _collective(kind: str, nbytes: float, group: tuple[int, ...], cluster: Cluster) -> float:
    """:func:`collective_time_s`, memoised on the exact arguments (the planner's hot path)."""
    return collective_time_s(kind, nbytes, group, cluster)


@lru_cache(maxsize=1 << 12)
def _optimizer_s(optimizer: OptimizerSpec, params: float, tensors: int, dtensor: bool,
                 device: DeviceGroup) -> float:
    """Memory-bound optimizer step over ``params`` local parameters in ``tensors`` tensors,
    its per-tensor host loop (:func:`~cost_model.host_overhead.optimizer_host_s`) and the
    device's fixed host cost per step:
    ``op_time(12·Ψ FLOPs, 28·Ψ bytes) + t_opt_host + step_overhead_us``."""
    return (op_time_s("elementwise", optimizer.step_flops * params, optimizer.step_bytes * params,
                      torch.float32, device)
            + optimizer_host_s(tensors, device, dtensor=dtensor) + device.step_overhead_us * 1e-6)


def _zero1_broadcasts(config: ParallelConfig) -> bool:
    """ZeRO-1 as the runtime runs it without tensor parallelism: DDP all-reduces the gradients
    and ``ZeroRedundancyOptimizer`` broadcasts every parameter tensor from its owner after
    the step (:mod:`fxplan.runtime.data_parallel`); with ``tp > 1`` it runs as FSDP2."""
    return config.zero_stage == 1 and config.dp > 1 and not dtensor_params(config)


def _price(events: Iterable[tuple[str, float]], group: tuple[int, ...],
           cluster: Cluster) -> float:
    return sum(_collective(kind, nbytes, group, cluster) for kind, nbytes in events)


def build_stages(graph: CapturedGraph, segments: GraphSegments, cluster: Cluster,
                 config: ParallelConfig,
                 optimizer: OptimizerSpec) -> StagePlan:
    """Per-(stage, chunk) costs (module docstring) for the simulator."""
    p, v, tp = config.pp, config.virtual_stages, config.tp
    keys = _chunk_keys(segments, config)
    forward, backward = np.zeros((4, p, v)), np.zeros((4, p, v))
    chunks, params, devices, buckets = [], [], [], []
    post, opt_time = np.zeros(p), np.zeros(p)
    for s in range(p):
        tp_group, dp_group = stage_ranks(config, s)
        device = cluster.device(tp_group[0])
        devices.append(device)
        row = tuple(tuple(segment_cost(graph, key, tp=tp, sequence_parallel=config.sequence_parallel,
                                       recompute=config.recompute, microbatch=config.microbatch_size,
                                       device=device, placements=config.placements,
                                       cluster=cluster)
                          for key, _ in keys[s][c]) for c in range(v))
        chunks.append(row)
        stage_params: dict[str, float] = {}
        stage_buckets = []
        for c, segs in enumerate(row):
            f_c, b_c = _chunk_times(segs, tp_group, dp_group, cluster, config, optimizer,
                                    device.comm_overlap)
            forward[:3, s, c], backward[:3, s, c] = f_c, b_c
            labels = [label for _, label in keys[s][c]]
            stage_buckets.append(overlapped_buckets(
                _buckets(segs, labels, stage_params, dp_group, cluster, config, optimizer),
                device.comm_overlap))
        params.append(stage_params)
        buckets.append(tuple(stage_buckets))
        psi = sum(stage_params.values())
        local = psi / config.dp if config.zero_stage >= 1 else psi
        # ZeRO-1 without FSDP steps only the tensors its rank owns (ZeroRedundancyOptimizer).
        fsdp = dtensor_params(config) and config.tp == 1
        owned = config.dp if config.zero_stage == 1 and not fsdp and config.tp == 1 else 1
        tensors = -(-len(stage_params) // owned)
        opt_time[s] = _optimizer_s(optimizer, local, tensors, dtensor_params(config), device)
        if _zero1_broadcasts(config):
            # ZeroRedundancyOptimizer: each updated tensor broadcast from the rank that owns it
            post[s] += sum(_collective("broadcast", optimizer.param_bytes * n, dp_group, cluster)
                           for n in stage_params.values())
        elif config.zero_stage in (1, 2):
            post[s] += _collective("all_gather", optimizer.param_bytes * psi, dp_group, cluster)
    _p2p(chunks, forward, backward, config, cluster)
    _tied_sync(params, post, config, cluster, optimizer)
    costs = StageCosts(forward, backward, tuple(buckets), post, opt_time)
    return StagePlan(costs, tuple(chunks), tuple(params), tuple(devices))


def _chunk_times(segs: tuple[SegmentCost, ...], tp_group: tuple[int, ...],
                 dp_group: tuple[int, ...], cluster: Cluster, config: ParallelConfig,
                 optimizer: OptimizerSpec, overlap: float) -> tuple[list[float], list[float]]:
    """``[compute, tp, zero]`` seconds of one chunk's forward and backward; ZeRO-3's
    exposed gathers and reduce-scatters by :func:`~cost_model.host_overhead.zero3_exposed_s`
    with the device's ``comm_overlap``."""
    f = [0.0, 0.0, 0.0]
    b = [0.0, 0.0, 0.0]
    for seg in segs:
        f[0] += seg.forward_s
        b[0] += seg.backward_s + seg.recompute_s
        f[1] += _price(seg.tp_forward, tp_group, cluster)
        b[1] += _price(seg.tp_backward, tp_group, cluster)
    if config.zero_stage == 3 and config.dp > 1:
        gather = [_collective("all_gather", optimizer.param_bytes * seg.param_count, dp_group,
                              cluster) for seg in segs]
        scatter = [_collective("reduce_scatter", optimizer.grad_bytes * seg.param_count,
                               dp_group, cluster) for seg in segs]
        f[2], b[2] = zero3_exposed_s([seg.forward_s for seg in segs],
                                     [seg.backward_s + seg.recompute_s for seg in segs],
                                     gather, scatter, overlap)
    return f, b


def _buckets(segs: tuple[SegmentCost, ...], labels: list[str], stage_params: dict[str, float],
             dp_group: tuple[int, ...], cluster: Cluster, config: ParallelConfig,
             optimizer: OptimizerSpec) -> tuple[tuple[float, float], ...]:
    """Gradient buckets of one chunk as ``(fraction of its last backward, seconds)``; also
    collects the chunk's parameters into ``stage_params`` (a layer's under its label, the
    others' — embeddings, head, possibly tied — under their canonical names)."""
    total = sum(seg.backward_s + seg.recompute_s for seg in segs) or 1.0
    elapsed, out = 0.0, []
    kind = ("all_reduce" if config.zero_stage == 0 or _zero1_broadcasts(config)
            else "reduce_scatter")
    for seg, label in zip(reversed(segs), reversed(labels)):
        elapsed += seg.backward_s + seg.recompute_s
        prefix = f"{label}:" if label.startswith("L") else ""
        new = {prefix + k: n for k, n in seg.params.items() if prefix + k not in stage_params}
        stage_params.update(new)
        if config.zero_stage < 3 and config.dp > 1 and new:
            seconds = _collective(kind, optimizer.grad_bytes * sum(new.values()), dp_group, cluster)
            out.append((elapsed / total, seconds))
    return tuple(out)


def _p2p(chunks: list, forward: np.ndarray, backward: np.ndarray, config: ParallelConfig,
         cluster: Cluster) -> None:
    """Fill row 3 (blocking sends) of ``forward``/``backward`` (module docstring)."""
    p, v, tp = config.pp, config.virtual_stages, config.tp
    last = p * v - 1
    for j in range(last):
        s, c = j % p, j // p
        s2, c2 = (j + 1) % p, (j + 1) // p
        if s2 == s:
            continue
        message = chunks[s][c][-1].output_bytes
        a, b = stage_ranks(config, s)[0][0], stage_ranks(config, s2)[0][0]
        per_rank = message if config.sequence_parallel or tp == 1 else message / tp
        seconds = _collective("send_recv", per_rank, (a, b), cluster)
        if tp > 1 and not config.sequence_parallel:
            seconds += _collective("all_gather", message, stage_ranks(config, s2)[0], cluster)
        forward[3, s, c] += seconds
        backward[3, s2, c2] += seconds


def _tied_sync(params: list[dict[str, float]], post: np.ndarray, config: ParallelConfig,
               cluster: Cluster, optimizer: OptimizerSpec) -> None:
    """All-reduce the gradient of a weight held by several stages among them."""
    holders: dict[str, list[int]] = {}
    for s, stage_params in enumerate(params):
        for name in stage_params:
            if ":" not in name:  # layers' parameters (``L<i>:name``) live on one stage
                holders.setdefault(name, []).append(s)
    for name, stages in holders.items():
        if len(stages) > 1:
            group = tuple(stage_ranks(config, s)[0][0] for s in stages)
            seconds = _collective("all_reduce", optimizer.grad_bytes * params[stages[0]][name],
                                  group, cluster)
            for s in stages:
                post[s] += seconds


def buffer_bytes(max_output_bytes: float, max_segment_params: float, *, pp: int, tp: int,
                 dp: int, zero_stage: int, sequence_parallel: bool,
                 optimizer: OptimizerSpec = ADAM_MIXED) -> float:
    """Transient buffers of one pipeline rank, bytes: ``2·o`` (pipeline send/recv, ``pp > 1``)
    ``+ t·o`` (sequence parallel: a column-parallel input all-gathered) ``+ 2·(k_p + k_g)·ψ``
    (ZeRO-3: gathered weights and gradients of the running and the prefetched segment), with
    ``o`` the largest segment output and ``ψ`` the largest segment's parameters on the rank."""
    out = 2.0 * max_output_bytes if pp > 1 else 0.0
    if sequence_parallel and tp > 1:
        out += max_output_bytes * tp
    if zero_stage == 3 and dp > 1:
        out += 2.0 * max_segment_params * (optimizer.param_bytes + optimizer.grad_bytes)
    return out


def rank_memory(order: ScheduleOrder, *, params: Sequence[float], saved: np.ndarray,
                working: Sequence[float], max_output_bytes: Sequence[float],
                max_segment_params: Sequence[float], reserved: Sequence[float],
                capacity: Sequence[float], tp: int, dp: int, zero_stage: int,
                sequence_parallel: bool,
                optimizer: OptimizerSpec = ADAM_MIXED) -> list[MemoryBreakdown]:
    """Peak memory of each pipeline rank ``s`` from its aggregates (the one formula
    :func:`stage_memory` and the planner's search both use):

        states_s  = ZeRO(params[s], dp, zero)
        acts_s    = peak over time of Σ_c n_c(τ)·saved[s, c]   (``order.peak_inflight``)
        working_s = working[s]        (largest recompute working set of a segment on s)
        buffers_s = :func:`buffer_bytes` of the rank's largest output and segment

    ``saved[s, c]`` is the saved bytes per microbatch of chunk ``c`` of rank ``s``."""
    inflight = order.peak_inflight(np.asarray(saved, dtype=float))
    out = []
    for s in range(order.stages):
        states = model_state_bytes(float(params[s]), dp, zero_stage, optimizer)
        buffers = buffer_bytes(float(max_output_bytes[s]), float(max_segment_params[s]),
                               pp=order.stages, tp=tp, dp=dp, zero_stage=zero_stage,
                               sequence_parallel=sequence_parallel, optimizer=optimizer)
        out.append(MemoryBreakdown(states.params, states.grads, states.optimizer,
                                   float(inflight[s]), float(working[s]), buffers,
                                   float(reserved[s]), float(capacity[s])))
    return out


def stage_memory(plan: StagePlan, order: ScheduleOrder, config: ParallelConfig,
                 optimizer: OptimizerSpec) -> list[MemoryBreakdown]:
    """Peak memory per stage (:func:`rank_memory`, :mod:`cost_model.memory`)."""
    p, v = config.pp, config.virtual_stages
    saved = np.array([[sum(seg.activations.saved for seg in plan.chunks[s][c]) for c in range(v)]
                      for s in range(p)])
    segs = [[seg for c in range(v) for seg in plan.chunks[s][c]] for s in range(p)]
    return rank_memory(
        order, params=[sum(plan.params[s].values()) for s in range(p)], saved=saved,
        working=[max(seg.activations.working for seg in row) for row in segs],
        max_output_bytes=[max(seg.output_bytes for seg in row) for row in segs],
        max_segment_params=[max(seg.param_count for seg in row) for row in segs],
        reserved=[device.reserved_memory_gib * GIB for device in plan.devices],
        capacity=[device.memory_gib * GIB for device in plan.devices],
        tp=config.tp, dp=config.dp, zero_stage=config.zero_stage,
        sequence_parallel=config.sequence_parallel, optimizer=optimizer)
