"""Peak bytes per pipeline rank of a candidate: the cost model's own formula
(:func:`cost_model.memory.rank_memory.rank_memory_rows`, the one
:func:`cost_model.step.estimate.estimate` reports as ``peak_memory_gib``) fed from the search's
per-layer profile.

Virtual stage ``j = c·p + s`` (chunk ``c`` of pipeline rank ``s``) holds layers ``[k_j, k_{j+1})``,
plus ``pre`` on ``j = 0`` and ``post`` on ``j = S−1``. Per rank ``s``::

    states_s  = ZeRO(Ψ_s, dp, zero)     (less what ``offload`` keeps on the host; with expert
                                         parallelism ZeRO(Ψ_s − Ψ^e_s, dp) + ZeRO(Ψ^e_s, dp/ep)) Ψ_s = Σ_{j on s} Σ_{i ∈ j} ψ_i  (+ ψ_pre, + ψ_post,
                                         tied weights once per rank)
    acts_s    = max over time τ of Σ_c n_{s,c}(τ) · A_{s,c} + n^W_{s,c}(τ) · H_{s,c}
                A_{s,c} = Σ_{i ∈ j} a_i + a_pre[j = 0] + a_post[j = S−1]   (saved bytes, one
                microbatch), n_{s,c}(τ) the microbatches of chunk c forwarded and not yet
                backwarded at τ
                (:meth:`cost_model.step.pipeline_schedules.ScheduleOrder.peak_inflight`);
                under a split backward with recompute, H_{s,c} = Σ_{i ∈ j} h_i (+ the
                ends'), h_i = max(w_i − a_i, 0) what the recompute kept from a microbatch's
                B to its W holds beyond the checkpointed inputs (it includes them), and
                n^W_{s,c}(τ) the microbatches between the two (``peak_held``)
    working_s = max_{segments on s} w         (one segment re-run at a time; 0 without recompute)
    buffers_s = :func:`cost_model.memory.rank_memory.buffer_bytes` of the rank's largest output and
                largest segment (ZeRO-3 gathers)
    runtime_s = CUDA context + NCCL buffers + f·(acts_s + working_s + buffers_s)   (GPU only,
                :mod:`cost_model.memory.runtime`)
    total_s   = states_s + acts_s + working_s + buffers_s + runtime_s + reserved
    fits:       total_s + headroom ≤ memory_gib          (:mod:`cost_model.memory.headroom`)

On a homogeneous cluster and the default layout this *is* the estimate's per-stage peak
memory (tested to 1e-6); the finalists' estimates price each stage on its own devices and with
their placements.

:func:`partition_inputs` linearises the same sum for the stage-partition DP
(:mod:`fxplan.inter_op.partition`): per virtual stage the fixed bytes, the in-flight count
and the cap. It is an approximation, conservative in the activations (each chunk at its own
in-flight peak ``n̂_{s,c} = max_τ n_{s,c}(τ)``, never below the peak of the sum), the buffers
(the model's largest output and segment on every rank) and, for ``interleaved:v``, giving each
chunk ``1/v`` of the rank's reserve, runtime terms, buffers and cap (``C − headroom``); the
activations enter as ``(1 + f)·a_i`` (their fragmentation); the exact check above decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from fxplan.cost_model.memory.breakdown import (ADAM_MIXED, GIB, MemoryBreakdown, MemoryRows,
                                                OptimizerSpec, model_state_bytes)
from fxplan.cost_model.memory.headroom import DEFAULT_HEADROOM, MemoryHeadroom
from fxplan.cost_model.memory.runtime import (cuda_context_bytes, fragmentation_bytes,
                                              nccl_bytes)
from fxplan.cost_model.step.pipeline_schedules import InflightCounts, inflight_counts
from fxplan.cost_model.memory.rank_memory import buffer_bytes, rank_memory_rows
from fxplan.inter_op.profile import SegmentProfile
from fxplan.core.config import ParallelConfig
from fxplan.core.schedule import Schedule

__all__ = ["DeviceMemory", "PartitionInputs", "inflight", "partition_inputs", "per_rank",
           "pending_ratio", "rung_rows", "stage_memory", "stage_rows", "stage_totals",
           "state_bytes_per_param"]


@dataclass(frozen=True)
class DeviceMemory:
    """Capacity, reserve and required headroom of one device, bytes, and its kind."""

    capacity: float
    reserved: float
    headroom: float = 0.0
    kind: str = "gpu"
    context_gib: float | None = None   # measured CUDA context (``cuda_context_gib``)

    @property
    def limit(self) -> float:
        """``capacity − headroom``: the most a rank may hold."""
        return self.capacity - self.headroom

    @classmethod
    def of(cls, device: object, headroom: MemoryHeadroom = DEFAULT_HEADROOM) -> "DeviceMemory":
        capacity = float(device.memory_gib) * GIB
        return cls(capacity, float(device.reserved_memory_gib) * GIB, headroom.bytes(capacity),
                   str(device.kind), getattr(device, "cuda_context_gib", None))

    def limit_text(self) -> str:
        """``"76.0 GiB (80 GiB less 4.0 GiB headroom)"`` — how pruning reasons name the cap."""
        return limit_text(self.capacity, self.headroom)

    def fixed_runtime(self, c: ParallelConfig) -> float:
        """CUDA context and NCCL buffers of a rank of ``c`` (0 on a CPU device)."""
        return (cuda_context_bytes(self.kind, self.context_gib)
                + nccl_bytes(self.kind, pp=c.pp, dp=c.dp, tp=c.tp))


def limit_text(capacity: float, headroom: float) -> str:
    """``capacity − headroom`` in words: ``"76.0 GiB (80 GiB less 4.0 GiB headroom)"``."""
    if not headroom:
        return f"{capacity / GIB:.1f} GiB (no headroom)"
    return (f"{(capacity - headroom) / GIB:.1f} GiB ({capacity / GIB:g} GiB less "
            f"{headroom / GIB:.1f} GiB headroom)")


@lru_cache(maxsize=4096)
def state_bytes_per_param(dp: int, zero: int, offload: str = "none",
                          optimizer: OptimizerSpec = ADAM_MIXED, dtensor: bool = False,
                          accumulates: bool = False) -> float:
    """Device bytes of weights, gradients and optimizer state per local parameter in
    ``optimizer``'s layout (``16`` at ZeRO-0; less what ``offload`` keeps on the host;
    ``dtensor``: tp or ep shard the parameters; ``accumulates``: FSDP2's reduction waits for
    the last microbatch; :func:`~fxplan.cost_model.memory.breakdown.model_state_bytes`)."""
    return model_state_bytes(1.0, dp, zero, optimizer, offload, dtensor=dtensor,
                             accumulates=accumulates).total


def order(c: ParallelConfig) -> InflightCounts:
    """What the memory formula reads of the schedule's op order (cached by
    :func:`~fxplan.cost_model.step.pipeline_schedules.inflight_counts` for every schedule the search
    visits)."""
    return inflight_counts(c.schedule.kind, c.pp, c.virtual_stages, c.num_microbatches)


def inflight(c: ParallelConfig) -> np.ndarray:
    """``(p, v)``: the most microbatches of each chunk held at once on each stage."""
    return order(c).inflight_peak.astype(float)


def _buffers(c: ParallelConfig, max_output: float, max_params: float,
             optimizer: OptimizerSpec) -> float:
    return buffer_bytes(max_output, max_params, pp=c.pp, tp=c.tp, dp=c.dp,
                        zero_stage=c.zero_stage, sequence_parallel=c.sequence_parallel,
                        optimizer=optimizer, accumulates=c.defers_sharded_reduction)


@dataclass(frozen=True)
class PartitionInputs:
    """Per virtual stage: extra time, fixed bytes, in-flight microbatches, capacity less
    headroom; per layer state and saved activation bytes (fragmentation included)."""

    extra_time: np.ndarray
    fixed_bytes: np.ndarray
    inflight: np.ndarray
    layer_state: np.ndarray
    cap: np.ndarray
    layer_acts: np.ndarray


def per_rank(mem: DeviceMemory | Sequence[DeviceMemory], pp: int) -> tuple[DeviceMemory, ...]:
    """``mem`` for each of ``pp`` pipeline ranks (one value: the same device on all)."""
    return (mem,) * pp if isinstance(mem, DeviceMemory) else tuple(mem)


def partition_inputs(c: ParallelConfig, prof: SegmentProfile,
                     mem: DeviceMemory | Sequence[DeviceMemory],
                     ends: tuple[SegmentProfile, SegmentProfile] | None = None) -> PartitionInputs:
    """Inputs of :func:`fxplan.inter_op.partition.partition_layers` for candidate ``c``
    (the conservative linearisation of the module docstring). ``mem``: one device, or one per
    pipeline rank (heterogeneous clusters); ``ends``: the profiles whose ``pre``/``post``
    times the first/last stage pays (default ``prof``'s: the first/last stage's device)."""
    S, v = c.pp * c.virtual_stages, c.virtual_stages
    dtensor, deferred = c.tp > 1 or c.ep > 1, c.defers_sharded_reduction
    k = state_bytes_per_param(c.dp, c.zero_stage, c.offload, prof.optimizer, dtensor, deferred)
    n = inflight(c)
    mems = per_rank(mem, c.pp)
    first, last = ends or (prof, prof)
    def most(values: np.ndarray) -> float:  # a model without repeated layers has none
        return float(values.max()) if values.size else 0.0

    max_output = max(most(prof.out_bytes), *prof.end_out_bytes)
    max_params = max(most(prof.params), prof.pre[2], prof.post[2])
    working = max(most(prof.working), *prof.end_working)
    transient = _buffers(c, max_output, max_params, prof.optimizer) + working

    def fixed_of(m: DeviceMemory) -> float:
        return (m.reserved + transient + m.fixed_runtime(c)
                + fragmentation_bytes(m.kind, transient))

    grow = 1.0 + fragmentation_bytes(mems[0].kind, 1.0)
    extra = np.zeros(S)
    if isinstance(mem, DeviceMemory):   # one kind of device (the search's hot path)
        fixed, cap = np.full(S, fixed_of(mem) / v), np.full(S, mem.limit / v)
    else:
        rank = _layout(c.schedule, c.pp)[0].tolist()
        fixed = np.array([fixed_of(mems[s]) / v for s in rank])
        cap = np.array([mems[s].limit / v for s in rank])
    counts = n[_layout(c.schedule, c.pp)[:2]]
    rho = pending_ratio(c)
    extra[0] += first.pre[0] + first.pre[1]
    extra[-1] += last.post[0] + last.post[1]
    fixed[0] += k * prof.pre[2] + counts[0] * (prof.pre[3] + rho * prof.end_kept[0]) * grow
    # a weight tied between the first and last stage is held once where one rank holds both
    shared = S == 1 or c.pp == 1 or c.schedule.v_shape
    fixed[-1] += k * (prof.post[2] - (prof.tied_params if shared else 0.0))
    fixed[-1] += counts[-1] * (prof.post[3] + rho * prof.end_kept[1]) * grow
    layer_state = k * prof.params
    if prof.expert_params is not None:   # experts: ZeRO over their dp/ep replicas
        k_e = state_bytes_per_param(c.dp // c.ep, c.zero_stage, c.offload, prof.optimizer,
                                    dtensor, deferred)
        layer_state = layer_state + (k_e - k) * prof.expert_params
    acts = prof.acts + rho * prof.kept if rho else prof.acts
    return PartitionInputs(extra, fixed, counts, layer_state, cap, acts * grow)


def _keeps_recompute(c: ParallelConfig) -> bool:
    """Recomputed layers under a split backward: their recompute is kept from ``B`` to ``W``."""
    return c.splits_backward and c.recompute != "none"


def pending_ratio(c: ParallelConfig) -> float:
    """``ρ = max_{s,c} n̂^W_{s,c} / n̂_{s,c}``: under a split backward with recompute, the
    partition counts a recomputed layer as ``a_i + ρ·h_i`` at the in-flight peak ``n̂``,
    at least ``n_c(τ)·a_i + n^W_c(τ)·h_i`` at every ``τ`` (its recompute, ``h_i`` beyond its
    inputs, :attr:`~fxplan.inter_op.profile.SegmentProfile.kept`, is kept from its ``B`` to
    its ``W``: :meth:`~fxplan.cost_model.step.pipeline_schedules.InflightCounts.peak_held`);
    0 without a split backward or without recompute."""
    if not _keeps_recompute(c):
        return 0.0
    counts = order(c)
    if counts.pending_peak is None:
        return 0.0
    return float((counts.pending_peak / np.maximum(counts.inflight_peak, 1)).max())


@lru_cache(maxsize=1024)
def _layout(schedule: Schedule, pp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where the virtual stages of ``schedule`` on ``pp`` ranks sit: the rank and the chunk
    of each virtual stage ``j`` (:meth:`~fxplan.core.schedule.Schedule.placement`), and
    ``(v, p)`` the virtual stage of chunk ``k`` on rank ``s``
    (:meth:`~fxplan.core.schedule.Schedule.virtual_stage`); cached, the search reads them for
    every candidate."""
    v = schedule.chunks
    rank, chunk = np.array([schedule.placement(j, pp) for j in range(pp * v)]).T
    at = np.array([[schedule.virtual_stage(s, k, pp) for s in range(pp)] for k in range(v)])
    for array in (rank, chunk, at):
        array.setflags(write=False)
    return rank, chunk, at


def _rank_inputs(c: ParallelConfig, prof: SegmentProfile) -> dict[str, object]:
    """Per pipeline rank aggregates of :func:`cost_model.memory.rank_memory.rank_memory_rows`
    (with the profile's model-state layout, ``optimizer``)."""
    p, v = c.pp, c.virtual_stages
    edges = np.concatenate([[0], np.cumsum(c.stage_layers)]).astype(int)
    starts = edges[:-1]
    P_psi, P_a, P_e = prof.prefix
    psi = P_psi[edges[1:]] - P_psi[edges[:-1]]
    saved = P_a[edges[1:]] - P_a[edges[:-1]]
    def stage_max(values: np.ndarray) -> np.ndarray:  # 0 for a model without layers
        return np.maximum.reduceat(values, starts) if values.size else np.zeros(len(starts))

    out = stage_max(prof.out_bytes)
    big = stage_max(prof.params)
    work = stage_max(prof.working)
    psi[0] += prof.pre[2]
    saved[0] += prof.pre[3]
    out[0], big[0], work[0] = (max(out[0], prof.end_out_bytes[0]), max(big[0], prof.pre[2]),
                               max(work[0], prof.end_working[0]))
    psi[-1] += prof.post[2] - (prof.tied_params if p == 1 or c.schedule.v_shape else 0.0)
    saved[-1] += prof.post[3]
    out[-1], big[-1], work[-1] = (max(out[-1], prof.end_out_bytes[1]),
                                  max(big[-1], prof.post[2]),
                                  max(work[-1], prof.end_working[1]))
    experts = np.zeros(len(psi)) if P_e is None else np.diff(P_e[edges])
    # virtual stage j (c·p + s, or the V of zbv) → [c, s]
    at = _layout(c.schedule, p)[2]
    pending = None
    if _keeps_recompute(c):
        held = np.diff(prof.kept_prefix[edges])
        held[0] += prof.end_kept[0]
        held[-1] += prof.end_kept[1]
        pending = held[at].T
    return dict(params=psi[at].sum(axis=0), saved=saved[at].T, pending=pending,
                optimizer=prof.optimizer,
                expert_params=experts[at].sum(axis=0),
                working=work[at].max(axis=0),
                max_output_bytes=out[at].max(axis=0),
                max_segment_params=big[at].max(axis=0))


def stage_memory(c: ParallelConfig, prof: SegmentProfile,
                 mem: DeviceMemory | Sequence[DeviceMemory]) -> list[MemoryBreakdown]:
    """Peak bytes of each pipeline rank by kind (module docstring), each rank's states under
    its own ZeRO stage and offload (``zero_stages``, ``offload_stages``); ``mem`` one device or
    one per pipeline rank."""
    return stage_rows(c, prof, mem).breakdowns()


def stage_rows(c: ParallelConfig, prof: SegmentProfile,
               mem: DeviceMemory | Sequence[DeviceMemory]) -> MemoryRows:
    """:func:`~fxplan.cost_model.memory.rank_memory.rank_memory_rows` of ``c`` (each rank's
    terms as arrays over the ranks, its host bytes as ``rows["host"]``)."""
    return _rows_of(c, _rank_inputs(c, prof), per_rank(mem, c.pp))


def rung_rows(c: ParallelConfig, rungs: Sequence[tuple[int, str]], prof: SegmentProfile,
              mem: DeviceMemory | Sequence[DeviceMemory]) -> list[MemoryRows]:
    """:func:`stage_rows` of ``c`` at each rung ``(zero, offload)`` on every rank: the split's
    aggregates (:func:`_rank_inputs`, read by no rung) taken once."""
    inputs, mems = _rank_inputs(c, prof), per_rank(mem, c.pp)
    return [_rows_of(c.uniform(z, o), inputs, mems) for z, o in rungs]


def _rows_of(c: ParallelConfig, inputs: dict[str, object],
             mems: tuple[DeviceMemory, ...]) -> MemoryRows:
    return rank_memory_rows(order(c), **inputs,
                            reserved=[m.reserved for m in mems],
                            capacity=[m.capacity for m in mems], tp=c.tp, dp=c.dp,
                            zero_stage=c.rank_zero_stages,
                            sequence_parallel=c.sequence_parallel,
                            offload=c.offload if c.offload_stages is None else c.rank_offloads,
                            kinds=[m.kind for m in mems],
                            headroom=[m.headroom for m in mems], ep=c.ep,
                            contexts=[m.context_gib for m in mems],
                            accumulates=c.rank_defers_sharded_reduction)


def stage_totals(c: ParallelConfig, prof: SegmentProfile,
                 mem: DeviceMemory | Sequence[DeviceMemory]) -> np.ndarray:
    """``total_s`` of every pipeline rank, bytes (the search's hot path: read off the rows,
    no breakdown built per rank)."""
    return stage_rows(c, prof, mem).total
