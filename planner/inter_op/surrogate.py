"""Closed-form step time the search ranks candidates by (the simulator prices the finalists).

From the per-layer profile (:mod:`fxplan.inter_op.profile`), for virtual stage ``j`` holding
layers ``[k_j, k_{j+1})`` (embedding on ``j = 0``, head on ``j = S−1``), per microbatch::

    u_j = Σ_{i ∈ j} t_i + pre[j = 0] + post[j = S−1] + p2p_j + z_j
    w_s = Σ_{j on s} u_j                                  (pipeline rank s = j mod p)

with ``p2p_j`` the blocking sends of the chunk's output forward (``j < S−1``) and of its input
gradient backward (``j > 0``), ``send_recv`` between the first ranks of the pipeline ranks
holding ``j`` and ``j + 1`` (so a boundary that crosses nodes pays the slower link), and ``z_j`` the
exposed ZeRO-3 traffic of the chunk's segments, as :mod:`cost_model.step.stage_costs` prices it
(each segment's weights all-gathered over dp before its forward and its backward, its
gradients reduce-scattered after, prefetched one segment ahead:
:func:`cost_model.host.host_overhead.zero3_exposed_s`). Over the chunk's segments ``k = 0…n−1``
(``pre`` first on ``j = 0``, ``post`` last on ``j = S−1``), with ``AG_k = AG(2ψ_k)``,
``RS_k = RS(2ψ_k)`` and ``ω`` the device's ``comm_overlap``::

    z_j = AG_0 + Σ_{k>0} [(1−ω)·AG_k + max(0, ω·AG_k − f_{k−1})]
              + AG_{n−1} + RS_0 + Σ_k [(1−ω)·h_k + max(0, ω·h_k − b_k)],
    h_k = AG_{k−1} [k > 0] + RS_{k+1} [k < n−1]

(a layer's gather hides behind the layer before it: a light layer before a heavy one — the
dense layer before a mixture of experts — leaves the heavy one's gather exposed). ZeRO-2 with
``m > 1`` reduce-scatters in every backward
(:func:`cost_model.step.dp_reductions.zero2_reduces_per_microbatch`): its ``z_j`` is the same
with every ``AG_k = 0`` (the blocks stay gathered), and it has no ``exposed_s``. Then::

    T̂ = max_s ( m·w_s + (p−1)/v · max_s w_s + exposed_s + post_s + opt_s )
    exposed_s = max(0, Σ_{i on s} AR/RS(2ψ_i) − ω_s·b_s)  gradient buckets behind one backward
                (all of the sum beside a zero-bubble schedule, ``ω_s = 0``: the runtime
                reduces after the step, :mod:`fxplan.core.zero_bubble_dp`)
    post_s    = AG(2Ψ_s) [zero ∈ {1,2}] + AR(2ψ_tied) [tied weights on the first and last rank]
                (ZeRO-1 without DTensor parameters: ``n_s`` broadcasts, :func:`_broadcasts`)
    opt_s     = 28·Ψ_s / dp^{[zero ≥ 1]} / memory bandwidth          (offload = none)
              = T_off(Ψ_s, B_s)   (:func:`cost_model.memory.offload.offload_step_s`, ``B_s`` one
                                   microbatch's backward on rank s)        (offload ≠ none)

Under ``offload=optimizer+params`` each segment's fp32 shard is copied to the device before
each of its all-gathers and its gradient back after the reduce-scatter
(:func:`cost_model.memory.offload.offload_segment_s`): ``AG`` and ``RS`` in ``z_j`` carry those
copies.

with ``ω_s`` the stage's ``comm_overlap`` (1 on GPUs), and where the devices run PyTorch DDP
(``ddp_bucket_mib > 0``, tp = 1, ZeRO ≤ 1) the sum over DDP's buckets of the stage's
gradient instead of one collective per layer (:func:`cost_model.host.host_overhead.ddp_buckets`).
``m·w_s + (p−1)/v·w_max`` is exact for the uniform 1F1B and interleaved timelines of
:mod:`cost_model.step.simulator` and close for nearly balanced stages; the simulator, through
:func:`cost_model.step.estimate.estimate`, re-prices every candidate the search keeps.

Under expert parallelism (``ep > 1``) each layer's local expert parameters ``ψ^e_i``
(:mod:`fxplan.inter_op.profile`) are synced as the step simulator syncs them: ``AR/RS``, ``AG``
(ZeRO-1/2's gather and ZeRO-3's ``z_j``) of ``2(ψ_i − ψ^e_i)`` over the dp ranks plus those of
``2ψ^e_i`` over the expert-data-parallel group (every ``ep``-th dp rank), with ``tp > 1`` an
all-reduce of ``2ψ^e_i`` over the tp group besides, and the optimizer steps
``(Ψ_s − Ψ^e_s)/dp + Ψ^e_s·ep/dp`` parameters under ZeRO ≥ 1 (the experts' states are sharded
over their ``dp/ep`` replicas only).

With a ZeRO stage or an offload per pipeline rank (``zero_stages``, ``offload_stages``) every
term of rank ``s`` — its ``z_j`` (the host copies of ``offload=optimizer+params`` included),
``exposed_s``, ``post_s``, ``opt_s`` — reads only the rank's own stage and offload, so ``T̂``
takes each rank's ``w_s`` and ``exposed_s + post_s + opt_s`` from the configuration with that
stage and offload on every rank (:func:`rank_terms`; :mod:`fxplan.inter_op.stage_zero` chooses
them). A
weight tied between two ranks that keep its gradient in different dp layouts adds a gather
the step simulator prices (:func:`cost_model.step.cross_stage.tied_sync`) and ``T̂`` does
not; the search never ranks such a configuration (its tied holders keep one layout).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Sequence

import numpy as np

from fxplan.cost_model.comm.collectives import collective_time_s
from fxplan.cost_model.host.host_overhead import ddp_buckets
from fxplan.cost_model.memory.breakdown import ADAM_MIXED
from fxplan.cost_model.memory.offload import offload_segment_s, offload_step_s
from fxplan.cost_model.step.dp_reductions import zero1_broadcasts, zero2_reduces_per_microbatch
from fxplan.inter_op.profile import SegmentProfile
from fxplan.core.config import ParallelConfig
from fxplan.core.zero_bubble_dp import reduces_after_step

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster

__all__ = ["RungTerms", "bubble_weight", "rank_terms", "rung_terms", "split_bound", "step_of_terms",
           "surrogate_step_s"]


def bubble_weight(c: ParallelConfig) -> float:
    """``(p−1)/v``: how many times the slowest rank's per-microbatch work ``max_s w_s`` the
    pipeline's fill and drain add to the step in ``T̂`` (module docstring); the search's
    pipeline lower bound (:func:`fxplan.inter_op.bounds.pipeline_lower_bound`) uses the same
    term, so the two cannot drift apart."""
    return (c.pp - 1) / c.virtual_stages


@lru_cache(maxsize=1 << 15)
def _coll(kind: str, nbytes: float, ranks: tuple[int, ...], cluster: Cluster) -> float:
    return collective_time_s(kind, nbytes, ranks, cluster)


def _per_layer(kind: str, params: np.ndarray, ranks: tuple[int, ...],
               cluster: Cluster) -> np.ndarray:
    """``kind`` over ``ranks`` of ``2ψ_i`` bytes for each layer (priced once per distinct ψ)."""
    values, inverse = np.unique(params, return_inverse=True)
    return np.array([_coll(kind, 2.0 * float(x), ranks, cluster) for x in values])[inverse]


def _experts(prof: SegmentProfile) -> np.ndarray:
    """``ψ^e_i``: each layer's local expert parameters (zero without expert parallelism)."""
    return prof.expert_params if prof.expert_params is not None else np.zeros_like(prof.params)


def _split_per_layer(kind: str, prof: SegmentProfile, dp_ranks: tuple[int, ...],
                     cluster: Cluster) -> np.ndarray:
    """``kind`` of each layer's ``2ψ_i`` bytes as the runtime syncs them: the experts'
    ``ψ^e_i`` over their expert-data-parallel group (every ``ep``-th dp rank,
    :func:`~cost_model.parallel.expert_parallel.ep_groups`), the rest over all dp ranks."""
    experts = _experts(prof)
    out = _per_layer(kind, prof.params - experts, dp_ranks, cluster)
    if experts.any():
        out = out + _per_layer(kind, experts, dp_ranks[::prof.ep], cluster)
    return out


def _spans(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
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
        pre, post = (_coll(kind, 2.0 * float(x), dp_ranks, cluster)
                     for x in (prof.pre[2], prof.post[2]))
        return np.concatenate([[pre], _split_per_layer(kind, prof, dp_ranks, cluster), [post]])

    rs = segments("reduce_scatter")
    # ZeRO-2 reducing in every backward keeps its blocks gathered: no gathers
    ag = segments("all_gather") if c.zero_stage == 3 else np.zeros_like(rs)
    if c.offload == "optimizer+params":
        psi = np.concatenate([[prof.pre[2]], prof.params, [prof.post[2]]])
        copy = np.array([offload_segment_s(c, float(x), cluster.device(0))[0] for x in psi])
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
    time ``t(x) = λ + x/β`` the batch costs ``Σ_i t(2ψ_i) = t(2Ψ_s) + (n_s − 1)·λ``, or with
    a host that queues each further collective at ``q`` seconds, ``t(2Ψ_s) + (n_s − 1)·q``;
    ``λ`` is the broadcast of one byte."""
    n = np.bincount(stage, weights=_spans(prof.tensors, edges), minlength=c.pp)
    pre, post, tied = prof.end_tensors
    n[0] += pre
    n[stage[-1]] += post - (tied if c.pp == 1 else 0)
    out = np.zeros(c.pp)
    for s in range(c.pp):
        device = cluster.device(s * c.dp * c.tp)
        each = (device.host.queued_collective_us * 1e-6 if device.host
                and device.host.queued_collective_us > 0
                else _coll("broadcast", 1.0, dp_ranks, cluster))
        out[s] = _coll("broadcast", 2.0 * float(psi_s[s]), dp_ranks, cluster) \
            + max(0.0, n[s] - 1) * each
    return out


def surrogate_step_s(c: ParallelConfig, prof: SegmentProfile, cluster: Cluster,
                     stage_profs: Sequence[SegmentProfile] | None = None) -> float:
    """``T̂`` of the module docstring, seconds. ``stage_profs``: one profile per pipeline rank
    (its device group's) on a heterogeneous cluster; ``None``: ``prof`` on every rank. With a
    ZeRO stage or an offload per pipeline rank (``zero_stages``, ``offload_stages``) each
    rank's terms are those of the configuration with its own stage and offload on every rank
    (:func:`rank_terms`: a rank's terms read only its own)."""
    if not c.per_rank:
        return step_of_terms(c, *rank_terms(c, prof, cluster, stage_profs))
    rungs = list(zip(c.rank_zero_stages, c.rank_offloads))
    terms = {rung: rank_terms(c.uniform(*rung), prof, cluster, stage_profs)
             for rung in set(rungs)}
    w = np.array([terms[rung][0][s] for s, rung in enumerate(rungs)])
    rest = np.array([terms[rung][1][s] for s, rung in enumerate(rungs)])
    return step_of_terms(c, w, rest)


def step_of_terms(c: ParallelConfig, w: np.ndarray, rest: np.ndarray) -> float:
    """``T̂ = max_s (m·w_s + (p−1)/v · max_s w_s + rest_s)`` from each rank's work per
    microbatch ``w_s`` and its once-per-step seconds ``rest_s = exposed_s + post_s + opt_s``
    (:func:`rank_terms`)."""
    return float(np.max(c.num_microbatches * w + bubble_weight(c) * w.max() + rest))


def rank_terms(c: ParallelConfig, prof: SegmentProfile, cluster: Cluster,
               stage_profs: Sequence[SegmentProfile] | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """Per pipeline rank ``s`` (one ZeRO stage for all: ``c.zero_stage``): ``w_s``, its work per
    microbatch, and ``exposed_s + post_s + opt_s``, its seconds once per step (module
    docstring); :func:`step_of_terms` combines them into ``T̂``."""
    return RungTerms(c, prof, cluster, stage_profs).terms(c.zero_stage, c.offload)


def rung_terms(c: ParallelConfig, rungs: Sequence[tuple[int, str]], prof: SegmentProfile,
               cluster: Cluster, stage_profs: Sequence[SegmentProfile] | None = None
               ) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`rank_terms` of ``c`` at each rung ``(zero, offload)`` on every rank
    (:class:`RungTerms`)."""
    terms = RungTerms(c, prof, cluster, stage_profs)
    return [terms.terms(zero, offload) for zero, offload in rungs]


class RungTerms:
    """:func:`rank_terms` of one split (``c``'s) at any rung ``(zero, offload)`` on every rank.
    Of the terms only ``opt_s`` reads ``offload=optimizer`` (module docstring: ``z_j`` reads
    ``optimizer+params``' copies, ``exposed_s`` and ``post_s`` no offload; ``Ψ_s`` and ``b_s``
    no rung), so a rung with ``optimizer`` shares ``w_s`` and ``exposed_s + post_s`` with the
    same stage without offload: priced once, the same floats."""

    def __init__(self, c: ParallelConfig, prof: SegmentProfile, cluster: Cluster,
                 stage_profs: Sequence[SegmentProfile] | None = None) -> None:
        self.c, self.prof, self.cluster, self.stage_profs = c, prof, cluster, stage_profs
        self._parts: dict[tuple[int, bool], _Parts] = {}
        self._configs: dict[tuple[int, str], ParallelConfig] = {}
        if not c.per_rank:
            self._configs[(c.zero_stage, c.offload)] = c

    def _at(self, zero: int, offload: str) -> ParallelConfig:
        """The split's configuration with the rung on every rank."""
        hit = self._configs.get((zero, offload))
        if hit is None:
            hit = self._configs[(zero, offload)] = self.c.uniform(zero, offload)
        return hit

    def _of(self, zero: int, offload: str) -> _Parts:
        key = (zero, offload == "optimizer+params")
        hit = self._parts.get(key)
        if hit is None:
            hit = self._parts[key] = _Parts(*_parts(self._at(zero, offload), self.prof,
                                                    self.cluster, self.stage_profs))
        return hit

    def terms(self, zero: int, offload: str) -> tuple[np.ndarray, np.ndarray]:
        """``(w_s, exposed_s + post_s + opt_s)`` of every rank at the rung."""
        parts = self._of(zero, offload)
        return parts.w, parts.rest + parts.optimizer_s(self._at(zero, offload), self.cluster)

    def optimizer_s(self, zero: int, offload: str) -> np.ndarray:
        """``opt_s`` of every rank at the rung, from the parts of the same stage without
        offload (``Ψ_s``, ``b_s`` read no rung): no ``z_j`` is priced for it."""
        return self._of(zero, "none").optimizer_s(self._at(zero, offload), self.cluster)


def split_bound(c: ParallelConfig, prof: SegmentProfile,
                stage_profs: Sequence[SegmentProfile] | None = None) -> float:
    """``(m + (p−1)/v)·max_s Σ_{j on s} (Σ_{i ∈ j} t_i + pre[j = 0] + post[j = S−1])``: a lower
    bound of ``T̂`` of ``c``'s split at every rung on every rank — ``w_s`` adds the sends and
    ``z_j`` (``≥ 0``) to that compute and ``exposed_s + post_s + opt_s ≥ 0``, so
    ``T̂ ≥ m·max_s w_s + (p−1)/v·max_s w_s``."""
    p, S = c.pp, c.pp * c.virtual_stages
    edges = np.concatenate([[0], np.cumsum(c.stage_layers)]).astype(int)
    stage = np.arange(S) % p
    if stage_profs is None:
        first = last = prof
        u = _spans(prof.layer_time, edges)
    else:
        first, last = stage_profs[0], stage_profs[stage[-1]]
        u = np.array([_spans(stage_profs[s].layer_time, edges)[j] for j, s in enumerate(stage)])
    u[0] += first.pre[0] + first.pre[1]
    u[-1] += last.post[0] + last.post[1]
    return (c.num_microbatches + bubble_weight(c)) * float(
        np.bincount(stage, weights=u, minlength=p).max())


@dataclass(frozen=True)
class _Parts:
    """Per pipeline rank: ``w_s``, ``exposed_s + post_s`` (``rest``), and what ``opt_s``
    reads — the rank's parameters ``Ψ_s``, its experts' ``Ψ^e_s``, one microbatch's backward
    ``b_s`` (over ``v`` chunks) and the memory bandwidth."""

    w: np.ndarray
    rest: np.ndarray
    psi_s: np.ndarray
    experts_s: np.ndarray
    b_s: np.ndarray
    bandwidth: np.ndarray | float
    experts: bool

    def optimizer_s(self, c: ParallelConfig, cluster: Cluster) -> np.ndarray:
        """``opt_s`` of every rank under ``c``'s ZeRO stage and offload (module docstring)."""
        psi_s, experts_s, bandwidth = self.psi_s, self.experts_s, self.bandwidth
        if c.offload == "none":
            if self.experts and c.zero_stage >= 1:   # the experts' states over dp/ep replicas
                return ADAM_MIXED.step_bytes * ((psi_s - experts_s) / c.dp
                                                + experts_s * c.ep / c.dp) / bandwidth
            return ADAM_MIXED.step_bytes * psi_s / (c.dp if c.zero_stage >= 1 else 1) / bandwidth
        return np.array([offload_step_s(c, float(psi_s[s]), float(self.b_s[s] * c.virtual_stages),
                                        cluster.device(s * c.dp * c.tp), ADAM_MIXED)
                         for s in range(c.pp)])


def _parts(c: ParallelConfig, prof: SegmentProfile, cluster: Cluster,
           stage_profs: Sequence[SegmentProfile] | None) -> tuple:
    """The fields of :class:`_Parts` (module docstring)."""
    p, v, S = c.pp, c.virtual_stages, c.pp * c.virtual_stages
    edges = np.concatenate([[0], np.cumsum(c.stage_layers)]).astype(int)
    dp_ranks = tuple(range(0, c.dp * c.tp, c.tp))
    stage = np.arange(S) % p
    P_psi = np.concatenate([[0.0], np.cumsum(prof.params)])
    psi = P_psi[edges[1:]] - P_psi[edges[:-1]]
    if stage_profs is None:
        first = last = prof
        u = _spans(prof.layer_time, edges)
        back = _spans(prof.bwd + prof.tp_bwd, edges)
    else:
        first, last = stage_profs[0], stage_profs[stage[-1]]
        u = np.array([_spans(stage_profs[s].layer_time, edges)[j] for j, s in enumerate(stage)])
        back = np.array([_spans(stage_profs[s].bwd + stage_profs[s].tp_bwd, edges)[j]
                         for j, s in enumerate(stage)])
    u[0] += first.pre[0] + first.pre[1]
    u[-1] += last.post[0] + last.post[1]
    back[0] += first.pre[1]
    back[-1] += last.post[1]
    psi[0] += prof.pre[2]
    psi[-1] += prof.post[2] - (prof.tied_params if p == 1 else 0.0)
    if p > 1:
        out = prof.out_bytes[edges[1:] - 1] / (1 if c.sequence_parallel else c.tp)
        first_rank = [c.schedule.placement(j, p)[0] * c.dp * c.tp for j in range(S)]
        sends = [_coll("send_recv", float(x), (first_rank[j], first_rank[j + 1]), cluster)
                 if first_rank[j] != first_rank[j + 1] else 0.0   # the turn of a V
                 for j, x in enumerate(out[:-1])]
        u[:-1] += sends
        u[1:] += sends
    per_microbatch = zero2_reduces_per_microbatch(c)
    if c.zero_stage == 3 and c.dp > 1 or per_microbatch:
        u += _zero3_exposed(c, prof, edges, dp_ranks, cluster)
    w = np.bincount(stage, weights=u, minlength=p)
    b_s = np.bincount(stage, weights=back, minlength=p) / v
    psi_s = np.bincount(stage, weights=psi, minlength=p)
    experts = _experts(prof)
    experts_s = np.bincount(stage, weights=_spans(experts, edges), minlength=p)
    exposed = np.zeros(p)
    if c.dp > 1 and c.zero_stage < 3 and not per_microbatch:
        kind = "all_reduce" if c.zero_stage == 0 else "reduce_scatter"
        per_layer = _split_per_layer(kind, prof, dp_ranks, cluster)
        if experts.any() and c.tp > 1:   # each tp rank's expert copy saw its share of rows
            per_layer = per_layer + _per_layer("all_reduce", experts, tuple(range(c.tp)),
                                               cluster)
        layer_sync = np.concatenate([[0.0], np.cumsum(per_layer)])
        sync = np.bincount(stage, weights=layer_sync[edges[1:]] - layer_sync[edges[:-1]],
                           minlength=p)
        ends = _per_layer(kind, np.array([prof.pre[2], prof.post[2]]), dp_ranks, cluster)
        sync[0] += ends[0]
        sync[stage[-1]] += ends[1]
        cap = cluster.device(0).ddp_bucket_mib
        if cap > 0 and c.tp == 1 and c.zero_stage <= 1 and not experts.any():
            # the runtime's DDP packs the gradients into its own buckets (host_overhead)
            sync = np.array([sum(_coll("all_reduce", nbytes, dp_ranks, cluster)
                                 for _, nbytes in ddp_buckets([(0.0, 2.0 * x)], cap))
                             for x in psi_s])
        # beside a zero-bubble schedule the pass after the step hides nothing (zero_bubble_dp)
        overlap = np.array([0.0 if reduces_after_step(c) else
                            cluster.device(s * c.dp * c.tp).comm_overlap for s in range(p)])
        exposed = np.maximum(0.0, sync - overlap * b_s)
    post = np.zeros(p)
    if zero1_broadcasts(c) and prof.tensors is not None:
        post += _broadcasts(c, prof, edges, stage, psi_s, dp_ranks, cluster)
    elif c.dp > 1 and c.zero_stage in (1, 2):
        post += [_coll("all_gather", 2.0 * float(x - e), dp_ranks, cluster)
                 + (_coll("all_gather", 2.0 * float(e), dp_ranks[::c.ep], cluster) if e else 0.0)
                 for x, e in zip(psi_s, experts_s)]
    if p > 1 and prof.tied_params > 0:
        tied = _coll("all_reduce", 2.0 * prof.tied_params, (0, (p - 1) * c.dp * c.tp), cluster)
        post[0] += tied
        post[-1] += tied
    bandwidth = np.array([cluster.device(s * c.dp * c.tp).memory_bandwidth_gb_per_s * 1e9
                          for s in range(p)]) if stage_profs is not None else \
        cluster.device(0).memory_bandwidth_gb_per_s * 1e9
    return w, exposed + post, psi_s, experts_s, b_s, bandwidth, bool(experts.any())
