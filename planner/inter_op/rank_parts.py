"""Each pipeline rank's terms of the closed form ``T̂`` of one configuration (the math is
:mod:`fxplan.inter_op.surrogate`'s docstring): per rank ``s`` its work per microbatch ``w_s``
(the layers' compute, the pipeline sends ``p2p_j`` and ZeRO-3's exposed traffic ``z_j`` of its
chunks), its once-per-step ``exposed_s + post_s``, its step ``β_s`` of the pipeline's drain,
and what its optimizer step ``opt_s`` reads
— its parameters ``Ψ_s``, its experts' ``Ψ^e_s`` and the memory bandwidth
(:class:`RankParts`, made by :func:`rank_parts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from fxplan.core.config import ParallelConfig
from fxplan.core.zero_bubble_dp import reduces_after_step
from fxplan.cost_model.host.host_overhead import ddp_buckets
from fxplan.cost_model.memory.breakdown import OptimizerSpec
from fxplan.cost_model.memory.offload import offload_segment_s, offload_step_s, updated_params
from fxplan.cost_model.step.cross_stage import boundary_send_s
from fxplan.cost_model.step.dp_reductions import zero1_broadcasts, zero2_reduces_per_microbatch
from fxplan.cost_model.step.stage_collectives import collective_s
from fxplan.inter_op.profile import SegmentProfile

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster

__all__ = ["RankParts", "rank_parts", "spans"]


def bytes_per_param(kind: str, optimizer: OptimizerSpec) -> float:
    """Bytes per parameter a data-parallel ``kind`` moves in ``optimizer``'s layout: the
    gradients' reductions ``k_g``, the ZeRO gathers ``k_c`` (the compute dtype), the broadcasts
    of updated parameters ``k_p`` (:class:`~fxplan.cost_model.memory.breakdown.OptimizerSpec`)."""
    if kind == "all_gather":
        return optimizer.gather_bytes
    return optimizer.param_bytes if kind == "broadcast" else optimizer.grad_bytes


def _per_layer(kind: str, params: np.ndarray, ranks: tuple[int, ...],
               cluster: Cluster, optimizer: OptimizerSpec) -> np.ndarray:
    """``kind`` over ``ranks`` of ``k·ψ_i`` bytes for each layer (``k``:
    :func:`bytes_per_param`; priced once per distinct ψ)."""
    k = bytes_per_param(kind, optimizer)
    values, inverse = np.unique(params, return_inverse=True)
    return np.array([collective_s(kind, k * float(x), ranks, cluster) for x in values])[inverse]


def _experts(prof: SegmentProfile) -> np.ndarray:
    """``ψ^e_i``: each layer's local expert parameters (zero without expert parallelism)."""
    return prof.expert_params if prof.expert_params is not None else np.zeros_like(prof.params)


def _split_per_layer(kind: str, prof: SegmentProfile, dp_ranks: tuple[int, ...],
                     cluster: Cluster) -> np.ndarray:
    """``kind`` of each layer's ``k·ψ_i`` bytes as the runtime syncs them: the experts'
    ``ψ^e_i`` over their expert-data-parallel group (every ``ep``-th dp rank,
    :func:`~cost_model.parallel.expert_parallel.ep_groups`), the rest over all dp ranks."""
    experts = _experts(prof)
    out = _per_layer(kind, prof.params - experts, dp_ranks, cluster, prof.optimizer)
    if experts.any():
        out = out + _per_layer(kind, experts, dp_ranks[::prof.ep], cluster, prof.optimizer)
    return out


def spans(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """``Σ_{i ∈ j} values_i`` for every virtual stage ``j`` (``edges``: its layer bounds)."""
    P = np.concatenate([[0.0], np.cumsum(values)])
    return P[edges[1:]] - P[edges[:-1]]


def _zero3_exposed(c: ParallelConfig, prof: SegmentProfile, edges: np.ndarray,
                   dp_ranks: tuple[int, ...], cluster: Cluster) -> np.ndarray:
    """``z_j`` of every virtual stage (module docstring), seconds per microbatch (priced with
    rank 0's profile on a heterogeneous cluster): ZeRO-3's exposed gathers and
    reduce-scatters of the chunk's segments ``pre?, layers, post?`` as
    :func:`cost_model.host.host_overhead.zero3_exposed_s` prices them — each gather prefetched
    behind the previous segment's compute, the chunk's first gather and its backward's first
    gather and last reduce-scatter exposed — with every segment's terms at once."""
    S, L = len(edges) - 1, len(prof.params)

    def segments(kind: str) -> np.ndarray:   # pre, the layers, post
        k = bytes_per_param(kind, prof.optimizer)
        pre, post = (collective_s(kind, k * float(x), dp_ranks, cluster)
                     for x in (prof.pre[2], prof.post[2]))
        return np.concatenate([[pre], _split_per_layer(kind, prof, dp_ranks, cluster), [post]])

    rs = segments("reduce_scatter")
    # ZeRO-2 reducing in every backward keeps its blocks gathered: no gathers
    ag = segments("all_gather") if c.zero_stage == 3 else np.zeros_like(rs)
    if c.offload == "optimizer+params":
        psi = np.concatenate([[prof.pre[2]], prof.params, [prof.post[2]]])
        psi_e = np.concatenate([[0.0], _experts(prof), [0.0]])
        copy = np.array([offload_segment_s(c, float(x), cluster.device(0), expert_params=float(e))[0]
                         for x, e in zip(psi, psi_e)])
        ag, rs = ag + copy, rs + copy
    f = np.concatenate([[prof.pre[0]], prof.fwd, [prof.post[0]]])
    b = np.concatenate([[prof.pre[1]], prof.bwd, [prof.post[1]]])
    # segment i of L + 2 (pre, layers, post); chunk j runs segments starts[j] … lasts[j]
    starts = np.concatenate([[0], edges[1:-1] + 1]).astype(int)
    lasts = np.concatenate([edges[1:-1], [L + 1]]).astype(int)
    chunk = np.repeat(np.arange(S), lasts - starts + 1)
    first = np.zeros(L + 2, dtype=bool)
    first[starts] = True
    last = np.zeros(L + 2, dtype=bool)
    last[lasts] = True
    omega = np.array([cluster.device((j % c.pp) * c.dp * c.tp).comm_overlap
                      for j in range(S)])[chunk]
    prev_f = np.concatenate([[0.0], f[:-1]])
    fwd = np.where(first, ag, (1 - omega) * ag + np.maximum(0.0, omega * ag - prev_f))
    hidden = (np.where(first, 0.0, np.concatenate([[0.0], ag[:-1]]))
              + np.where(last, 0.0, np.concatenate([rs[1:], [0.0]])))
    bwd = (1 - omega) * hidden + np.maximum(0.0, omega * hidden - b)
    return np.add.reduceat(fwd + bwd, starts) + ag[lasts] + rs[starts]


def _broadcasts(c: ParallelConfig, prof: SegmentProfile, edges: np.ndarray, stage: np.ndarray,
                psi_s: np.ndarray, dp_ranks: tuple[int, ...], cluster: Cluster) -> np.ndarray:
    """ZeRO-1 without DTensor parameters (:func:`cost_model.step.dp_reductions.zero1_broadcasts`):
    ``ZeroRedundancyOptimizer`` broadcasts each of the stage's ``n_s`` parameter tensors from
    its owner, issued async and waited once (``async_batch_s``). For an affine collective
    time ``t(x) = λ + x/β`` the batch costs ``Σ_i t(k_p·ψ_i) = t(k_p·Ψ_s) + (n_s − 1)·λ``, or
    with a host that queues each further collective at ``q`` seconds,
    ``t(k_p·Ψ_s) + (n_s − 1)·q``; ``λ`` is the broadcast of one byte."""
    n = np.bincount(stage, weights=spans(prof.tensors, edges), minlength=c.pp)
    pre, post, tied = prof.end_tensors
    n[0] += pre
    n[stage[-1]] += post - (tied if c.pp == 1 else 0)
    out = np.zeros(c.pp)
    for s in range(c.pp):
        device = cluster.device(s * c.dp * c.tp)
        each = (device.host.queued_collective_us * 1e-6 if device.host
                and device.host.queued_collective_us > 0
                else collective_s("broadcast", 1.0, dp_ranks, cluster))
        nbytes = prof.optimizer.param_bytes * float(psi_s[s])
        out[s] = collective_s("broadcast", nbytes, dp_ranks, cluster) \
            + max(0.0, n[s] - 1) * each
    return out


def _queue_tails(c: ParallelConfig, prof: SegmentProfile,
                 stage_profs: Sequence[SegmentProfile] | None, edges: np.ndarray,
                 per_layer: np.ndarray, ends: np.ndarray, overlap: np.ndarray) -> np.ndarray:
    """``exposed_s`` of each rank's per-segment reductions as one stream serves them, first
    come first served, behind its last backward (the simulator's queue): with the rank's
    segments in backward order, ``d_k`` the reduction of segment ``k`` (ready when its
    backward ends) and ``b_k`` its backward (``1/v`` of it per chunk, as ``b_s``),

        exposed_s = max(0, max_k (Σ_{j ≥ k} d_j − ω_s·Σ_{j > k} b_j))

    whose ``k = 0`` term is the aggregate ``Σ d − ω·b_s`` and whose last is the last
    reduction, left with no backward to hide behind (the first stage's embedding)."""
    p, v = c.pp, c.virtual_stages
    L = len(per_layer)
    # chunk j's segments among [pre, layers, post]: [first_j, stop_j)
    first = np.concatenate([[0], edges[1:-1] + 1]).astype(int)
    stop = np.concatenate([edges[1:-1] + 1, [L + 2]]).astype(int)

    def backs(own: SegmentProfile) -> np.ndarray:
        return np.concatenate([[own.pre[1]], own.bwd + own.tp_bwd, [own.post[1]]]) / v

    # each rank's segments in forward order (chunk j = rank j when v = 1)
    chunks = [[c.schedule.virtual_stage(s, k, p) for k in range(v)] for s in range(p)]
    spans_of = [np.concatenate([np.arange(first[j], stop[j]) for j in row]) for row in chunks]
    d = np.concatenate([ends[:1], per_layer, ends[1:]])
    b = backs(prof) if stage_profs is None else None
    sizes = np.array([len(x) for x in spans_of])
    x = np.concatenate([d[i] for i in spans_of])
    y = np.concatenate([(b if b is not None else backs(stage_profs[s]))[i]
                        for s, i in enumerate(spans_of)])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    cd, cb = np.cumsum(x), np.cumsum(y) - y          # Σ_{j ≤ i} d_j, Σ_{j < i} b_j
    live = sizes > 0
    base_d = np.repeat((cd - x)[starts[live]], sizes[live])
    base_b = np.repeat(cb[starts[live]], sizes[live])
    value = (cd - base_d) - np.repeat(overlap[live], sizes[live]) * (cb - base_b)
    out = np.zeros(p)
    if value.size:
        out[live] = np.maximum.reduceat(value, starts[live])
    return np.maximum(out, 0.0)


@dataclass(frozen=True)
class RankParts:
    """Per pipeline rank: ``w_s``, ``exposed_s + post_s`` (``rest``), ``β_s`` (``drain``: the
    backward of its first chunk and its send to the rank before, one microbatch's), and what
    ``opt_s`` reads — the rank's parameters ``Ψ_s``, its experts' ``Ψ^e_s``, the memory
    bandwidth and the optimizer's bytes per parameter stepped (``step_bytes``)."""

    w: np.ndarray
    rest: np.ndarray
    drain: np.ndarray
    psi_s: np.ndarray
    experts_s: np.ndarray
    bandwidth: np.ndarray | float
    step_bytes: float

    def optimizer_s(self, c: ParallelConfig, cluster: Cluster) -> np.ndarray:
        """``opt_s`` of every rank under ``c``'s ZeRO stage and offload (module docstring)."""
        psi_s, experts_s, bandwidth = self.psi_s, self.experts_s, self.bandwidth
        if c.offload == "none":   # the experts' states over their dp/ep replicas
            return self.step_bytes * updated_params(c, psi_s, experts_s) / bandwidth
        return np.array([offload_step_s(c, float(psi_s[s]), cluster.device(s * c.dp * c.tp),
                                        expert_params=float(experts_s[s]))
                         for s in range(c.pp)])


def rank_parts(c: ParallelConfig, prof: SegmentProfile, cluster: Cluster,
           stage_profs: Sequence[SegmentProfile] | None) -> tuple:
    """The fields of :class:`RankParts` (module docstring)."""
    p, v, S = c.pp, c.virtual_stages, c.pp * c.virtual_stages
    edges = np.concatenate([[0], np.cumsum(c.stage_layers)]).astype(int)
    dp_ranks = tuple(range(0, c.dp * c.tp, c.tp))
    stage = np.arange(S) % p
    P_psi = np.concatenate([[0.0], np.cumsum(prof.params)])
    psi = P_psi[edges[1:]] - P_psi[edges[:-1]]
    if stage_profs is None:
        first = last = prof
        u = spans(prof.layer_time, edges)
        back = spans(prof.bwd + prof.tp_bwd, edges)
    else:
        first, last = stage_profs[0], stage_profs[stage[-1]]
        u = np.array([spans(stage_profs[s].layer_time, edges)[j] for j, s in enumerate(stage)])
        back = np.array([spans(stage_profs[s].bwd + stage_profs[s].tp_bwd, edges)[j]
                         for j, s in enumerate(stage)])
    u[0] += first.pre[0] + first.pre[1]
    u[-1] += last.post[0] + last.post[1]
    back[0] += first.pre[1]
    back[-1] += last.post[1]
    psi[0] += prof.pre[2]
    psi[-1] += prof.post[2] - (prof.tied_params if p == 1 else 0.0)
    drain = back[:p].copy()
    if p > 1:
        rank = [c.schedule.placement(j, p)[0] for j in range(S)]
        sends = [boundary_send_s(c, float(x), rank[j], rank[j + 1], cluster)
                 if rank[j] != rank[j + 1] else 0.0   # the turn of a V
                 for j, x in enumerate(prof.out_bytes[edges[1:-1] - 1])]
        u[:-1] += sends
        u[1:] += sends
        drain[1:] += sends[:p - 1]
    per_microbatch = zero2_reduces_per_microbatch(c)
    if c.zero_stage == 3 and c.dp > 1 or per_microbatch:
        u += _zero3_exposed(c, prof, edges, dp_ranks, cluster)
    w = np.bincount(stage, weights=u, minlength=p)
    b_s = np.bincount(stage, weights=back, minlength=p) / v
    psi_s = np.bincount(stage, weights=psi, minlength=p)
    experts = _experts(prof)
    experts_s = np.bincount(stage, weights=spans(experts, edges), minlength=p)
    exposed = np.zeros(p)
    if c.dp > 1 and c.zero_stage < 3 and not per_microbatch:
        kind = "all_reduce" if c.zero_stage == 0 else "reduce_scatter"
        per_layer = _split_per_layer(kind, prof, dp_ranks, cluster)
        if experts.any() and c.tp > 1:   # each tp rank's expert copy saw its share of rows
            per_layer = per_layer + _per_layer("all_reduce", experts, tuple(range(c.tp)),
                                               cluster, prof.optimizer)
        layer_sync = np.concatenate([[0.0], np.cumsum(per_layer)])
        sync = np.bincount(stage, weights=layer_sync[edges[1:]] - layer_sync[edges[:-1]],
                           minlength=p)
        ends = _per_layer(kind, np.array([prof.pre[2], prof.post[2]]), dp_ranks, cluster,
                          prof.optimizer)
        sync[0] += ends[0]
        sync[stage[-1]] += ends[1]
        cap = cluster.device(0).ddp_bucket_mib
        ddp = cap > 0 and c.tp == 1 and c.zero_stage <= 1 and not experts.any()
        if ddp:
            # the runtime's DDP packs the gradients into its own buckets (host_overhead)
            sync = np.array([sum(collective_s("all_reduce", nbytes, dp_ranks, cluster)
                                 for _, nbytes in ddp_buckets(
                                     [(0.0, prof.optimizer.grad_bytes * x)], cap))
                             for x in psi_s])
        # beside a zero-bubble schedule the pass after the step hides nothing (zero_bubble_dp)
        overlap = np.array([0.0 if reduces_after_step(c) else
                            cluster.device(s * c.dp * c.tp).comm_overlap for s in range(p)])
        exposed = np.maximum(0.0, sync - overlap * b_s)
        if not ddp:
            exposed = np.maximum(exposed, _queue_tails(c, prof, stage_profs, edges, per_layer,
                                                       ends, overlap))
    post = np.zeros(p)
    if zero1_broadcasts(c) and prof.tensors is not None:
        post += _broadcasts(c, prof, edges, stage, psi_s, dp_ranks, cluster)
    elif c.dp > 1 and c.zero_stage in (1, 2):
        k = prof.optimizer.gather_bytes
        post += [collective_s("all_gather", k * float(x - e), dp_ranks, cluster)
                 + (collective_s("all_gather", k * float(e), dp_ranks[::c.ep], cluster)
                    if e else 0.0)
                 for x, e in zip(psi_s, experts_s)]
    if p > 1 and prof.tied_params > 0:
        tied = collective_s("all_reduce", prof.optimizer.grad_bytes * prof.tied_params,
                            (0, (p - 1) * c.dp * c.tp), cluster)
        post[0] += tied
        post[-1] += tied
    bandwidth = np.array([cluster.device(s * c.dp * c.tp).memory_bandwidth_gb_per_s * 1e9
                          for s in range(p)]) if stage_profs is not None else \
        cluster.device(0).memory_bandwidth_gb_per_s * 1e9
    return w, exposed + post, drain, psi_s, experts_s, bandwidth, prof.optimizer.step_bytes
