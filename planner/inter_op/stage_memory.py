"""Peak bytes per pipeline rank of a candidate, from :mod:`cost_model.memory`'s formulas.

Virtual stage ``j = c·p + s`` (chunk ``c`` of pipeline rank ``s``) holds layers ``[k_j, k_{j+1})``;
physical stage ``s`` sums its ``v`` chunks::

    states_s  = ZeRO(Ψ_s, dp, zero)          Ψ_s = Σ_{j on s} Σ_{i ∈ j} ψ_i  (+ ψ_pre on j = 0,
                                              + ψ_post on j = S−1, tied weights once per rank)
    acts_s    = Σ_{j on s} n_{s,c} · (Σ_{i ∈ j} a_i + a_pre[j = 0] + a_post[j = S−1])
    working_s = max_{i on s} w_i             (one layer re-run at a time; 0 without recompute)
    buffers_s = 2·o (pipeline send/recv, pp > 1) + t·o (sequence parallel: a column-parallel
                input all-gathered) + 2·(2 + 2)·max_i ψ_i (ZeRO-3: gathered weights and
                gradients of the running and the prefetched layer)
    total_s   = states_s + acts_s + working_s + buffers_s + reserved ≤ memory_gib

``n_{s,c}`` is the microbatches of chunk ``c`` in flight on stage ``s``: ``min(p−s, m)`` for
1F1B, ``m`` for GPipe and the schedule's own peak for ``interleaved:v``
(:func:`cost_model.pipeline_schedules.schedule_order`).

:func:`partition_inputs` linearises the same sum for the stage-partition DP
(:mod:`planner.inter_op.partition`): per virtual stage the fixed bytes, the in-flight count and
the cap (for ``interleaved:v`` each chunk gets ``1/v`` of the rank's reserve, buffers and cap,
an approximation the exact check above corrects).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from cost_model.memory import GIB, MemoryBreakdown, model_state_bytes
from cost_model.pipeline_schedules import schedule_order
from planner.inter_op.profile import SegmentProfile
from planner.inter_op.space import Candidate

__all__ = ["DeviceMemory", "PartitionInputs", "inflight", "partition_inputs", "stage_memory",
           "stage_totals", "state_bytes_per_param"]


@dataclass(frozen=True)
class DeviceMemory:
    """Capacity and reserve of one device, bytes."""

    capacity: float
    reserved: float

    @classmethod
    def of(cls, device: object) -> "DeviceMemory":
        return cls(float(device.memory_gib) * GIB, float(device.reserved_memory_gib) * GIB)


@lru_cache(maxsize=4096)
def state_bytes_per_param(dp: int, zero: int) -> float:
    """Bytes of weights, gradients and optimizer state per local parameter (``16`` at ZeRO-0)."""
    return model_state_bytes(1.0, dp, zero).total


@lru_cache(maxsize=4096)
def _inflight(kind: str, p: int, v: int, m: int) -> np.ndarray:
    if kind == "interleaved":
        return schedule_order("interleaved", p, v, m).inflight_peak.astype(float)
    if kind == "gpipe":
        return np.full((p, 1), float(m))
    return np.minimum(p - np.arange(p), m).astype(float)[:, None]


def inflight(c: Candidate) -> np.ndarray:
    """``(p, v)`` microbatches of each chunk held in flight on each stage (module docstring)."""
    return _inflight(c.schedule_kind, c.pp, c.v, c.num_microbatches)


def _buffers(c: Candidate, prof: SegmentProfile) -> float:
    out = 2.0 * float(prof.out_bytes.max()) if c.pp > 1 else 0.0
    if c.sequence_parallel and c.tp > 1:
        out += float(prof.out_bytes.max()) * c.tp
    if c.zero_stage == 3 and c.dp > 1:
        out += 2.0 * 4.0 * float(prof.params.max())
    return out


@dataclass(frozen=True)
class PartitionInputs:
    """Per virtual stage: extra time, fixed bytes, in-flight microbatches; layer state bytes."""

    extra_time: np.ndarray
    fixed_bytes: np.ndarray
    inflight: np.ndarray
    layer_state: np.ndarray
    cap: float


def partition_inputs(c: Candidate, prof: SegmentProfile, mem: DeviceMemory) -> PartitionInputs:
    """Inputs of :func:`planner.inter_op.partition.partition_layers` for candidate ``c``."""
    S, v = c.pp * c.v, c.v
    k = state_bytes_per_param(c.dp, c.zero_stage)
    n = inflight(c)
    per_rank = mem.reserved + _buffers(c, prof) + (float(prof.working.max())
                                                  if c.recompute != "none" else 0.0)
    extra = np.zeros(S)
    fixed = np.full(S, per_rank / v)
    counts = np.array([n[j % c.pp, j // c.pp] for j in range(S)])
    extra[0] += prof.pre[0] + prof.pre[1]
    extra[-1] += prof.post[0] + prof.post[1]
    fixed[0] += k * prof.pre[2] + counts[0] * prof.pre[3]
    fixed[-1] += k * (prof.post[2] - (prof.tied_params if S == 1 or c.pp == 1 else 0.0))
    fixed[-1] += counts[-1] * prof.post[3]
    return PartitionInputs(extra, fixed, counts, k * prof.params, mem.capacity / v)


def _stage_arrays(c: Candidate, prof: SegmentProfile) -> tuple[np.ndarray, ...]:
    """Per pipeline rank: local parameters ``Ψ_s``, activations and working bytes."""
    p, S = c.pp, c.pp * c.v
    edges = np.concatenate([[0], np.cumsum(c.stage_layers)]).astype(int)
    P_psi = np.concatenate([[0.0], np.cumsum(prof.params)])
    P_a = np.concatenate([[0.0], np.cumsum(prof.acts)])
    psi = P_psi[edges[1:]] - P_psi[edges[:-1]]
    acts = P_a[edges[1:]] - P_a[edges[:-1]]
    psi[0] += prof.pre[2]
    acts[0] += prof.pre[3]
    psi[-1] += prof.post[2] - (prof.tied_params if p == 1 else 0.0)
    acts[-1] += prof.post[3]
    n = inflight(c)
    j = np.arange(S)
    stage = j % p
    psi_s = np.bincount(stage, weights=psi, minlength=p)
    acts_s = np.bincount(stage, weights=n[stage, j // p] * acts, minlength=p)
    working = np.zeros(p)
    if c.recompute != "none":
        per_chunk = np.maximum.reduceat(prof.working, edges[:-1])
        np.maximum.at(working, stage, per_chunk)
    return psi_s, acts_s, working


def stage_totals(c: Candidate, prof: SegmentProfile, mem: DeviceMemory) -> np.ndarray:
    """``total_s`` of every pipeline rank, bytes (the search's hot path)."""
    psi_s, acts_s, working = _stage_arrays(c, prof)
    k = state_bytes_per_param(c.dp, c.zero_stage)
    return k * psi_s + acts_s + working + _buffers(c, prof) + mem.reserved


def stage_memory(c: Candidate, prof: SegmentProfile, mem: DeviceMemory) -> list[MemoryBreakdown]:
    """Peak bytes of each pipeline rank by kind (module docstring)."""
    psi_s, acts_s, working = _stage_arrays(c, prof)
    buffers = _buffers(c, prof)
    out = []
    for s in range(c.pp):
        states = model_state_bytes(float(psi_s[s]), c.dp, c.zero_stage)
        out.append(MemoryBreakdown(states.params, states.grads, states.optimizer,
                                   float(acts_s[s]), float(working[s]), buffers, mem.reserved,
                                   mem.capacity))
    return out
