"""Peak memory of each pipeline rank: the one formula (:func:`rank_memory_rows`) that the
estimate (:func:`stage_memory`, from a :class:`~cost_model.step.stage_plan.StagePlan`) and the
planner's search both use, its transient buffers (:func:`buffer_bytes`) and the breakdown per
rank (:meth:`~cost_model.memory.breakdown.MemoryRows.breakdowns`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from fxplan.core.config import ParallelConfig
from fxplan.cost_model.memory.breakdown import (ADAM_MIXED, GIB, MemoryBreakdown, MemoryRows,
                                                OptimizerSpec, model_state_bytes)
from fxplan.cost_model.memory.headroom import DEFAULT_HEADROOM, MemoryHeadroom
from fxplan.cost_model.memory.offload import with_host_check
from fxplan.cost_model.memory.runtime import cuda_context_bytes, fragmentation_bytes, nccl_bytes
from fxplan.cost_model.parallel.expert_parallel import model_states

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.cost_model.step.pipeline_schedules import InflightCounts, ScheduleOrder
    from fxplan.cost_model.step.stage_plan import StagePlan

__all__ = ["buffer_bytes", "rank_memory_rows", "stage_memory"]


def buffer_bytes(max_output_bytes: float | np.ndarray, max_segment_params: float | np.ndarray,
                 *, pp: int, tp: int, dp: int, zero_stage: int, sequence_parallel: bool,
                 optimizer: OptimizerSpec = ADAM_MIXED,
                 accumulates: bool = False) -> float | np.ndarray:
    """Transient buffers of one pipeline rank, bytes: ``2·o`` (pipeline send/recv, ``pp > 1``)
    ``+ t·o`` (sequence parallel: a column-parallel input all-gathered) ``+ 2·(k_c + k_g)·ψ``
    (ZeRO-3: weights gathered in the compute dtype and unsharded gradients of the running and
    the prefetched segment), with
    ``o`` the largest segment output and ``ψ`` the largest segment's parameters on the rank
    (arrays: one entry per rank, all at ``zero_stage``). Not the last term where FSDP2's
    reduction waits for the last microbatch in a layout whose parameters are the masters
    (``accumulates``): the model states count every block gathered and every gradient
    unsharded there (:func:`~fxplan.cost_model.memory.breakdown.model_state_bytes`)."""
    out = 2.0 * max_output_bytes if pp > 1 else 0.0
    if sequence_parallel and tp > 1:
        out = out + max_output_bytes * tp
    if zero_stage == 3 and dp > 1 and not (accumulates and optimizer.masters_are_params):
        out = out + 2.0 * max_segment_params * (optimizer.gather_bytes + optimizer.grad_bytes)
    return out


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
                     expert_params: Sequence[float] = (), ep: int = 1,
                     pending: np.ndarray | None = None,
                     accumulates: bool | Sequence[bool] = False) -> MemoryRows:
    """Peak memory of each pipeline rank ``s`` from its aggregates (the one formula
    :func:`stage_memory` and the planner's search both use), every term an array over the
    ranks:

        states_s  = ZeRO(params[s], dp, zero_s), less what ``offload_s`` keeps on the host;
                    with ``ep > 1``, ZeRO(params[s] − e_s, dp, zero_s) + ZeRO(e_s, dp/ep, zero_s)
                    for the rank's ``e_s = expert_params[s]`` (:mod:`cost_model.parallel.expert_parallel`)
        acts_s    = peak over time of Σ_c n_c(τ)·saved[s, c] + n^W_c(τ)·pending[s, c]
                    (``order.peak_held``; ``n^W_c`` the microbatches between a split
                    backward's ``B`` and ``W``, ``pending`` what a recomputed chunk keeps
                    between them beyond ``saved``, its recomputed activations less the
                    checkpointed inputs they include; 0 without either)
        working_s = working[s]        (largest recompute working set of a segment on s)
        buffers_s = :func:`buffer_bytes` of the rank's largest output and segment at ``zero_s``
        runtime_s = CUDA context + NCCL buffers + fragmentation·(acts_s + working_s + buffers_s)
                    on a ``gpu`` rank (:mod:`cost_model.memory.runtime`), 0 on a ``cpu`` one

    ``zero_stage`` is one ZeRO stage for every rank or one per rank (``zero_stages``),
    ``offload`` one offload for every rank or one per rank (``offload_stages``) and
    ``accumulates`` whether FSDP2's reduction waits for the last microbatch, for every rank or
    per rank (:attr:`~fxplan.core.config.ParallelConfig.defers_sharded_reduction`): each rank's
    states and buffers under its own (the ranks sharing a ``(zero_s, offload_s, acc_s)`` are
    priced together, each entry the float the one-rank formula gives); ``saved[s, c]`` is the saved
    bytes per microbatch of chunk ``c`` of rank ``s``; ``kinds[s]`` the device kind of rank
    ``s`` (``gpu`` when not given), ``headroom[s]`` the bytes it must leave free (0 when not
    given), ``contexts[s]`` its measured CUDA context in GiB (``None``: the default)."""
    p = order.stages
    acts = order.peak_held(np.asarray(saved, dtype=float), pending)
    psi = np.asarray(params, dtype=float)
    experts = (np.asarray(expert_params, dtype=float) if ep > 1 and len(expert_params)
               else None)
    biggest = np.asarray(max_segment_params, dtype=float)
    largest_out = np.asarray(max_output_bytes, dtype=float)
    dtensor = tp > 1 or ep > 1
    groups: dict[tuple[int, str, bool], list[int]] = {}
    for s, key in enumerate(zip(_per_rank(zero_stage, p, "zero_stage"),
                                _per_rank(offload, p, "offload"),
                                _per_rank(accumulates, p, "accumulates"))):
        groups.setdefault((int(key[0]), key[1], bool(key[2])), []).append(s)
    rows = {name: np.zeros(p) for name in ("params", "grads", "optimizer", "buffers", "host")}
    for (zero, off, acc), ranks in groups.items():
        at = slice(None) if len(groups) == 1 else np.array(ranks)
        states = (model_states(psi[at], experts[at], dp=dp, ep=ep, zero_stage=zero,
                               optimizer=optimizer, offload=off, dtensor=dtensor,
                               accumulates=acc)
                  if experts is not None else
                  model_state_bytes(psi[at], dp, zero, optimizer, off, dtensor=dtensor,
                                    accumulates=acc))
        for name in ("params", "grads", "optimizer", "host"):
            rows[name][at] = getattr(states, name)
        rows["buffers"][at] = buffer_bytes(largest_out[at], biggest[at], pp=p, tp=tp, dp=dp,
                                           zero_stage=zero, sequence_parallel=sequence_parallel,
                                           optimizer=optimizer, accumulates=acc)
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
    """Peak memory per stage (:func:`rank_memory_rows`, :mod:`cost_model.memory.breakdown`), each stage on
    its own devices (kind, capacity, reserve, headroom); under offload, with the host memory of
    each stage's fullest node against its capacity (:func:`cost_model.memory.offload.with_host_check`,
    needs ``cluster``)."""
    p, v = config.pp, config.virtual_stages
    saved = np.array([[sum(seg.activations.saved for seg in plan.chunks[s][c]) for c in range(v)]
                      for s in range(p)])
    # under a split backward a recomputed segment's recompute is kept from its B to its W
    pending = np.array([[sum(seg.activations.kept for seg in plan.chunks[s][c])
                         for c in range(v)] for s in range(p)])
    segs = [[seg for c in range(v) for seg in plan.chunks[s][c]] for s in range(p)]
    memory = rank_memory_rows(
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
        expert_params=plan.expert_params, ep=config.ep, pending=pending,
        accumulates=config.rank_defers_sharded_reduction).breakdowns()
    if config.offload == "none" or cluster is None:
        return memory
    return with_host_check(memory, config, cluster)
