"""Assemble per-stage costs of one configuration from cached segment profiles (its memory
per rank: :mod:`cost_model.memory.rank_memory`).

**Ranks.** Stage ``s`` is priced on its first data-parallel replica of the ``pp × dp × tp``
mesh (:func:`~cost_model.step.stage_plan.stage_ranks`).

**Chunks.** Virtual stage ``j = c·p + s`` (chunk ``c`` of stage ``s``; in the V of ``zbv``
and ``dualpipev`` ``j = s`` for chunk 0 and ``2p−1−s`` for chunk 1,
:meth:`~fxplan.core.schedule.Schedule.placement`) holds the ``j``-th run of layers
(``ParallelConfig.layers_per_stage``); ``pre`` joins virtual stage 0 and ``post`` the last. Under a
zero-bubble schedule the weight-gradient GEMMs of a chunk's backward (``Σ_seg share_seg·b_seg``,
:class:`~cost_model.step.layer_costs.SegmentCost`'s ``weight_grad_share``) run as their own ``W``
op (``StageCosts.weight``). Per microbatch, chunk ``(s, c)`` costs (seconds):

- compute: forward ``Σ f_seg``; backward ``Σ (b_seg + r_seg)`` (recompute runs first);
- tp: the segments' collectives over the stage's tp group (on the critical path), each with
  DTensor's host work of its redistribution (:func:`cost_model.host.host_overhead.
  redistribute_host_s`, 0 on GPU specs) and, where ranks with work time-share the node's cores (a
  single-stage plan, or other data-parallel replicas beside the stage), the caches its wait lets
  them evict (:func:`cost_model.host.host_overhead.evicted_waits_s`); under ``tp_overlap``
  (Megatron-Core ``--tp-comm-overlap``) each sequence-parallel all-gather or reduce-scatter of a
  linear layer only by what exceeds the GEMM it is pipelined with, ``max(0, t_comm − t_gemm)``
  (:func:`~cost_model.step.stage_collectives.exposed_tp_s`), plus the compute lost to the SMs the
  overlapped communication kernels hold meanwhile: Transformer Engine's userbuffers run each
  ``pipeline``/``bulk`` collective (``SegmentCost.tp_sm_forward``/``tp_sm_backward``) as a kernel on
  ``n = UB_COMM_SMS`` of the device's ``N = sm_count`` SMs for its duration ``t``, so the GEMM
  beside it loses ``n/N`` of its throughput for ``t`` and finishes ``t·n/(N − n)`` later
  (:func:`~cost_model.step.stage_collectives.sm_share_s`; nothing without a spec ``sm_count``);
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
microbatch in flight (:func:`~cost_model.memory.rank_memory.rank_memory`).

**Data parallelism** (ZeRO 0–2): one bucket per segment, ready when the last backward of its chunk
has passed it (after that backward and blocking where a multi-stage schedule's runtime reduces so:
:func:`cost_model.step.overlap.dp_reduce_blocks`; fractions of that op's time, in backward order
``post``, layers last to first, ``pre``), all-reduced (ZeRO-0, and ZeRO-1 without tp, which the
runtime runs as DDP + ``ZeroRedundancyOptimizer``) or reduce-scattered (ZeRO-2, ZeRO-1 as FSDP2)
over dp. After the backward: ZeRO-2 all-gathers the updated 16-bit weights, ZeRO-1 without tp
broadcasts each parameter tensor from its owner (one collective per tensor) — under ``pg_overlap``
(Megatron-Core ``--overlap-param-gather``) only what that gather takes beyond the stage's forward of
one microbatch, behind which the next step hides it
(:func:`~cost_model.step.after_backward.hidden_gather`); where DDP runs it broadcasts the stage's
buffers before the step's first forward, one blocking broadcast per dtype
(:func:`cost_model.host.host_overhead.ddp_buffer_bytes`); the trainer's loss and gradient-norm
scalars are reduced (:mod:`cost_model.comm.step_scalars`); a weight tied across stages (embedding
and LM head) all-reduces its gradient between them. Under sequence parallelism the replicated
parameters' partial-sum gradients are all-reduced over tp once per step, one flattened collective
per stage (:mod:`cost_model.comm.partial_grads`). The optimizer step reads and writes ``step_bytes``
per local parameter (``Ψ/N`` under ZeRO ≥ 1) at memory speed; under offload it runs on the host
instead (:mod:`cost_model.memory.offload`: the ``offload`` row; the ``optimizer`` row keeps the
per-tensor loop, which the host runs the same, and the fixed ``step_overhead_us``), and
``offload=optimizer+params`` adds the host↔device copies of each segment's shard to the ZeRO-3
prefetch term. In a single-stage plan on time-shared cores every blocking collective of the stage
adds one cache refill (:func:`~cost_model.step.stage_collectives.wait_refill_s`). Only
``comm_overlap`` of each gradient bucket may overlap the backward, and the step adds the optimizer's
per-tensor host loop (:mod:`cost_model.host.host_overhead`). With ``pp > 1`` each chunk's forward
and backward carry half the pipeline runtime's host work per microbatch and the stage's step its
host work per step (:func:`cost_model.host.host_overhead.pipeline_host_s`).

**ZeRO per pipeline rank** (``zero_stages``): every term above that reads the ZeRO stage —
ZeRO-3's gathers and reduce-scatters, ZeRO-2's reductions per microbatch, the buckets' kind,
FSDP2's and DDP's host work, the optimizer's local parameters, ZeRO-1/2's gather of the
updated weights, whether the reductions block after the backward, and the model states and
ZeRO-3 buffers of the memory — reads the rank's own stage
(:meth:`~fxplan.core.config.ParallelConfig.at_pipeline_rank`). Nothing else of one rank
depends on another rank's stage (the pipeline messages and the scalars' reductions do not read
it) but a weight tied between ranks that keep its gradient in different dp layouts (FSDP2's
shard beside DDP's or ``replicate``'s whole gradient): its sharded holder all-gathers the
gradient over dp before the tied all-reduce (:func:`~cost_model.step.cross_stage.tied_sync`).
With every entry equal the prices are the plan-wide ones.

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

from typing import TYPE_CHECKING

import numpy as np

from fxplan.core.config import ParallelConfig
from fxplan.cost_model.host.fsdp_host import fsdp_groups, fsdp_host_s
from fxplan.cost_model.host.host_overhead import overlapped_buckets, pipeline_host_s
from fxplan.cost_model.memory.breakdown import OptimizerSpec
from fxplan.cost_model.memory.offload import offload_step_s, updated_params
from fxplan.cost_model.parallel.context_parallel import (cp_group, cp_segment, kv_bytes,
                                                         layer_exchange)
from fxplan.cost_model.parallel.expert_parallel import (ExpertWork, MoELayer, alltoall_seconds,
                                                        ep_segment, expert_share, expert_work)
from fxplan.cost_model.step.after_backward import (hidden_gather, optimizer_row,
                                                   step_reductions, updated_params_gather)
from fxplan.cost_model.step.chunk_times import chunk_times
from fxplan.cost_model.step.cross_stage import p2p_sends, tied_sync
from fxplan.cost_model.step.dp_reductions import (reduced_per_microbatch,
                                                  zero2_reduces_per_microbatch)
from fxplan.cost_model.step.grad_buckets import gradient_buckets
from fxplan.cost_model.step.layer_costs import GraphSegments, SegmentCost, segment_cost
from fxplan.cost_model.step.overlap import dp_reduce_blocks
from fxplan.cost_model.step.simulator import StageCosts
from fxplan.cost_model.step.stage_context import (ModelParts, PricedStage, chunk_keys,
                                                  layer_policy, model_parts, priced_stage,
                                                  rank_view)
from fxplan.cost_model.step.stage_plan import StagePlan

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster, DeviceGroup
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["build_stages"]


def _expert_work(graph: CapturedGraph, layer: MoELayer | None, config: ParallelConfig,
                 device: DeviceGroup) -> ExpertWork | None:
    """The expert nodes' work as priced and as run (:func:`expert_work`), ``None`` without."""
    if layer is None:
        return None
    return expert_work(graph, layer, tp=config.tp, sequence_parallel=config.sequence_parallel,
                       microbatch=config.microbatch_size, device=device,
                       placements=config.placements)


def _stage_segments(graph: CapturedGraph, cluster: Cluster, config: ParallelConfig,
                    model: ModelParts, stage: PricedStage,
                    keys: list[list[tuple[str, str]]]) -> tuple[tuple[SegmentCost, ...], ...]:
    """Step 3: each chunk's segments priced on the stage's device (``[c]`` → segments), each
    under its own recompute policy (:func:`~cost_model.step.stage_context.layer_policy`), under
    expert and context parallelism as their own modules adjust them."""
    tp, device = config.tp, stage.device
    return tuple(tuple(cp_segment(ep_segment(
        segment_cost(graph, key, tp=tp, sequence_parallel=config.sequence_parallel,
                     recompute=layer_policy(model, label), microbatch=config.microbatch_size,
                     device=device, placements=config.placements, cluster=cluster,
                     fp8=config.fp8),
        model.moe.get(key), config.ep, _expert_work(graph, model.moe.get(key), config, device),
        layer_policy(model, label)), config.cp, kv_bytes(model.attn.get(key), scale=model.scale,
                                                         tp=tp),
        layer_policy(model, label)) for key, label in chunk) for chunk in keys)


def _chunk_costs(graph: CapturedGraph, cluster: Cluster, config: ParallelConfig,
                 optimizer: OptimizerSpec, model: ModelParts, stage: PricedStage,
                 segs: tuple[SegmentCost, ...], keys: list[tuple[str, str]],
                 stage_params: dict[str, float]
                 ) -> tuple[list[float], list[float], float, tuple[tuple[float, float], ...]]:
    """Step 4, per chunk: ``(forward [compute, tp, zero], backward [same], seconds after the step's
    last backward, gradient buckets)`` — :func:`~cost_model.step.chunk_times.chunk_times`, the MoE
    all-to-alls and the CP K/V exchange in the tp row, the CPU host's FSDP2 and pipeline work, the
    buckets (collecting the chunk's parameters into ``stage_params``)."""
    tp, device = config.tp, stage.device
    f_c, b_c = chunk_times(segs, stage.tp_group, stage.dp_group, cluster, config, optimizer,
                           device, stage.waited, model.experts, stage.edp_group)
    for key, label in keys:
        if key in model.moe:
            a2a = alltoall_seconds(model.moe[key], scale=model.scale,
                                   tp=tp, ep_group=stage.ep_group, cluster=cluster,
                                   recompute_full=layer_policy(model, label) == "full",
                                   tp_group=stage.tp_group)
            f_c[1], b_c[1] = f_c[1] + a2a[0], b_c[1] + a2a[1]
        if key in model.attn:
            kv = layer_exchange(graph, key, group=cp_group(stage.dp_group, config.cp), tp=tp,
                                sequence_parallel=config.sequence_parallel,
                                microbatch=config.microbatch_size,
                                recompute=layer_policy(model, label), device=device,
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
        gradient_buckets(segs, labels, stage_params, stage.dp_group, cluster, config, optimizer,
                         stage.waited, model.experts, stage.edp_group, stage.tp_group),
        device.comm_overlap)
    return f_c, b_c, post, buckets


def build_stages(graph: CapturedGraph, segments: GraphSegments, cluster: Cluster,
                 config: ParallelConfig,
                 optimizer: OptimizerSpec) -> StagePlan:
    """Per-(stage, chunk) costs (module docstring) for the simulator, in named steps: what every
    stage reads about the model (:func:`~cost_model.step.stage_context.model_parts`); per stage its
    groups (:func:`~cost_model.step.stage_context.priced_stage`), its chunks' segments
    (:func:`_stage_segments`) and costs (:func:`_chunk_costs`), the reductions after its last
    backward (:func:`~cost_model.step.after_backward.step_reductions`), the optimizer row
    (:func:`~cost_model.step.after_backward.optimizer_row`) and the updated parameters' gather
    (:func:`~cost_model.step.after_backward.updated_params_gather`, hidden behind the next forward
    under ``pg_overlap``); then the pipeline messages, tied weights and offload across stages."""
    p, v = config.pp, config.virtual_stages
    keys = chunk_keys(segments, config)
    model = model_parts(graph, segments, config)
    forward, backward = np.zeros((4, p, v)), np.zeros((4, p, v))
    chunks, params, devices, buckets, ep_share = [], [], [], [], []
    post, opt_time, off_time = np.zeros(p), np.zeros(p), np.zeros(p)
    for s in range(p):
        stage = priced_stage(s, cluster, config)
        devices.append(stage.device)
        row = _stage_segments(graph, cluster, config, model, stage, keys[s])
        # the rank's own ZeRO stage (module docstring, "ZeRO per pipeline rank")
        config_s, model_s = rank_view(config, model, s)
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
        post[s] += step_reductions(graph, config_s, optimizer, model_s, stage, keys[s],
                                   stage_params)
        psi = sum(stage_params.values())
        psi_e = expert_share(stage_params, model.moe)
        ep_share.append(psi_e)
        # ZeRO ≥ 1: the others sharded over dp, the experts over their dp/ep replicas
        local = updated_params(config_s, psi, psi_e)
        opt_time[s] = optimizer_row(config_s, optimizer, stage, stage_params, local)
        gather = updated_params_gather(config_s, optimizer, stage, stage_params, psi, psi_e)
        post[s] += hidden_gather(gather, float(forward[:, s].sum()), config_s)
    p2p_sends(chunks, forward, backward, config, cluster)
    tied_sync(params, post, config, cluster, optimizer)
    if config.offload != "none":
        for s in range(p):
            off_time[s] = offload_step_s(config.at_pipeline_rank(s), sum(params[s].values()),
                                         devices[s], expert_params=ep_share[s])
    # the weight-gradient GEMMs of each chunk's backward, a split backward's W op
    weight = np.array([[sum(seg.weight_grad_share * seg.backward_s for seg in chunks[s][c])
                        for c in range(v)] for s in range(p)])
    blocking = (dp_reduce_blocks(config) if not config.per_rank else
                tuple(dp_reduce_blocks(config.at_pipeline_rank(s)) for s in range(p)))
    costs = StageCosts(forward, backward, tuple(buckets), post, opt_time,
                       off_time if config.offload != "none" else None, weight, blocking)
    return StagePlan(costs, tuple(chunks), tuple(params), tuple(devices), tuple(ep_share))
