"""Assemble per-stage costs and memory of one configuration from cached segment profiles.

**Ranks.** The mesh is ``pp × dp × tp`` in row-major order (:class:`cost_model.comm.mesh.
LogicalMesh` with axes ``("pp", "dp", "tp")``): rank ``= i_pp·dp·tp + i_dp·tp + i_tp``, so tp
takes consecutive ranks (inside a node where it fits), dp strides by ``tp`` and pipeline
stages by ``dp·tp``. Stage ``s`` is priced on its first data-parallel replica.

**Chunks.** Virtual stage ``j = c·p + s`` (chunk ``c`` of stage ``s``; in the V of ``zbv``
and ``dualpipev`` ``j = s`` for chunk 0 and ``2p−1−s`` for chunk 1,
:meth:`~fxplan.core.config.Schedule.placement`) holds the ``j``-th run of layers
(``ParallelConfig.layers_per_stage``); ``pre`` joins virtual stage 0 and ``post`` the last. Under a zero-bubble schedule the weight-gradient
GEMMs of a chunk's backward (``Σ_seg share_seg·b_seg``, :class:`~cost_model.step.layer_costs.
SegmentCost`'s ``weight_grad_share``) run as their own ``W`` op (``StageCosts.weight``).
Per microbatch, chunk ``(s, c)`` costs (seconds):

- compute: forward ``Σ f_seg``; backward ``Σ (b_seg + r_seg)`` (recompute runs first);
- tp: the segments' collectives over the stage's tp group (on the critical path), each with
  DTensor's host work of its redistribution (:func:`cost_model.host.host_overhead.
  redistribute_host_s`, 0 on GPU specs) and, where ranks with work time-share the node's
  cores (a single-stage plan, or other data-parallel replicas beside the stage), the caches
  its wait lets them evict (:func:`cost_model.host.host_overhead.evicted_waits_s`); under
  ``tp_overlap`` (Megatron-Core ``--tp-comm-overlap``) each sequence-parallel all-gather or
  reduce-scatter of a linear layer only by what exceeds the GEMM it is pipelined with,
  ``max(0, t_comm − t_gemm)`` (:func:`_exposed`), plus the compute lost to the SMs the
  overlapped communication kernels hold meanwhile: Transformer Engine's userbuffers run
  each ``pipeline``/``bulk`` collective (``SegmentCost.tp_sm_forward``/``tp_sm_backward``)
  as a kernel on ``n = UB_COMM_SMS`` of the device's ``N = sm_count`` SMs for its duration
  ``t``, so the GEMM beside it loses ``n/N`` of its throughput for ``t`` and finishes
  ``t·n/(N − n)`` later (:func:`_sm_share`; nothing without a spec ``sm_count``);
- ZeRO-3: each segment all-gathers its weights (``k_p·Ψ_seg`` bytes) before its forward and
  again before its backward, and reduce-scatters its gradients (``k_g·Ψ_seg``) after it,
  prefetched one segment ahead; the first gather and the last reduce-scatter of a chunk
  cannot hide, and only ``comm_overlap`` of the others can
  (:func:`cost_model.host.host_overhead.zero3_exposed_s`);
- FSDP2 (ZeRO-2/3, ZeRO-1 with tp > 1): the host work of the chunk's ``fully_shard`` groups
  (:mod:`cost_model.host.fsdp_host`: per microbatch in the forward, ZeRO-3's re-gather in the
  backward, both in the ZeRO row; the reduce once per step after the backward);
- p2p: the forward sends the chunk's output (``o`` bytes) to the next virtual stage, the
  backward sends the gradient of its input to the previous one; with tp, as Megatron's
  scatter/gather optimisation: each tp rank sends ``o/t`` and the receiver all-gathers
  (unless sequence parallel, where ``o`` is already split).

**Recompute per layer.** Each layer is priced under its own policy
(:meth:`~fxplan.core.config.ParallelConfig.layer_recompute`): with ``recompute_layers =
(k_j)`` the first ``k_j`` of the ``n_j`` layers of virtual stage ``j`` run the policy ``ρ``
(``selective`` or ``full``) and the others ``none``. With ``f_i``, ``b_i`` (the same under every
policy), ``r^ρ_i`` the forward work ``ρ`` re-runs, ``a^0_i`` / ``a^ρ_i`` the saved bytes
without / with ``ρ`` and ``w^ρ_i`` the working bytes of its re-run
(:mod:`cost_model.memory.activations`), per microbatch::

    F_j = Σ_{i ∈ j} f_i                 B_j(k_j) = Σ_{i ∈ j} b_i + Σ_{i < k_j} r^ρ_i
    A_j(k_j) = Σ_{i < k_j} a^ρ_i + Σ_{i ≥ k_j} a^0_i      W_j = max_{i < k_j} w^ρ_i  (0 if k_j = 0)

(``i < k_j``: the stage's first ``k_j`` layers; full recompute also repeats their forward tp
collectives and MoE all-to-alls). ``k_j = 0`` and ``k_j = n_j`` are the whole-plan ``none``
and ``ρ`` prices; for identical layers ``B_j`` grows and ``A_j`` falls linearly in ``k_j``,
by ``r^ρ`` and ``a^0 − a^ρ`` per layer. The rank's peak memory then holds ``A_j`` per
microbatch in flight (:func:`rank_memory`).

**Data parallelism** (ZeRO 0–2): one bucket per segment, ready when the last backward of its
chunk has passed it (after that backward and blocking where a multi-stage schedule's runtime
reduces so: :func:`cost_model.step.overlap.dp_reduce_blocks`; fractions of that op's time, in
backward order ``post``, layers last to first, ``pre``), all-reduced (ZeRO-0, and ZeRO-1 without tp, which the runtime runs as DDP +
``ZeroRedundancyOptimizer``) or reduce-scattered (ZeRO-2, ZeRO-1 as FSDP2) over dp. After the
backward: ZeRO-2 all-gathers the updated 16-bit weights, ZeRO-1 without tp broadcasts each
parameter tensor from its owner (one collective per tensor) — under ``pg_overlap``
(Megatron-Core ``--overlap-param-gather``) only what that gather takes beyond the stage's
forward of one microbatch, behind which the next step hides it (:func:`_hidden_gather`); where
DDP runs it broadcasts the stage's buffers before the step's first forward, one blocking
broadcast per dtype (:func:`cost_model.host.host_overhead.ddp_buffer_bytes`); the trainer's loss and
gradient-norm scalars are reduced (:mod:`cost_model.comm.step_scalars`); a weight tied across stages
(embedding and LM head) all-reduces its gradient between them. Under sequence parallelism
the replicated parameters' partial-sum gradients are all-reduced over tp once per step, one
flattened collective per stage (:mod:`cost_model.comm.partial_grads`). The optimizer step reads and
writes ``step_bytes`` per local parameter (``Ψ/N`` under ZeRO ≥ 1) at memory speed; under
offload it runs on the host instead (:mod:`cost_model.memory.offload`: the ``offload`` row; the
``optimizer`` row keeps the per-tensor loop, which the host runs the same, and the fixed
``step_overhead_us``), and ``offload=optimizer+params`` adds
the host↔device copies of each segment's shard to the ZeRO-3 prefetch term.
In a single-stage plan on time-shared cores every blocking collective of the stage adds one
cache refill (:func:`_wait_refill_s`). Only ``comm_overlap`` of each gradient bucket may
overlap the backward, and the step adds the optimizer's per-tensor host loop
(:mod:`cost_model.host.host_overhead`). With ``pp > 1`` each
chunk's forward and backward carry half the pipeline runtime's host work per microbatch and
the stage's step its host work per step (:func:`cost_model.host.host_overhead.pipeline_host_s`).

**ZeRO per pipeline rank** (``zero_stages``): every term above that reads the ZeRO stage —
ZeRO-3's gathers and reduce-scatters, ZeRO-2's reductions per microbatch, the buckets' kind,
FSDP2's and DDP's host work, the optimizer's local parameters, ZeRO-1/2's gather of the
updated weights, whether the reductions block after the backward, and the model states and
ZeRO-3 buffers of the memory — reads the rank's own stage
(:meth:`~fxplan.core.config.ParallelConfig.at_pipeline_rank`). Nothing else of one rank
depends on another rank's stage (the pipeline messages and the scalars' reductions do not read
it) but a weight tied between ranks that keep its gradient in different dp layouts (FSDP2's
shard beside DDP's or ``replicate``'s whole gradient): its sharded holder all-gathers the
gradient over dp before the tied all-reduce (:func:`_tied_sync`). With every entry equal the
prices are the plan-wide ones.

**Offload per pipeline rank** (``offload_stages``) is read the same way: each rank's offload
row (:func:`~cost_model.memory.offload.offload_step_s`), its optimizer row (the host loop only
where it offloads), ZeRO-3's host↔device copies of each segment's shard
(:func:`~cost_model.memory.offload.offload_segment_s`) and its device and host bytes are those
of its own view; the host memory of a node sums the host bytes of the ranks actually on it
(:func:`~cost_model.memory.offload.with_host_check`), a non-offloading rank's being 0.

**Context parallelism** (``cp > 1``, :mod:`cost_model.parallel.context_parallel`): every segment runs
``1/cp`` of each microbatch's tokens (compute, activations, tp collectives and pipeline
messages ÷ ``cp``), a layer with attention holds the gathered ``K, V`` and its all-gather
(forward) and reduce-scatter (backward) over the stage's CP group join the tp row (the
all-gather again under full recompute); gradients, ZeRO and the optimizer are those of
``cp = 1`` over all ``dp`` ranks.

**Expert parallelism** (``ep > 1``, :mod:`cost_model.parallel.expert_parallel`): a mixture of experts'
layer holds ``1/ep`` of its expert parameters; its dispatch and combine all-to-alls over the
stage's EP group join the tp row (2 forward, 2 backward, +2 under full recompute); expert
gradients, ZeRO-1/2's all-gather of updated expert weights and the optimizer's expert share
(ZeRO-3: their per-segment gathers and scatters too) use the ``dp/ep`` expert-data-parallel
group.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np
import torch

from fxplan.cost_model.comm.collectives import collective_time_s
from fxplan.cost_model.compute.op_time import op_time_s
from fxplan.cost_model.parallel.context_parallel import (cp_group, cp_layers, cp_segment, kv_bytes,
                                                layer_exchange)
from fxplan.cost_model.parallel.expert_parallel import (ExpertWork, MoELayer, alltoall_seconds,
                                               ep_groups, ep_segment, expert_share,
                                               expert_work, model_states, moe_layers)
from fxplan.core.config import ParallelConfig
from fxplan.cost_model.comm.partial_grads import partial_grad_params
from fxplan.cost_model.host.host_overhead import (async_batch_s, ddp_buckets, ddp_buffer_bytes,
                                             ddp_host_s, ddp_runs, dtensor_params,
                                             evicted_waits_s, fsdp_params, optimizer_host_s,
                                             overlapped_buckets, pipeline_host_s,
                                             redistribute_host_s, zero3_exposed_s)
from fxplan.cost_model.host.fsdp_host import fsdp_groups, fsdp_host_s
from fxplan.cost_model.step.layer_costs import GraphSegments, SegmentCost, segment_cost
from fxplan.cost_model.memory.breakdown import (ADAM_MIXED, GIB, MemoryBreakdown, MemoryRows,
                                                OptimizerSpec, model_state_bytes)
from fxplan.cost_model.memory.headroom import DEFAULT_HEADROOM, MemoryHeadroom
from fxplan.cost_model.memory.offload import offload_segment_s, offload_step_s, with_host_check
from fxplan.cost_model.memory.runtime import (cuda_context_bytes, fragmentation_bytes,
                                              nccl_bytes)
from fxplan.cost_model.step.pipeline_schedules import InflightCounts, ScheduleOrder
from fxplan.cost_model.step.overlap import dp_reduce_blocks
from fxplan.cost_model.step.simulator import StageCosts
from fxplan.cost_model.comm.step_scalars import step_scalars_s

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster, DeviceGroup
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["StagePlan", "buffer_bytes", "build_stages", "reduced_per_microbatch", "zero1_broadcasts",
           "zero2_reduces_per_microbatch", "rank_memory", "rank_memory_rows", "stage_memory",
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
    expert_params: tuple[float, ...] = ()                      # [s] local expert numel (ep > 1)


def _chunk_keys(segments: GraphSegments, config: ParallelConfig) -> list[list[list[tuple[str, str]]]]:
    """``[s][c]`` → ``(profile key, instance label)`` of the chunk's segments in order; the
    label (``pre``, ``post``, ``L<i>``) names the segment's own copy of its parameters."""
    p, v = config.pp, config.virtual_stages
    counts = config.layers_per_stage(len(segments.layers))
    keys: list[list[list[tuple[str, str]]]] = [[[] for _ in range(v)] for _ in range(p)]
    start = 0
    for j, count in enumerate(counts):
        s, c = config.schedule.placement(j, p)
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


@dataclass(frozen=True)
class _Blocking:
    """How a stage prices a blocking collective: its time (:func:`_collective`) plus, where it
    moves anything, the cache refill its wait costs on time-shared cores (``refill_s``,
    :func:`_wait_refill_s`: 0 without host costs, on every GPU spec)."""

    cluster: Cluster
    refill_s: float = 0.0

    def __call__(self, kind: str, nbytes: float, group: tuple[int, ...]) -> float:
        seconds = _collective(kind, nbytes, group, self.cluster)
        return seconds + self.refill_s if seconds > 0 else seconds


def _wait_refill_s(device: DeviceGroup, config: ParallelConfig) -> float:
    """What each blocking collective of a single-stage plan adds on time-shared cores: one
    refill of the waiting rank's caches (:func:`~cost_model.host.host_overhead.evicted_waits_s`),
    since every rank on the node runs the same step and its core runs another's work
    meanwhile. With ``pp > 1`` the ranks beside it run other stages, busy or idle as the
    schedule has it: only the tensor-parallel waits beside another replica are priced
    (:func:`_replicas_beside`)."""
    return evicted_waits_s(1, device.host, config.pp == 1)


@lru_cache(maxsize=1 << 12)
def _optimizer_s(optimizer: OptimizerSpec, params: float, tensors: int, dtensor: bool,
                 device: DeviceGroup) -> float:
    """Memory-bound optimizer step over ``params`` local parameters in ``tensors`` tensors,
    its host work (:func:`_step_host_s`): ``op_time(12·Ψ FLOPs, 28·Ψ bytes) + t_host``."""
    return (op_time_s("elementwise", optimizer.step_flops * params, optimizer.step_bytes * params,
                      torch.float32, device)
            + _step_host_s(tensors, dtensor, device))


def _step_host_s(tensors: int, dtensor: bool, device: DeviceGroup) -> float:
    """The optimizer's per-tensor host loop (:func:`~cost_model.host.host_overhead.
    optimizer_host_s`) and the training loop's fixed host work per step (``step_overhead_us``):
    ``t_opt_host + step_overhead_us``, 0 without host costs (the GPU specs)."""
    host = device.host
    if not host:
        return 0.0
    return optimizer_host_s(tensors, host, dtensor=dtensor) + host.step_overhead_us * 1e-6


def zero1_broadcasts(config: ParallelConfig) -> bool:
    """ZeRO-1 as the runtime runs it without tensor parallelism: DDP all-reduces the gradients
    and ``ZeroRedundancyOptimizer`` broadcasts every parameter tensor from its owner after
    the step (:mod:`fxplan.runtime.styles.data_parallel`); with ``tp > 1`` or ``ep > 1`` it runs as
    FSDP2."""
    return config.zero_stage == 1 and config.dp > 1 and not dtensor_params(config)


def _price(events: Iterable[tuple[str, float]], group: tuple[int, ...],
           cluster: Cluster) -> float:
    return sum(_collective(kind, nbytes, group, cluster) for kind, nbytes in events)


def _exposed(events: Sequence[tuple[str, float]], gemm_s: Sequence[float],
             group: tuple[int, ...], cluster: Cluster) -> float:
    """Tensor-parallel communication left on the critical path under ``tp_overlap``: each
    collective ``i`` pipelined with its GEMM (``gemm_s[i]``, 0 where it has none) costs
    ``max(0, t_i − g_i)``: chunk ``k`` of the GEMM runs while chunk ``k+1`` is exchanged, so
    the pair takes ``max(t_i, g_i)`` and only communication longer than its GEMM shows."""
    hide = list(gemm_s) + [0.0] * (len(events) - len(gemm_s))
    return sum(max(0.0, _collective(kind, nbytes, group, cluster) - g)
               for (kind, nbytes), g in zip(events, hide))


#: SMs a Transformer Engine userbuffers ``pipeline`` or ``bulk`` communication kernel runs on
#: (``initialize_ub``'s default ``num_sm``: 16 for those methods, 1 for ``ring_exchange``,
#: whose copies run on the copy engines, ``use_ce``); Megatron-Core's ``--tp-comm-overlap``
#: passes no ``ub_cfgs`` of its own, so the defaults hold.
UB_COMM_SMS = 16


def _sm_share(events: Sequence[tuple[str, float]], group: tuple[int, ...], cluster: Cluster,
              sm_count: int) -> float:
    """Seconds the GEMMs beside the SM-holding collectives ``events`` lose:
    ``Σ t_i · n/(N − n)`` with ``n = UB_COMM_SMS`` and ``N = sm_count`` (module docstring);
    0 when the device's SM count is not given (or leaves no SM beside the kernel)."""
    if sm_count <= UB_COMM_SMS or not events:
        return 0.0
    return _price(events, group, cluster) * UB_COMM_SMS / (sm_count - UB_COMM_SMS)


def _expert_work(graph: CapturedGraph, layer: MoELayer | None, config: ParallelConfig,
                 device: DeviceGroup) -> ExpertWork | None:
    """The expert nodes' work as priced and as run (:func:`expert_work`), ``None`` without."""
    if layer is None:
        return None
    return expert_work(graph, layer, tp=config.tp, sequence_parallel=config.sequence_parallel,
                       microbatch=config.microbatch_size, device=device,
                       placements=config.placements)


@dataclass(frozen=True)
class _ModelParts:
    """What every stage of one configuration reads about the model: the MoE layers (``ep >
    1``) and attention layers (``cp > 1``) found in the graph, the expert parameters, the
    microbatch's scale against the capture, the pp group of the loss broadcast and the norm,
    whether FSDP2 shards over dp, the parameters whose gradients come out ``Partial`` under
    sp, the model's buffers ``(name, bytes, dtype)`` and layer paths for DDP's buffer
    broadcasts, and each layer's recompute policy (``policies``)."""

    moe: dict
    attn: dict
    experts: frozenset[str]
    scale: float
    pp_group: tuple[int, ...]
    sharded_dp: bool
    partial: frozenset[str] | set[str]
    buffers: list[tuple[str, float, str]]
    layer_paths: list[str]
    policies: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Stage:
    """One pipeline stage as priced: its first replica's groups (:func:`stage_ranks`,
    :func:`~cost_model.parallel.expert_parallel.ep_groups`), its device group and how it prices a
    blocking collective (:class:`_Blocking`)."""

    index: int
    tp_group: tuple[int, ...]
    dp_group: tuple[int, ...]
    ep_group: tuple[int, ...]
    edp_group: tuple[int, ...]
    device: DeviceGroup
    waited: _Blocking


def _model_parts(graph: CapturedGraph, segments: GraphSegments,
                 config: ParallelConfig) -> _ModelParts:
    """Step 1 of :func:`build_stages`: what every stage reads about the model."""
    moe = moe_layers(graph) if config.ep > 1 else {}     # expert parallelism: expert_parallel.py
    return _ModelParts(
        moe=moe, attn=cp_layers(graph) if config.cp > 1 else {},   # context_parallel.py
        experts=frozenset().union(*(m.expert_params for m in moe.values())),
        scale=config.microbatch_size / segments.batch,
        pp_group=tuple(stage_ranks(config, k)[0][0] for k in range(config.pp)),
        sharded_dp=fsdp_params(config), partial=partial_grad_params(graph, config),
        buffers=[(name, float(b.numel() * b.element_size()), str(b.dtype))
                 for name, b in graph.gm.named_buffers()],
        layer_paths=list(graph.layer_names.values()),
        policies=config.layer_recompute(len(segments.layers)))


def _stage(s: int, cluster: Cluster, config: ParallelConfig) -> _Stage:
    """Step 2: stage ``s``'s groups, device and blocking collectives."""
    tp_group, dp_group = stage_ranks(config, s)
    ep_group, edp_group = ep_groups(dp_group, config.ep)
    device = cluster.device(tp_group[0])
    return _Stage(s, tp_group, dp_group, ep_group, edp_group, device,
                  _Blocking(cluster, _wait_refill_s(device, config)))


def _policy(model: _ModelParts, label: str) -> str:
    """The recompute policy of the segment labelled ``label``: layer ``L<i>``'s
    (:meth:`~fxplan.core.config.ParallelConfig.layer_recompute`), ``none`` for ``pre`` and
    ``post`` (never recomputed)."""
    return model.policies[int(label[1:])] if label.startswith("L") else "none"


def _stage_segments(graph: CapturedGraph, cluster: Cluster, config: ParallelConfig,
                    model: _ModelParts, stage: _Stage,
                    keys: list[list[tuple[str, str]]]) -> tuple[tuple[SegmentCost, ...], ...]:
    """Step 3: each chunk's segments priced on the stage's device (``[c]`` → segments), each
    under its own recompute policy (:func:`_policy`), under expert and context parallelism as
    their own modules adjust them."""
    tp, device = config.tp, stage.device
    return tuple(tuple(cp_segment(ep_segment(
        segment_cost(graph, key, tp=tp, sequence_parallel=config.sequence_parallel,
                     recompute=_policy(model, label), microbatch=config.microbatch_size,
                     device=device, placements=config.placements, cluster=cluster,
                     fp8=config.fp8),
        model.moe.get(key), config.ep, _expert_work(graph, model.moe.get(key), config, device),
        _policy(model, label)), config.cp, kv_bytes(model.attn.get(key), scale=model.scale,
                                                    tp=tp),
        _policy(model, label)) for key, label in chunk) for chunk in keys)


def _chunk_costs(graph: CapturedGraph, cluster: Cluster, config: ParallelConfig,
                 optimizer: OptimizerSpec, model: _ModelParts, stage: _Stage,
                 segs: tuple[SegmentCost, ...], keys: list[tuple[str, str]],
                 stage_params: dict[str, float]
                 ) -> tuple[list[float], list[float], float, tuple[tuple[float, float], ...]]:
    """Step 4, per chunk: ``(forward [compute, tp, zero], backward [same], seconds after the
    step's last backward, gradient buckets)`` — :func:`_chunk_times`, the MoE all-to-alls and
    the CP K/V exchange in the tp row, the CPU host's FSDP2 and pipeline work, the buckets
    (collecting the chunk's parameters into ``stage_params``)."""
    tp, device = config.tp, stage.device
    f_c, b_c = _chunk_times(segs, stage.tp_group, stage.dp_group, cluster, config, optimizer,
                            device, stage.waited, model.experts, stage.edp_group)
    for key, label in keys:
        if key in model.moe:
            a2a = alltoall_seconds(model.moe[key], scale=model.scale,
                                   tp=tp, ep_group=stage.ep_group, cluster=cluster,
                                   recompute_full=_policy(model, label) == "full",
                                   tp_group=stage.tp_group)
            f_c[1], b_c[1] = f_c[1] + a2a[0], b_c[1] + a2a[1]
        if key in model.attn:
            kv = layer_exchange(graph, key, group=cp_group(stage.dp_group, config.cp), tp=tp,
                                sequence_parallel=config.sequence_parallel,
                                microbatch=config.microbatch_size,
                                recompute=_policy(model, label), device=device,
                                cluster=cluster).priced
            f_c[1], b_c[1] = f_c[1] + kv[0], b_c[1] + kv[1]
    labels = [label for _, label in keys]
    post = 0.0
    if model.sharded_dp and device.host:
        # FSDP2's host work per fully_shard group (cost_model.fsdp_host; CPU hosts)
        fsdp = fsdp_host_s(fsdp_groups((label, seg.params) for label, seg in zip(labels, segs)),
                           device.host, zero3=config.zero_stage == 3,
                           every=reduced_per_microbatch(config),
                           gathered=zero2_reduces_per_microbatch(config))
        f_c[2], b_c[2], post = f_c[2] + fsdp.forward, b_c[2] + fsdp.backward, fsdp.post
    if config.pp > 1 and device.host:   # the pipeline runtime's per microbatch
        pipe_f, pipe_b, _ = pipeline_host_s(device.host)
        f_c[0], b_c[0] = f_c[0] + pipe_f, b_c[0] + pipe_b
    buckets = overlapped_buckets(
        _buckets(segs, labels, stage_params, stage.dp_group, cluster, config, optimizer,
                 stage.waited, model.experts, stage.edp_group, stage.tp_group),
        device.comm_overlap)
    return f_c, b_c, post, buckets


def _step_reductions(graph: CapturedGraph, config: ParallelConfig, optimizer: OptimizerSpec,
                     model: _ModelParts, stage: _Stage, keys: list[list[tuple[str, str]]],
                     stage_params: dict[str, float]) -> float:
    """Step 5: the stage's blocking collectives after the step's last backward — the
    trainer's loss and gradient-norm scalars (:mod:`cost_model.comm.step_scalars`), under sp the
    replicated parameters' partial-sum gradients (one flattened all-reduce), and where DDP
    runs its broadcast of the stage's buffers (one per dtype)."""
    waited = stage.waited
    seconds = step_scalars_s(
        config, {"pp": model.pp_group, "dp": stage.dp_group, "tp": stage.tp_group}, waited,
        sharded_dp=model.sharded_dp)
    psi_p = sum(n for k, n in stage_params.items() if k in model.partial)
    if psi_p:
        seconds += waited("all_reduce", optimizer.grad_bytes * psi_p, stage.tp_group)
    if ddp_runs(config):
        stage_layers = [graph.layer_names.get(int(label[1:]), "") for chunk in keys
                        for _, label in chunk if label.startswith("L")]
        seconds += sum(waited("broadcast", nbytes, stage.dp_group)
                       for nbytes in ddp_buffer_bytes(model.buffers, model.layer_paths,
                                                      stage_layers, first=stage.index == 0))
    return seconds


def _optimizer_step(config: ParallelConfig, optimizer: OptimizerSpec, stage: _Stage,
                    stage_params: dict[str, float], local: float) -> float:
    """Step 6: the optimizer row — the step over ``local`` parameters (:func:`_optimizer_s`;
    offloaded, only its host loop: the host's memory traffic is the offload row's), the
    pipeline schedule's and DDP's host work per step (CPU hosts)."""
    device = stage.device
    # ZeRO-1 without FSDP (tp = ep = 1: fsdp_params) steps only the tensors its rank owns
    # (ZeroRedundancyOptimizer).
    owned = config.dp if zero1_broadcasts(config) else 1
    tensors = -(-len(stage_params) // owned)
    seconds = (_optimizer_s(optimizer, local, tensors, dtensor_params(config), device)
               if config.offload == "none" else
               _step_host_s(tensors, dtensor_params(config), device))
    if config.pp > 1 and device.host:   # the pipeline schedule's per step (host_overhead)
        seconds += pipeline_host_s(device.host)[2]
    if ddp_runs(config) and device.host:   # DDP's hooks and bucket copies (host_overhead)
        seconds += ddp_host_s(len(stage_params), device.host)
    return seconds


def _updated_params_gather(config: ParallelConfig, optimizer: OptimizerSpec, stage: _Stage,
                           stage_params: dict[str, float], psi: float, psi_e: float) -> float:
    """Step 7: the updated parameters back to every dp rank (ZeRO-1/2) — as
    ``ZeroRedundancyOptimizer`` does it, each tensor broadcast from its owner, all issued async
    and waited once, or one all-gather (the experts' over their dp/ep replicas)."""
    waited, dp_group = stage.waited, stage.dp_group
    if zero1_broadcasts(config):
        host = stage.device.host
        return async_batch_s(
            [waited("broadcast", optimizer.param_bytes * n, dp_group)
             for n in stage_params.values()],
            # its latency: the same broadcast of one byte (0 bytes is priced 0); the batch is
            # waited once, so one refill
            [waited("broadcast", 1.0, dp_group)] * len(stage_params),
            host.queued_collective_us * 1e-6 if host else 0.0)
    if config.zero_stage in (1, 2):
        return (waited("all_gather", optimizer.param_bytes * (psi - psi_e), dp_group)
                + waited("all_gather", optimizer.param_bytes * psi_e, stage.edp_group))
    return 0.0


def build_stages(graph: CapturedGraph, segments: GraphSegments, cluster: Cluster,
                 config: ParallelConfig,
                 optimizer: OptimizerSpec) -> StagePlan:
    """Per-(stage, chunk) costs (module docstring) for the simulator, in named steps: what
    every stage reads about the model (:func:`_model_parts`); per stage its groups
    (:func:`_stage`), its chunks' segments (:func:`_stage_segments`) and costs
    (:func:`_chunk_costs`), the reductions after its last backward
    (:func:`_step_reductions`), the optimizer row (:func:`_optimizer_step`) and the updated
    parameters' gather (:func:`_updated_params_gather`, hidden behind the next forward under
    ``pg_overlap``); then the pipeline messages, tied weights and offload across stages."""
    p, v = config.pp, config.virtual_stages
    keys = _chunk_keys(segments, config)
    model = _model_parts(graph, segments, config)
    forward, backward = np.zeros((4, p, v)), np.zeros((4, p, v))
    chunks, params, devices, buckets, ep_share = [], [], [], [], []
    post, opt_time, off_time = np.zeros(p), np.zeros(p), np.zeros(p)
    for s in range(p):
        stage = _stage(s, cluster, config)
        devices.append(stage.device)
        row = _stage_segments(graph, cluster, config, model, stage, keys[s])
        # the rank's own ZeRO stage (module docstring, "ZeRO per pipeline rank")
        config_s, model_s = _rank_view(config, model, s)
        chunks.append(row)
        stage_params: dict[str, float] = {}
        stage_buckets = []
        for c, segs in enumerate(row):
            f_c, b_c, after, chunk_buckets = _chunk_costs(graph, cluster, config_s, optimizer,
                                                          model_s, stage, segs, keys[s][c],
                                                          stage_params)
            forward[:3, s, c], backward[:3, s, c] = f_c, b_c
            post[s] += after
            stage_buckets.append(chunk_buckets)
        params.append(stage_params)
        buckets.append(tuple(stage_buckets))
        post[s] += _step_reductions(graph, config_s, optimizer, model_s, stage, keys[s],
                                    stage_params)
        psi = sum(stage_params.values())
        psi_e = expert_share(stage_params, model.moe)
        ep_share.append(psi_e)
        # ZeRO ≥ 1: the others sharded over dp, the experts over their dp/ep replicas
        local = (psi - psi_e) / config.dp + psi_e * config.ep / config.dp \
            if config_s.zero_stage >= 1 else psi
        opt_time[s] = _optimizer_step(config_s, optimizer, stage, stage_params, local)
        gather = _updated_params_gather(config_s, optimizer, stage, stage_params, psi, psi_e)
        post[s] += _hidden_gather(gather, float(forward[:, s].sum()), config_s)
    _p2p(chunks, forward, backward, config, cluster)
    _tied_sync(params, post, config, cluster, optimizer)
    if config.offload != "none":
        for s in range(p):
            off_time[s] = offload_step_s(config.at_pipeline_rank(s), sum(params[s].values()),
                                         float(backward[:, s].sum()), devices[s], optimizer)
    # the weight-gradient GEMMs of each chunk's backward, a split backward's W op
    weight = np.array([[sum(seg.weight_grad_share * seg.backward_s for seg in chunks[s][c])
                        for c in range(v)] for s in range(p)])
    blocking = (dp_reduce_blocks(config) if not config.per_rank else
                tuple(dp_reduce_blocks(config.at_pipeline_rank(s)) for s in range(p)))
    costs = StageCosts(forward, backward, tuple(buckets), post, opt_time,
                       off_time if config.offload != "none" else None, weight, blocking)
    return StagePlan(costs, tuple(chunks), tuple(params), tuple(devices), tuple(ep_share))


def _rank_view(config: ParallelConfig, model: _ModelParts,
               s: int) -> tuple[ParallelConfig, _ModelParts]:
    """Pipeline rank ``s``'s configuration (its own ZeRO stage and offload,
    :meth:`~fxplan.core.config.ParallelConfig.at_pipeline_rank`) and model parts (whether
    FSDP2 shards its parameters over dp); ``(config, model)`` with one of each for all ranks."""
    view = config.at_pipeline_rank(s)
    if view is config:
        return config, model
    return view, replace(model, sharded_dp=fsdp_params(view))


def _replicas_beside(tp_group: tuple[int, ...], dp_group: tuple[int, ...],
                    cluster: Cluster) -> bool:
    """Whether another data-parallel replica of the stage has ranks on the node of its tp
    group (the replicas run side by side there: :func:`~cost_model.host.host_overhead.
    evicted_waits_s`)."""
    node = cluster.node_of(tp_group[0])
    return any(cluster.node_of(rank) == node for rank in dp_group if rank != tp_group[0])


def _chunk_times(segs: tuple[SegmentCost, ...], tp_group: tuple[int, ...],
                 dp_group: tuple[int, ...], cluster: Cluster, config: ParallelConfig,
                 optimizer: OptimizerSpec, device: DeviceGroup, waited: _Blocking,
                 experts: frozenset[str] = frozenset(),
                 edp_group: tuple[int, ...] = ()) -> tuple[list[float], list[float]]:
    """``[compute, tp, zero]`` seconds of one chunk's forward and backward; ZeRO-3's
    exposed gathers and reduce-scatters (ZeRO-2's reduce-scatters with ``m > 1``,
    :func:`zero2_reduces_per_microbatch`) by :func:`~cost_model.host.host_overhead.zero3_exposed_s`
    with the device's ``comm_overlap`` (expert weights over their ``edp_group`` under expert
    parallelism, plus the host↔device copies of each shard under parameter offload), each
    each a blocking collective of the stage (``waited``, :class:`_Blocking`)."""
    f = [0.0, 0.0, 0.0]
    b = [0.0, 0.0, 0.0]
    # a tp wait lets another rank of the step run on the core (host_overhead.evicted_waits_s)
    beside = config.pp == 1 or _replicas_beside(tp_group, dp_group, cluster)
    for seg in segs:
        f[0] += seg.forward_s
        b[0] += seg.backward_s + seg.recompute_s
        if config.tp_comm_overlap:
            f[1] += (_exposed(seg.tp_forward, seg.tp_forward_gemm_s, tp_group, cluster)
                     + _sm_share(seg.tp_sm_forward, tp_group, cluster, device.sm_count))
            b[1] += (_exposed(seg.tp_backward, seg.tp_backward_gemm_s, tp_group, cluster)
                     + _sm_share(seg.tp_sm_backward, tp_group, cluster, device.sm_count))
        else:
            f[1] += _price(seg.tp_forward, tp_group, cluster)
            b[1] += _price(seg.tp_backward, tp_group, cluster)
        if device.host:
            # DTensor's host work per redistribution, and the caches refilled after a wait
            # that let another replica's rank run (host_overhead; CPU hosts only)
            f[1] += (redistribute_host_s(len(seg.tp_forward), device.host)
                     + evicted_waits_s(len(seg.tp_forward), device.host, beside))
            b[1] += (redistribute_host_s(len(seg.tp_backward), device.host)
                     + evicted_waits_s(len(seg.tp_backward), device.host, beside))
    if config.zero_stage == 3 and config.dp > 1 or zero2_reduces_per_microbatch(config):
        gather, scatter = [], []
        regather = config.zero_stage == 3
        for seg in segs:
            psi = seg.param_count
            mine = sum(n for k, n in seg.params.items() if k in experts)
            ag = regather * waited("all_gather", optimizer.param_bytes * (psi - mine), dp_group)
            rs = waited("reduce_scatter", optimizer.grad_bytes * (psi - mine), dp_group)
            if mine:
                ag += regather * waited("all_gather", optimizer.param_bytes * mine, edp_group)
                rs += waited("reduce_scatter", optimizer.grad_bytes * mine, edp_group)
            h2d, d2h = offload_segment_s(config, psi, device)
            gather.append(ag + h2d)
            scatter.append(rs + d2h)
        f[2], b[2] = zero3_exposed_s([seg.forward_s for seg in segs],
                                     [seg.backward_s + seg.recompute_s for seg in segs],
                                     gather, scatter, device.comm_overlap)
    return f, b


def zero2_reduces_per_microbatch(config: ParallelConfig) -> bool:
    """ZeRO-2 with ``m > 1`` microbatches: each backward reduce-scatters the gradients it
    produced (:attr:`~fxplan.core.config.ParallelConfig.reduces_every_microbatch`), so its
    reductions are priced per microbatch as ZeRO-3's are — block by block, each hidden
    behind the next block's backward (:func:`~cost_model.host.host_overhead.zero3_exposed_s`)
    — without ZeRO-3's gathers (the blocks stay gathered from the step's first forward to
    its last backward), and the last backward carries no gradient buckets. With one
    microbatch the one reduction is the last backward's buckets (:func:`_buckets`)."""
    return config.keeps_blocks_gathered and reduced_per_microbatch(config)


def reduced_per_microbatch(config: ParallelConfig) -> bool:
    """The dp gradient reduction runs in every one of ``m > 1`` backwards
    (:attr:`~fxplan.core.config.ParallelConfig.reduces_every_microbatch`)."""
    return config.reduces_every_microbatch and (config.num_microbatches or 1) > 1


def _buckets(segs: tuple[SegmentCost, ...], labels: list[str], stage_params: dict[str, float],
             dp_group: tuple[int, ...], cluster: Cluster, config: ParallelConfig,
             optimizer: OptimizerSpec, waited: _Blocking,
             experts: frozenset[str] = frozenset(),
             edp_group: tuple[int, ...] = (), tp_group: tuple[int, ...] = ()
             ) -> tuple[tuple[float, float], ...]:
    """Gradient buckets of one chunk as ``(fraction of its last backward, seconds)``; also
    collects the chunk's parameters into ``stage_params`` (a layer's under its label, the
    others' — embeddings, head, possibly tied — under their canonical names). Under expert
    parallelism the gradients of ``experts`` are reduced over their ``edp_group`` instead,
    and with ``tp > 1`` summed over ``tp_group`` too (each tp rank's copy saw its share of
    the rows: :mod:`fxplan.runtime.styles.expert_tp`)."""
    total = sum(seg.backward_s + seg.recompute_s for seg in segs) or 1.0
    elapsed, out = 0.0, []
    kind = ("all_reduce" if config.zero_stage == 0 or zero1_broadcasts(config)
            else "reduce_scatter")
    # PyTorch DDP (tp = 1, ZeRO-0 / ZeRO-1) packs the dense gradients into its own buckets.
    ddp_cap = (cluster.device(dp_group[0]).ddp_bucket_mib
               if kind == "all_reduce" and config.tp == 1 and not experts else 0.0)
    dense: list[tuple[float, float]] = []
    for seg, label in zip(reversed(segs), reversed(labels)):
        elapsed += seg.backward_s + seg.recompute_s
        prefix = f"{label}:" if label.startswith("L") else ""
        new = {prefix + k: n for k, n in seg.params.items() if prefix + k not in stage_params}
        stage_params.update(new)
        if config.zero_stage < 3 and config.dp > 1 and new and not zero2_reduces_per_microbatch(config):
            mine = sum(n for k, n in new.items() if k.rpartition(":")[2] in experts)
            dense.append((elapsed / total, optimizer.grad_bytes * (sum(new.values()) - mine)))
            if mine:
                out.append((elapsed / total, waited(kind, optimizer.grad_bytes * mine,
                                                     edp_group)))
            if mine and len(tp_group) > 1:
                out.append((elapsed / total, waited(
                    "all_reduce", optimizer.grad_bytes * mine, tp_group)))
    out += [(f, waited(kind, nbytes, dp_group))
            for f, nbytes in ddp_buckets(dense, ddp_cap)]
    return tuple(sorted(out))


def _p2p(chunks: list, forward: np.ndarray, backward: np.ndarray, config: ParallelConfig,
         cluster: Cluster) -> None:
    """Fill row 3 (blocking sends) of ``forward``/``backward`` (module docstring)."""
    p, v, tp = config.pp, config.virtual_stages, config.tp
    last = p * v - 1
    for j in range(last):
        s, c = config.schedule.placement(j, p)
        s2, c2 = config.schedule.placement(j + 1, p)
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


def _hidden_gather(gather_s: float, forward_s: float, config: ParallelConfig) -> float:
    """What the parameter gather after the optimizer step leaves on the critical path:
    all of it, or under ``pg_overlap`` (Megatron-Core ``--overlap-param-gather``: each bucket
    all-gathered before its module's first forward of the next step) only what exceeds the
    stage's forward of one microbatch, ``max(0, t_gather − t_forward)`` — the gathers stream
    ahead of the first microbatch's forward, which waits on each bucket in turn."""
    if not config.param_gather_overlap:
        return gather_s
    return max(0.0, gather_s - forward_s)


def _tied_sync(params: list[dict[str, float]], post: np.ndarray, config: ParallelConfig,
               cluster: Cluster, optimizer: OptimizerSpec) -> None:
    """All-reduce the gradient of a weight held by several stages among them; where the
    holders' ZeRO stages keep that gradient in different dp layouts (``zero_stages``: FSDP2's
    shard on one rank, the whole gradient on another), each sharded holder also all-gathers
    it over dp first (:class:`fxplan.runtime.apply.tied.TiedGradSync`)."""
    holders: dict[str, list[int]] = {}
    for s, stage_params in enumerate(params):
        for name in stage_params:
            if ":" not in name:  # layers' parameters (``L<i>:name``) live on one stage
                holders.setdefault(name, []).append(s)
    for name, stages in holders.items():
        if len(stages) > 1:
            group = tuple(stage_ranks(config, s)[0][0] for s in stages)
            nbytes = optimizer.grad_bytes * params[stages[0]][name]
            seconds = _collective("all_reduce", nbytes, group, cluster)
            sharded = [fsdp_params(config.at_pipeline_rank(s)) for s in stages]
            for s, shard in zip(stages, sharded):
                post[s] += seconds
                if shard and not all(sharded):
                    post[s] += _collective("all_gather", nbytes, stage_ranks(config, s)[1],
                                           cluster)


def buffer_bytes(max_output_bytes: float | np.ndarray, max_segment_params: float | np.ndarray,
                 *, pp: int, tp: int, dp: int, zero_stage: int, sequence_parallel: bool,
                 optimizer: OptimizerSpec = ADAM_MIXED) -> float | np.ndarray:
    """Transient buffers of one pipeline rank, bytes: ``2·o`` (pipeline send/recv, ``pp > 1``)
    ``+ t·o`` (sequence parallel: a column-parallel input all-gathered) ``+ 2·(k_p + k_g)·ψ``
    (ZeRO-3: gathered weights and gradients of the running and the prefetched segment), with
    ``o`` the largest segment output and ``ψ`` the largest segment's parameters on the rank
    (arrays: one entry per rank, all at ``zero_stage``)."""
    out = 2.0 * max_output_bytes if pp > 1 else 0.0
    if sequence_parallel and tp > 1:
        out = out + max_output_bytes * tp
    if zero_stage == 3 and dp > 1:
        out = out + 2.0 * max_segment_params * (optimizer.param_bytes + optimizer.grad_bytes)
    return out


def rank_memory(order: ScheduleOrder | InflightCounts, **inputs: Any) -> list[MemoryBreakdown]:
    """:func:`rank_memory_rows` (same arguments) as one :class:`MemoryBreakdown` per pipeline
    rank."""
    return rank_memory_rows(order, **inputs).breakdowns()


def _per_rank(value: Any, p: int, name: str) -> list:
    """``value`` for each of ``p`` ranks: one value for all (an int or a str) or a sequence
    of ``p``."""
    if isinstance(value, (int, np.integer, str)):
        return [value] * p
    values = list(value)
    if len(values) != p:
        raise ValueError(f"{name} gives {len(values)} entries for {p} pipeline ranks")
    return values


def rank_memory_rows(order: ScheduleOrder | InflightCounts, *, params: Sequence[float],
                     saved: np.ndarray, working: Sequence[float],
                     max_output_bytes: Sequence[float], max_segment_params: Sequence[float],
                     reserved: Sequence[float], capacity: Sequence[float], tp: int, dp: int,
                     zero_stage: int | Sequence[int], sequence_parallel: bool,
                     optimizer: OptimizerSpec = ADAM_MIXED,
                     offload: str | Sequence[str] = "none",
                     kinds: Sequence[str] | None = None,
                     headroom: Sequence[float] | None = None,
                     contexts: Sequence[float | None] | None = None,
                     expert_params: Sequence[float] = (), ep: int = 1) -> MemoryRows:
    """Peak memory of each pipeline rank ``s`` from its aggregates (the one formula
    :func:`stage_memory` and the planner's search both use), every term an array over the
    ranks:

        states_s  = ZeRO(params[s], dp, zero_s), less what ``offload_s`` keeps on the host;
                    with ``ep > 1``, ZeRO(params[s] − e_s, dp, zero_s) + ZeRO(e_s, dp/ep, zero_s)
                    for the rank's ``e_s = expert_params[s]`` (:mod:`cost_model.parallel.expert_parallel`)
        acts_s    = peak over time of Σ_c n_c(τ)·saved[s, c]   (``order.peak_inflight``)
        working_s = working[s]        (largest recompute working set of a segment on s)
        buffers_s = :func:`buffer_bytes` of the rank's largest output and segment at ``zero_s``
        runtime_s = CUDA context + NCCL buffers + fragmentation·(acts_s + working_s + buffers_s)
                    on a ``gpu`` rank (:mod:`cost_model.memory.runtime`), 0 on a ``cpu`` one

    ``zero_stage`` is one ZeRO stage for every rank or one per rank (``zero_stages``) and
    ``offload`` one offload for every rank or one per rank (``offload_stages``): each rank's
    states and buffers under its own (the ranks sharing a ``(zero_s, offload_s)`` are priced
    together, each entry the float the one-rank formula gives); ``saved[s, c]`` is the saved
    bytes per microbatch of chunk ``c`` of rank ``s``; ``kinds[s]`` the device kind of rank
    ``s`` (``gpu`` when not given), ``headroom[s]`` the bytes it must leave free (0 when not
    given), ``contexts[s]`` its measured CUDA context in GiB (``None``: the default)."""
    p = order.stages
    acts = order.peak_inflight(np.asarray(saved, dtype=float))
    psi = np.asarray(params, dtype=float)
    experts = (np.asarray(expert_params, dtype=float) if ep > 1 and len(expert_params)
               else None)
    biggest = np.asarray(max_segment_params, dtype=float)
    largest_out = np.asarray(max_output_bytes, dtype=float)
    groups: dict[tuple[int, str], list[int]] = {}
    for s, key in enumerate(zip(_per_rank(zero_stage, p, "zero_stage"),
                                _per_rank(offload, p, "offload"))):
        groups.setdefault((int(key[0]), key[1]), []).append(s)
    rows = {name: np.zeros(p) for name in ("params", "grads", "optimizer", "buffers", "host")}
    for (zero, off), ranks in groups.items():
        at = slice(None) if len(groups) == 1 else np.array(ranks)
        states = (model_states(psi[at], experts[at], dp=dp, ep=ep, zero_stage=zero,
                               optimizer=optimizer, offload=off) if experts is not None else
                  model_state_bytes(psi[at], dp, zero, optimizer, off))
        for name in ("params", "grads", "optimizer", "host"):
            rows[name][at] = getattr(states, name)
        rows["buffers"][at] = buffer_bytes(largest_out[at], biggest[at], pp=p, tp=tp, dp=dp,
                                           zero_stage=zero, sequence_parallel=sequence_parallel,
                                           optimizer=optimizer)
    work = np.asarray(working, dtype=float)
    transient = acts + work + rows["buffers"]
    kinds = ["gpu"] * p if kinds is None else list(kinds)
    measured = contexts is not None and any(x is not None for x in contexts)
    rows["cuda_context"] = np.zeros(p)
    rows["nccl"], rows["fragmentation"] = np.zeros(p), np.zeros(p)
    for name in set(kinds):
        # the ranks of each device kind at once (every rank, on one kind of device)
        on = slice(None) if len(set(kinds)) == 1 else np.array([k == name for k in kinds])
        rows["nccl"][on] = nccl_bytes(name, pp=p, dp=dp, tp=tp)
        rows["fragmentation"][on] = fragmentation_bytes(name, transient[on])
        if not measured:
            rows["cuda_context"][on] = cuda_context_bytes(name)
    if measured:
        rows["cuda_context"][:] = [cuda_context_bytes(k, x) for k, x in zip(kinds, contexts)]
    rows.update(activations=acts, recompute_working=work,
                reserved=np.asarray(reserved, dtype=float),
                capacity=np.asarray(capacity, dtype=float),
                headroom=np.zeros(p) if headroom is None else np.asarray(headroom, dtype=float))
    return MemoryRows(rows)


def stage_memory(plan: StagePlan, order: ScheduleOrder, config: ParallelConfig,
                 optimizer: OptimizerSpec, cluster: Cluster | None = None,
                 headroom: MemoryHeadroom = DEFAULT_HEADROOM) -> list[MemoryBreakdown]:
    """Peak memory per stage (:func:`rank_memory`, :mod:`cost_model.memory.breakdown`), each stage on
    its own devices (kind, capacity, reserve, headroom); under offload, with the host memory of
    each stage's fullest node against its capacity (:func:`cost_model.memory.offload.with_host_check`,
    needs ``cluster``)."""
    p, v = config.pp, config.virtual_stages
    saved = np.array([[sum(seg.activations.saved for seg in plan.chunks[s][c]) for c in range(v)]
                      for s in range(p)])
    segs = [[seg for c in range(v) for seg in plan.chunks[s][c]] for s in range(p)]
    memory = rank_memory(
        order, params=[sum(plan.params[s].values()) for s in range(p)], saved=saved,
        working=[max(seg.activations.working for seg in row) for row in segs],
        max_output_bytes=[max(seg.output_bytes for seg in row) for row in segs],
        max_segment_params=[max(seg.param_count for seg in row) for row in segs],
        reserved=[device.reserved_memory_gib * GIB for device in plan.devices],
        capacity=[device.memory_gib * GIB for device in plan.devices],
        tp=config.tp, dp=config.dp, zero_stage=config.rank_zero_stages,
        sequence_parallel=config.sequence_parallel, optimizer=optimizer,
        offload=config.offload if config.offload_stages is None else config.rank_offloads,
        kinds=[device.kind for device in plan.devices],
        headroom=[headroom.bytes(device.memory_gib * GIB) for device in plan.devices],
        contexts=[device.cuda_context_gib for device in plan.devices],
        expert_params=plan.expert_params, ep=config.ep)
    if config.offload == "none" or cluster is None:
        return memory
    return with_host_check(memory, config, cluster)
