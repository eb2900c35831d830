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

    T̂ = (m + (p−1)/v)·max_s w_s + max_s ( exposed_s + post_s + opt_s − δ_s )
    δ_s = Σ_{j<s} β_j,   β_j = one microbatch's backward of rank j's first chunk + its send
                            to rank j − 1 (compute and exposed tp traffic of virtual stage j)
    exposed_s = max(0, Σ_{i on s} AR/RS(k_g·ψ_i) − ω_s·b_s)  gradient buckets behind one
                backward; without DDP's own buckets, at least the queue form
                max_k (Σ_{j ≥ k} d_j − ω_s·Σ_{j > k} b_j) over the rank's segments in backward
                order (one stream serves them as they are ready: the last, the embedding's,
                has no backward left to hide behind; :func:`fxplan.inter_op.rank_parts.
                _queue_tails`) (all of the sum beside a zero-bubble schedule, ``ω_s = 0``: the
                runtime reduces after the step, :mod:`fxplan.core.zero_bubble_dp`)
    post_s    = AG(k_c·Ψ_s) [zero ∈ {1,2}] + AR(k_g·ψ_tied) [tied weights on the first and
                last rank] (ZeRO-1 without DTensor parameters: ``n_s`` broadcasts of
                ``k_p·ψ``, :func:`fxplan.inter_op.rank_parts._broadcasts`)
    opt_s     = 28·Ψ_s / dp^{[zero ≥ 1]} / memory bandwidth          (offload = none)
              = T_off(Ψ_o)  (:func:`cost_model.memory.offload.offload_step_s`, ``Ψ_o`` the
                             parameters the rank's optimizer updates)    (offload ≠ none)

``k_g``, ``k_c``, ``k_p``: bytes per parameter of a gradient reduction, a ZeRO gather and a
broadcast of updated parameters in the profile's layout of the model states
(:func:`fxplan.inter_op.rank_parts.bytes_per_param`; 4, 2, 4 in the runtime's, 2, 2, 2 in
Megatron's).

Under ``offload=optimizer+params`` each segment's fp32 shard is copied to the device before
each of its all-gathers and its gradient back after the reduce-scatter
(:func:`cost_model.memory.offload.offload_segment_s`): ``AG`` and ``RS`` in ``z_j`` carry those
copies.

with ``ω_s`` the stage's ``comm_overlap`` (1 on GPUs), and where the devices run PyTorch DDP
(``ddp_bucket_mib > 0``, tp = 1, ZeRO ≤ 1) the sum over DDP's buckets of the stage's
gradient instead of one collective per layer (:func:`cost_model.host.host_overhead.ddp_buckets`).
``(m + (p−1)/v)·w_max`` is when the first rank runs its last backward: exact for the uniform
1F1B and interleaved timelines of :mod:`cost_model.step.simulator` and close for nearly
balanced stages, every rank paced by the slowest. After it each rank's once-per-step work
follows its own last backward, and the ranks end those in turn, the last first: rank ``s``'s
last backward (of virtual stage ``s``, its first chunk) is followed by those of virtual stages
``s−1, …, 0`` on ranks ``s−1, …, 0``, each waiting for the gradient of the one before, so rank
``s`` ends ``δ_s`` before the first (at least: a rank still busy with earlier microbatches
ends later, and ``β_j`` leaves out ZeRO's exposed traffic) and its ``exposed_s + post_s +
opt_s`` hides that much. A light rank gets no slack of its own: it is paced by the slowest
and waits for it at the end, as the simulator finds. Under a split backward (``zb``, ``zbv``,
``dualpipev``) the weight-gradient work fills the drain and ``δ_s = 0``
(:func:`drains_in_turn`). The simulator, through :func:`cost_model.step.estimate.estimate`,
re-prices every candidate the search keeps.

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
stage and offload on every rank (:meth:`RungTerms.terms`, priced in
:mod:`fxplan.inter_op.rank_parts`; :mod:`fxplan.inter_op.stage_zero` and
:mod:`fxplan.inter_op.joint_split` choose them). A weight
tied between two ranks that keep its gradient in different dp layouts adds a gather
the step simulator prices (:func:`cost_model.step.cross_stage.tied_sync`) and ``T̂`` does
not; the search never ranks such a configuration (its tied holders keep one layout).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from fxplan.core.config import ParallelConfig
from fxplan.cost_model.step.pipeline_schedules import SPLIT_BACKWARD
from fxplan.inter_op.profile import SegmentProfile
from fxplan.inter_op.rank_parts import RankParts, rank_parts, spans

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster

__all__ = ["RungTerms", "bubble_weight", "drain_slack", "drains_in_turn", "split_bound",
           "step_of_terms", "surrogate_step_s"]


def bubble_weight(c: ParallelConfig) -> float:
    """``(p−1)/v``: how many times the slowest rank's per-microbatch work ``max_s w_s`` the
    pipeline's fill and drain add to the step in ``T̂`` (module docstring); the search's
    pipeline lower bound (:func:`fxplan.inter_op.bounds.pipeline_lower_bound`) uses the same
    term, so the two cannot drift apart."""
    return (c.pp - 1) / c.virtual_stages


def surrogate_step_s(c: ParallelConfig, prof: SegmentProfile, cluster: Cluster,
                     stage_profs: Sequence[SegmentProfile] | None = None) -> float:
    """``T̂`` of the module docstring, seconds. ``stage_profs``: one profile per pipeline rank
    (its device group's) on a heterogeneous cluster; ``None``: ``prof`` on every rank. With a
    ZeRO stage or an offload per pipeline rank (``zero_stages``, ``offload_stages``) each
    rank's terms are those of the configuration with its own stage and offload on every rank
    (:meth:`RungTerms.terms`: a rank's terms read only its own)."""
    pricer = RungTerms(c, prof, cluster, stage_profs)
    if not c.per_rank:
        return step_of_terms(c, *pricer.terms(c.zero_stage, c.offload), pricer.drain())
    rungs = list(zip(c.rank_zero_stages, c.rank_offloads))
    terms = {rung: pricer.terms(*rung) for rung in set(rungs)}
    w = np.array([terms[rung][0][s] for s, rung in enumerate(rungs)])
    rest = np.array([terms[rung][1][s] for s, rung in enumerate(rungs)])
    return step_of_terms(c, w, rest, pricer.drain())


def step_of_terms(c: ParallelConfig, w: np.ndarray, rest: np.ndarray,
                  drain: np.ndarray) -> float:
    """``T̂ = (m + (p−1)/v)·max_s w_s + max_s (rest_s − δ_s)`` from each rank's work per
    microbatch ``w_s``, its once-per-step seconds ``rest_s = exposed_s + post_s + opt_s`` and
    its step of the drain ``β_s`` (:meth:`RungTerms.terms`, :meth:`RungTerms.drain`;
    ``δ_s`` :func:`drain_slack`)."""
    return float((c.num_microbatches + bubble_weight(c)) * w.max()
                 + np.max(rest - drain_slack(c, drain)))


def drain_slack(c: ParallelConfig, drain: np.ndarray) -> np.ndarray:
    """``δ_s = Σ_{j<s} β_j``: how much earlier than the first pipeline rank rank ``s`` runs
    its last op (module docstring); all zero where :func:`drains_in_turn` does not hold."""
    if not drains_in_turn(c):
        return np.zeros(len(drain))
    return np.concatenate([[0.0], np.cumsum(drain[:-1])])


def drains_in_turn(c: ParallelConfig) -> bool:
    """Whether the pipeline ranks end their steps' backwards one after the other, the last
    first (GPipe, 1F1B, interleaved): not under a split backward (``zb``, ``zbv``,
    ``dualpipev``), whose weight-gradient work fills the drain."""
    return c.schedule.kind not in SPLIT_BACKWARD


class RungTerms:
    """Per pipeline rank ``s`` of one split (``c``'s), at any rung ``(zero, offload)`` on
    every rank: ``w_s``, its work per microbatch, and ``exposed_s + post_s + opt_s``, its
    seconds once per step (module docstring; :func:`step_of_terms` combines them into ``T̂``).
    Of the terms only ``opt_s`` reads ``offload=optimizer`` (module docstring: ``z_j`` reads
    ``optimizer+params``' copies, ``exposed_s`` and ``post_s`` no offload; ``Ψ_s`` and ``b_s``
    no rung), so a rung with ``optimizer`` shares ``w_s`` and ``exposed_s + post_s`` with the
    same stage without offload: priced once, the same floats."""

    def __init__(self, c: ParallelConfig, prof: SegmentProfile, cluster: Cluster,
                 stage_profs: Sequence[SegmentProfile] | None = None) -> None:
        self.c, self.prof, self.cluster, self.stage_profs = c, prof, cluster, stage_profs
        self._parts: dict[tuple[int, bool], RankParts] = {}
        self._configs: dict[tuple[int, str], ParallelConfig] = {}
        if not c.per_rank:
            self._configs[(c.zero_stage, c.offload)] = c

    def _at(self, zero: int, offload: str) -> ParallelConfig:
        """The split's configuration with the rung on every rank."""
        hit = self._configs.get((zero, offload))
        if hit is None:
            hit = self._configs[(zero, offload)] = self.c.uniform(zero, offload)
        return hit

    def _of(self, zero: int, offload: str) -> RankParts:
        key = (zero, offload == "optimizer+params")
        hit = self._parts.get(key)
        if hit is None:
            hit = self._parts[key] = RankParts(*rank_parts(self._at(zero, offload), self.prof,
                                                    self.cluster, self.stage_profs))
        return hit

    def terms(self, zero: int, offload: str) -> tuple[np.ndarray, np.ndarray]:
        """``(w_s, exposed_s + post_s + opt_s)`` of every rank at the rung."""
        parts = self._of(zero, offload)
        return parts.w, parts.rest + parts.optimizer_s(self._at(zero, offload), self.cluster)

    def drain(self) -> np.ndarray:
        """``β_s`` of every rank (one microbatch's backward of its first chunk and its send
        down): it reads no rung, so it is taken from any rung already priced."""
        parts = next(iter(self._parts.values()), None)
        return (parts if parts is not None else self._of(self.c.zero_stage, "none")).drain

    def optimizer_s(self, zero: int, offload: str) -> np.ndarray:
        """``opt_s`` of every rank at the rung, from the parts of the same stage without
        offload (``Ψ_s`` and ``Ψ^e_s`` read no rung): no ``z_j`` is priced for it."""
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
        u = spans(prof.layer_time, edges)
    else:
        first, last = stage_profs[0], stage_profs[stage[-1]]
        u = np.array([spans(stage_profs[s].layer_time, edges)[j] for j, s in enumerate(stage)])
    u[0] += first.pre[0] + first.pre[1]
    u[-1] += last.post[0] + last.post[1]
    return (c.num_microbatches + bubble_weight(c)) * float(
        np.bincount(stage, weights=u, minlength=p).max())
