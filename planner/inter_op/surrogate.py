"""Closed-form step time the search ranks candidates by (the simulator prices the finalists).

From the per-layer profile (:mod:`fxplan.inter_op.profile`), for virtual stage ``j`` holding
layers ``[k_j, k_{j+1})`` (embedding on ``j = 0``, head on ``j = S−1``), per microbatch::

    u_j = Σ_{i ∈ j} t_i + pre[j = 0] + post[j = S−1] + p2p_j + z_j
    w_s = Σ_{j on s} u_j                                  (pipeline rank s = j mod p)

with ``p2p_j`` the blocking sends of the chunk's output forward (``j < S−1``) and of its input
gradient backward (``j > 0``), ``send_recv`` between ranks ``dp·tp`` apart, and ``z_j`` the
exposed ZeRO-3 traffic of the chunk's segments, as :mod:`cost_model.step.stage_costs` prices it
(each segment's weights all-gathered over dp before its forward and its backward, its
gradients reduce-scattered after, prefetched one segment ahead)::

    z_j = Σ_{i ∈ j} max(0, AG(2ψ_i) − f_i) + max(0, AG(2ψ_i) + RS(2ψ_i) − b_i)

(``pre``/``post`` likewise on the first/last virtual stage). Then::

    T̂ = max_s ( m·w_s + (p−1)/v · max_s w_s + exposed_s + post_s + opt_s )
    exposed_s = max(0, Σ_{i on s} AR/RS(2ψ_i) − ω_s·b_s)  gradient buckets behind one backward
    post_s    = AG(2Ψ_s) [zero ∈ {1,2}] + AR(2ψ_tied) [tied weights on the first and last rank]
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
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Sequence

import numpy as np

from fxplan.cost_model.comm.collectives import collective_time_s
from fxplan.cost_model.host.host_overhead import ddp_buckets
from fxplan.cost_model.memory.breakdown import ADAM_MIXED
from fxplan.cost_model.memory.offload import offload_segment_s, offload_step_s
from fxplan.inter_op.profile import SegmentProfile
from fxplan.core.config import ParallelConfig

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster

__all__ = ["bubble_weight", "surrogate_step_s"]


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


def _spans(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """``Σ_{i ∈ j} values_i`` for every virtual stage ``j`` (``edges``: its layer bounds)."""
    P = np.concatenate([[0.0], np.cumsum(values)])
    return P[edges[1:]] - P[edges[:-1]]


def _zero3_exposed(c: ParallelConfig, prof: SegmentProfile, edges: np.ndarray,
                   dp_ranks: tuple[int, ...], cluster: Cluster) -> np.ndarray:
    """``z_j`` of every virtual stage (module docstring), seconds per microbatch (priced with
    rank 0's profile on a heterogeneous cluster)."""
    gather = _per_layer("all_gather", prof.params, dp_ranks, cluster)
    scatter = _per_layer("reduce_scatter", prof.params, dp_ranks, cluster)
    if c.offload == "optimizer+params":
        copy = np.array([offload_segment_s(c, float(x), cluster.device(0))[0]
                         for x in prof.params])
        gather, scatter = gather + copy, scatter + copy
    z = (np.maximum(0.0, gather - prof.fwd)
         + np.maximum(0.0, gather + scatter - prof.bwd))
    out = _spans(z, edges)
    for j, (f, b, psi) in ((0, prof.pre[:3]), (-1, prof.post[:3])):
        copy = offload_segment_s(c, float(psi), cluster.device(0))[0]
        ag = _coll("all_gather", 2.0 * float(psi), dp_ranks, cluster) + copy
        rs = _coll("reduce_scatter", 2.0 * float(psi), dp_ranks, cluster) + copy
        out[j] += max(0.0, ag - f) + max(0.0, ag + rs - b)
    return out


def surrogate_step_s(c: ParallelConfig, prof: SegmentProfile, cluster: Cluster,
                     stage_profs: Sequence[SegmentProfile] | None = None) -> float:
    """``T̂`` of the module docstring, seconds. ``stage_profs``: one profile per pipeline rank
    (its device group's) on a heterogeneous cluster; ``None``: ``prof`` on every rank."""
    p, v, S, m = c.pp, c.virtual_stages, c.pp * c.virtual_stages, c.num_microbatches
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
        pair = (0, c.dp * c.tp)
        out = prof.out_bytes[edges[1:] - 1] / (1 if c.sequence_parallel else c.tp)
        u[:-1] += [_coll("send_recv", float(x), pair, cluster) for x in out[:-1]]
        u[1:] += [_coll("send_recv", float(x), pair, cluster) for x in out[:-1]]
    if c.zero_stage == 3 and c.dp > 1:
        u += _zero3_exposed(c, prof, edges, dp_ranks, cluster)
    w = np.bincount(stage, weights=u, minlength=p)
    b_s = np.bincount(stage, weights=back, minlength=p) / v
    psi_s = np.bincount(stage, weights=psi, minlength=p)
    exposed = np.zeros(p)
    if c.dp > 1 and c.zero_stage < 3:
        kind = "all_reduce" if c.zero_stage == 0 else "reduce_scatter"
        layer_sync = np.concatenate([[0.0], np.cumsum(_per_layer(kind, prof.params, dp_ranks,
                                                                  cluster))])
        sync = np.bincount(stage, weights=layer_sync[edges[1:]] - layer_sync[edges[:-1]],
                           minlength=p)
        ends = _per_layer(kind, np.array([prof.pre[2], prof.post[2]]), dp_ranks, cluster)
        sync[0] += ends[0]
        sync[stage[-1]] += ends[1]
        cap = cluster.device(0).ddp_bucket_mib
        if cap > 0 and c.tp == 1 and c.zero_stage <= 1:
            # the runtime's DDP packs the gradients into its own buckets (host_overhead)
            sync = np.array([sum(_coll("all_reduce", nbytes, dp_ranks, cluster)
                                 for _, nbytes in ddp_buckets([(0.0, 2.0 * x)], cap))
                             for x in psi_s])
        overlap = np.array([cluster.device(s * c.dp * c.tp).comm_overlap for s in range(p)])
        exposed = np.maximum(0.0, sync - overlap * b_s)
    post = np.zeros(p)
    if c.dp > 1 and c.zero_stage in (1, 2):
        post += [_coll("all_gather", 2.0 * float(x), dp_ranks, cluster) for x in psi_s]
    if p > 1 and prof.tied_params > 0:
        tied = _coll("all_reduce", 2.0 * prof.tied_params, (0, (p - 1) * c.dp * c.tp), cluster)
        post[0] += tied
        post[-1] += tied
    bandwidth = np.array([cluster.device(s * c.dp * c.tp).memory_bandwidth_gb_per_s * 1e9
                          for s in range(p)]) if stage_profs is not None else \
        cluster.device(0).memory_bandwidth_gb_per_s * 1e9
    if c.offload == "none":
        opt = ADAM_MIXED.step_bytes * psi_s / (c.dp if c.zero_stage >= 1 else 1) / bandwidth
    else:
        opt = np.array([offload_step_s(c, float(psi_s[s]), float(b_s[s] * v),
                                       cluster.device(s * c.dp * c.tp), ADAM_MIXED)
                        for s in range(p)])
    return float(np.max(m * w + bubble_weight(c) * w.max() + exposed + post + opt))
