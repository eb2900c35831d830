"""The stage split and every pipeline rank's rung chosen together, exactly for ``T̂``.

:mod:`fxplan.inter_op.stage_zero` chooses a ZeRO stage and an offload per pipeline rank
(a *rung* ``r ∈ R``) exactly for one split. This module chooses the split with them: over every
split of the ``L`` layers into ``p`` contiguous stages (at least one layer each) and every rung
per rank that fits, the minimum of the closed form (:mod:`fxplan.inter_op.surrogate`)

    T̂ = (m + b)·max_s w_s + max_s (e_s − δ_s),    δ_s = Σ_{j<s} β_j,    b = (p−1)/v

where rank ``s`` holding ``n_s`` layers at rung ``r_s`` has work per microbatch
``w_s = w_s(n_s, r_s)``, seconds once per step ``e_s = e_s(n_s, r_s)``, device bytes
``M_s(n_s, r_s)`` and its step of the drain ``β_s = β_s(n_s)`` (no rung's; ``δ_s`` is how long
before the first rank it ends its last backward, :func:`~fxplan.inter_op.surrogate.drain_slack`).

**Scope.** One chunk per rank (``v = 1``: stage ``j`` is rank ``j``), one recompute policy on
every layer, and identical repeated layers (every per-layer row of the profile constant, as in
a GPT or a Llama; on a heterogeneous cluster every rank's profile, its device group's): then a
rank's terms and memory read only its own layer count (not where its span sits), its own rung
and its own devices (:mod:`~fxplan.inter_op.stage_zero`, "Independence"). Elsewhere the
search keeps the union of the plan-wide rungs' splits
(:meth:`fxplan.inter_op.joint_rungs.JointRungs._joint`).

**Tables.** A rank's terms at ``n`` layers are those of any split giving it ``n`` layers on
profiles of as many identical layers as that split sums to (each rank's its own devices'):
fake split ``k`` gives rank ``s`` ``n_s(k) = min(lo_s + k, hi_s)`` layers, and one pricing of
it at each rung on every rank (:class:`~fxplan.inter_op.surrogate.RungTerms`,
:func:`~fxplan.inter_op.stage_memory.rung_rows`) fills column ``k`` of every rank's tables
``w[s, n, r]``, ``e[s, n, r]``, ``M[s, n, r]``, its host bytes ``h[s, n, r]`` and ``β[s, n]``;
``K = max_s (hi_s − lo_s + 1)`` pricings in all.

**Window.** ``w_s ≥ u_s(n) = n·t_s + pre[s = 0] + post[s = p−1]`` (``t_s`` a layer's time
on rank ``s``; compute alone: the sends and ZeRO-3's exposed traffic add ``≥ 0``) and
``max_s (e_s − δ_s) ≥ e_0 ≥ 0`` (``δ_0 = 0``), so
``T̂ ≥ (m + b)·u_s(n_s)`` for every rank: a split beating the incumbent ``T̂₀`` (the best found
on the plan-wide rungs' splits, or the ``K``-th best of the search) has
``n_s ≤ hi_s = max{n : (m+b)·u_s(n) < T̂₀}`` and so ``n_s ≥ lo_s = max(1, L − Σ_{s'≠s} hi_{s'})``;
no split at all when ``Σ_s hi_s < L``. Near the optimum the window is a few counts wide, which
keeps ``K`` small.

**Exact for a cap.** Fix a cap ``W`` on ``max_s w_s``. Rank ``s`` at ``n`` layers then takes
``f_s(n; W) = min {e_s(n, r) : r fits, w_s(n, r) ≤ W}`` (``∞`` when none; ``β_s`` reads no
rung, so the least ``e`` is the best rung). ``max_s (f_s − δ_s)`` unrolls from the last rank
as ``G_s = max(f_s, G_{s+1} − β_s)`` (``G_p = −∞``, the answer ``G_0``), non-decreasing in
``G_{s+1}``, so the least ``G`` of each suffix is all a rank needs of the ranks after it: the
DP over suffixes (``i`` layers on the ranks before ``s``)

    G_p(L) = −∞,    G_s(i) = min_{lo_s ≤ n ≤ hi_s} max(f_s(n; W), G_{s+1}(i + n) − β_s(n)),

gives ``D(W) = G_0(0)``, the least ``max_s (e_s − δ_s)`` of any split and rungs with
``max_s w_s ≤ W`` (with ``β = 0`` the min–max DP of :mod:`fxplan.inter_op.partition`). Let
``(σ*, r*)`` be optimal and ``W* = max_s w_s`` there, one of the finitely many table values; at
``W = W*`` the DP's answer has ``max w ≤ W*`` and a second term ``≤ D(W*)``, no larger than
``(σ*, r*)``'s, so ``T̂ ≤ T̂*``: the minimum over the caps of ``(m + b)·W + D(W)`` is the
optimum. Of the rungs that keep a cap's ``T̂``, each rank takes the least work, and a
round-off tie between caps goes to the less work in all (:mod:`~fxplan.inter_op.stage_zero`,
"Ties": the simulator's fill and drain pass every rank's work).

**Few caps.** ``D`` is non-increasing in ``W``. The caps (the table's ``w`` at or above the
least feasible ``max_s w_s``, itself one min–max DP on ``w``) are sorted, ``D`` is evaluated at
both ends, and an open interval ``(W_a, W_b)`` of caps is split at its middle only while its
bound ``(m + b)·W_{a+1} + D(W_b)`` (every solution in it has ``max w ≥ W_{a+1}`` and a
second term ``≥ D(W_b)``) is below the best ``T̂`` found: every cap is evaluated or bounded out, so
the answer stays exact, and where ``D`` has few steps it takes ``O(log)`` evaluations. One
evaluation costs ``O(p·K·(|R| + L))`` numpy work.

**Coupling of ranks.** Two terms are not a rank's own. *Tied weights* (embedding and head on
the first and last rank): both holders take rungs of one kind (:mod:`~fxplan.inter_op.
stage_zero`, "Tied weights"), so the search above runs once per kind with both holders limited
to its rungs. *Host memory*: an offload rung fits a rank when the nodes it sits on hold every
rank's host bytes with that rung on every rank (the rule of :mod:`~fxplan.inter_op.stage_zero`,
"Host memory"), a sum over the pipeline ranks sharing a node, which reads their counts. Where
no two pipeline ranks share a node the sum is the rank's own and the tables are exact; else
each cell is checked with the other ranks on its nodes at their least host bytes in the window
(a relaxation: a lower bound) and, when that differs from the check at their most, the answer
is checked on its own split and, failing that, the search runs again on the conservative check
(a plan that fits, then not proven optimal — only where host memory binds on shared nodes).
Every answer is re-priced by :func:`~fxplan.inter_op.surrogate.surrogate_step_s` and checked
by the memory formula on its own split before it replaces the incumbent.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Sequence

import numpy as np

from fxplan.core.config import ParallelConfig
from fxplan.inter_op.offload import Rung, host_fit_ranks, node_shares
from fxplan.inter_op.profile import SegmentProfile
from fxplan.inter_op.scored import ROUND_OFF
from fxplan.inter_op.stage_devices import rank_limits
from fxplan.inter_op.stage_memory import DeviceMemory, rung_rows, stage_rows, stage_totals
from fxplan.inter_op.stage_zero import before, least_work_rungs, with_rungs
from fxplan.inter_op.surrogate import (RungTerms, bubble_weight, drain_slack, drains_in_turn,
                                       surrogate_step_s)

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster

__all__ = ["joint_split", "splits_jointly"]

#: the per-layer rows of a profile (all constant: identical layers)
_ROWS = ("fwd", "bwd", "tp_fwd", "tp_bwd", "params", "acts", "working", "kept", "out_bytes",
         "expert_params", "tensors")


def splits_jointly(c: ParallelConfig, prof: SegmentProfile,
                   profs: Sequence[SegmentProfile] | None) -> bool:
    """Whether :func:`joint_split` covers ``c`` (module docstring, "Scope")."""
    if c.pp < 2 or c.dp < 2 or c.virtual_stages != 1 \
            or c.recompute_layers is not None or prof.layers < c.pp:
        return False
    if any(c.schedule.placement(j, c.pp)[0] != j for j in range(c.pp)):
        return False
    return all(getattr(one, name) is None or np.ptp(getattr(one, name)) == 0
               for one in [prof, *(profs or ())] for name in _ROWS)


def _resized(prof: SegmentProfile, layers: int) -> SegmentProfile:
    """``prof`` with ``layers`` copies of its (identical) layer."""
    return dataclasses.replace(prof, **{
        name: np.full(layers, getattr(prof, name)[0]) for name in _ROWS
        if getattr(prof, name) is not None})


class _Tables:
    """``w``, ``e``, the device fit and host bytes of every rank ``s``, window position ``k``
    (``n = lo_s + k`` layers) and rung (module docstring, "Tables"), ``(p, K, |R|)`` each
    (positions past ``hi_s`` are ``∞`` / unfit), and its step of the drain ``β[s, k]``
    (no rung's; 0 where the ranks do not drain in turn); ``placed`` the candidate."""

    def __init__(self, placed: ParallelConfig, rungs: Sequence[Rung], prof: SegmentProfile,
                 profs: Sequence[SegmentProfile] | None,
                 mems: DeviceMemory | tuple[DeviceMemory, ...], cluster: Cluster,
                 lo: np.ndarray, hi: np.ndarray) -> None:
        p, R = placed.pp, len(rungs)
        K = int((hi - lo).max()) + 1
        self.placed, self.lo, self.size = placed, lo, hi - lo + 1
        in_turn = drains_in_turn(placed)
        self.w = np.full((p, K, R), np.inf)
        self.e = np.full((p, K, R), np.inf)
        self.fits = np.zeros((p, K, R), dtype=bool)
        self.host = np.zeros((p, K, R))
        self.drain = np.zeros((p, K))
        limit = rank_limits(mems)
        ranks = np.arange(p)
        for k in range(K):
            counts = np.minimum(lo + k, hi)
            fake = placed.replace(stage_layers=tuple(int(n) for n in counts))
            total = int(counts.sum())
            fprof = _resized(prof, total)
            pricer = RungTerms(fake, fprof, cluster,
                               None if profs is None else [_resized(x, total) for x in profs])
            live = ranks[k < self.size]
            for r, (rung, rows) in enumerate(zip(rungs, rung_rows(fake, rungs, fprof, mems))):
                self.fits[live, k, r] = np.broadcast_to(rows.total <= limit, (p,))[live]
                self.host[live, k, r] = rows.rows["host"][live]
                if self.fits[live, k, r].any():   # a rung no rank fits at is never chosen
                    w, e = pricer.terms(*rung)
                    self.w[live, k, r], self.e[live, k, r] = w[live], e[live]
            if in_turn and self.fits[live, k].any():
                self.drain[live, k] = pricer.drain()[live]


def joint_split(placed: ParallelConfig, rungs: Sequence[Rung], prof: SegmentProfile,
                profs: Sequence[SegmentProfile] | None,
                mems: DeviceMemory | tuple[DeviceMemory, ...], cluster: Cluster,
                incumbent_s: float) -> tuple[ParallelConfig, float] | None:
    """The split and the rung of every rank minimising ``T̂`` (module docstring), with that
    ``T̂``, when it is below ``incumbent_s`` by more than round-off; else ``None``. ``placed``:
    the candidate at one rung on every rank (its ``m``, ``p``, recompute policy; any split);
    ``rungs``: those a rank may take, in the ladder's order (ties go to the earlier);
    ``prof``, ``profs``, ``mems``: the candidate's profile, its ranks' (on a heterogeneous
    cluster; else ``None``) and its memory. :func:`splits_jointly` must hold."""
    m, b, p, L = placed.num_microbatches, bubble_weight(placed), placed.pp, prof.layers
    own = list(profs) if profs is not None else [prof] * p
    t = np.array([float(x.layer_time[0]) for x in own])
    ends = np.zeros(p)
    ends[0] += own[0].pre[0] + own[0].pre[1]
    ends[-1] += own[-1].post[0] + own[-1].post[1]
    # the window: (m + b)·u_s(n) < T̂₀ (module docstring, "Window")
    room = incumbent_s / (m + b) * (1.0 + ROUND_OFF) - ends
    per_layer = np.floor(room / np.where(t > 0, t, 1.0))
    hi = np.minimum(np.where(t > 0, per_layer, L), L - (p - 1)).astype(int)
    lo = np.maximum(1, L - (hi.sum() - hi))
    if (hi < lo).any() or hi.sum() < L:
        return None
    tables = _Tables(placed, rungs, prof, profs, mems, cluster, lo, hi)
    if not tables.fits.any(axis=(1, 2)).all():   # a rank that fits at no count and rung
        return None
    shares, caps = node_shares(placed, cluster)
    offloads = np.array([o != "none" for _, o in rungs])
    relaxed = _host_fits(tables, shares, caps, offloads, least=True)
    strict = _host_fits(tables, shares, caps, offloads, least=False)
    kinds = _kinds(placed, rungs, prof)
    best = _search(tables, relaxed, kinds, m + b, L, incumbent_s)
    if best is not None and not (relaxed == strict).all():
        if _check(placed, rungs, tables, best, prof, profs, mems, cluster) is None:
            best = _search(tables, strict, kinds, m + b, L, incumbent_s)
    if best is None:
        return None
    return _check(placed, rungs, tables, best, prof, profs, mems, cluster, incumbent_s)


def _host_fits(tables: _Tables, shares: np.ndarray, caps: np.ndarray, offloads: np.ndarray,
               least: bool) -> np.ndarray:
    """``tables.fits`` and, at an offload rung, the host check of each cell with the other
    pipeline ranks on its nodes at their ``least`` (else most) host bytes in the window
    (module docstring, "Coupling of ranks"). ``shares[N, s]``: devices of rank ``s`` on node
    ``N``; ``caps[N]``: its host bytes."""
    valid = np.arange(tables.host.shape[1])[None, :, None] < tables.size[:, None, None]
    pick = np.min if least else np.max
    other = pick(np.where(valid, tables.host, np.inf if least else -np.inf), axis=1)  # (p, R)
    fits = tables.fits.copy()
    for N in range(len(caps)):
        own = shares[N]
        if not own.any():
            continue
        rest = (own[:, None] * other).sum(axis=0)                         # (R,)
        total = own[:, None, None] * tables.host + (rest[None, None, :]
                                                    - (own[:, None] * other)[:, None, :])
        ok = (total <= caps[N]) | (total == 0.0)
        on = own > 0
        fits[on] &= ok[on] | ~offloads[None, None, :]
    return fits


def _kinds(placed: ParallelConfig, rungs: Sequence[Rung],
           prof: SegmentProfile) -> list[np.ndarray | None]:
    """One rung mask per kind the tied holders may share (module docstring, "Coupling of
    ranks"), or ``[None]`` without tied weights on two ranks."""
    if prof.tied_params <= 0:
        return [None]
    kind = [(placed.uniform(z, o).shards_params_with_fsdp, o != "none") for z, o in rungs]
    return [np.array([k == one for k in kind]) for one in dict.fromkeys(kind)]


def _search(tables: _Tables, fits: np.ndarray, kinds: list[np.ndarray | None], scale: float,
            L: int, incumbent_s: float
            ) -> tuple[float, np.ndarray, np.ndarray] | None:
    """The least ``T̂`` below ``incumbent_s`` over every kind of the tied holders, as
    ``(T̂, window positions, rungs)``; ``None`` when none beats it."""
    best: tuple[float, np.ndarray, np.ndarray] | None = None
    bound = incumbent_s
    for kind in kinds:
        allowed = fits.copy()
        if kind is not None:
            allowed[[0, -1]] &= kind[None, None, :]
        found = _caps(tables, allowed, scale, L, bound)
        if found is not None and found[0] < bound:
            best, bound = found, found[0]
    return best


def _caps(tables: _Tables, allowed: np.ndarray, scale: float, L: int,
          bound: float) -> tuple[float, np.ndarray, np.ndarray] | None:
    """``min_W (m + b)·W + D(W)`` over the caps (``scale = m + b``), bounded by ``bound``
    (module docstring, "Few caps")."""
    w_min = _minmax(np.where(allowed, tables.w, np.inf).min(axis=2), tables, L)
    if w_min is None:
        return None
    caps = np.unique(tables.w[allowed])
    caps = caps[caps >= w_min[0]]
    best: list = [None, bound, np.inf]   # (T̂, positions, rungs), its T̂, its Σ_s w_s
    memo: dict[int, float] = {}

    def at(i: int) -> float:
        """``D(caps[i])``; the answer there, if better, kept."""
        if i not in memo:
            ok = allowed & (tables.w <= caps[i])
            e = np.where(ok, tables.e, np.inf)
            rung = np.argmin(e, axis=2)                                 # (p, K)
            found = _minmax(np.take_along_axis(e, rung[..., None], 2)[..., 0], tables, L,
                            tables.drain)
            memo[i] = np.inf if found is None else found[0]
            if found is not None:
                pos = found[1]
                s = np.arange(len(pos))
                w = tables.w[s, pos]
                cost = tables.e[s, pos] - drain_slack(tables.placed, tables.drain[s, pos])[:, None]
                r = least_work_rungs(w, cost, ok[s, pos], float(cost[s, rung[s, pos]].max()))
                t = float(scale * w[s, r].max() + cost[s, r].max())
                if before(t, float(w[s, r].sum()), best[1], best[2]):
                    best[:] = [(t, pos, r), t, float(w[s, r].sum())]
        return memo[i]

    last = len(caps) - 1
    at(0)
    stack = [(0, last)] if at(last) < np.inf else []
    while stack:
        a, z = stack.pop()
        if z - a < 2 or scale * caps[a + 1] + memo[z] >= best[1]:
            continue
        mid = (a + z) // 2
        at(mid)
        stack += [(a, mid), (mid, z)]
    return best[0]


def _minmax(f: np.ndarray, tables: _Tables, L: int,
            drain: np.ndarray | None = None) -> tuple[float, np.ndarray] | None:
    """The least ``max_s (f_s − δ_s)``, ``δ_s = Σ_{j<s} β_j``, of a split of ``L`` layers,
    ``f[s, k]`` and ``β = drain[s, k]`` rank ``s``'s values at ``lo_s + k`` layers (``drain``
    ``None``: ``δ = 0``, the min–max of ``f``), with each rank's window position; ``None``
    when every split is ``∞``. The DP over suffixes of the module docstring."""
    p, K = f.shape
    beta = np.zeros((p, K)) if drain is None else drain
    G = np.full(L + 1, np.inf)
    G[L] = -np.inf
    choice = np.zeros((p, L + 1), dtype=np.int64)
    starts = np.arange(L + 1)
    for s in range(p - 1, -1, -1):
        n = tables.lo[s] + np.arange(K)                                  # (K,)
        end = starts[None, :] + n[:, None]                               # (K, L+1)
        ok = (end <= L) & (np.arange(K) < tables.size[s])[:, None]
        val = np.where(ok, np.maximum(f[s][:, None], G[np.clip(end, 0, L)] - beta[s][:, None]),
                       np.inf)
        choice[s] = np.argmin(val, axis=0)
        G = val[choice[s], starts]
    if not np.isfinite(G[0]):
        return None
    pos, i = np.zeros(p, dtype=np.int64), 0
    for s in range(p):
        pos[s] = choice[s, i]
        i += int(tables.lo[s] + pos[s])
    return float(G[0]), pos


def _check(placed: ParallelConfig, rungs: Sequence[Rung], tables: _Tables,
           found: tuple[float, np.ndarray, np.ndarray], prof: SegmentProfile,
           profs: Sequence[SegmentProfile] | None,
           mems: DeviceMemory | tuple[DeviceMemory, ...], cluster: Cluster,
           incumbent_s: float = np.inf) -> tuple[ParallelConfig, float] | None:
    """The answer as a configuration on its own split with its ``T̂``
    (:func:`~fxplan.inter_op.surrogate.surrogate_step_s`), when every rank fits its device and
    its nodes' host memory there and the ``T̂`` is below ``incumbent_s`` past round-off."""
    _, pos, r = found
    counts = tuple(int(n) for n in tables.lo + pos)
    picked = [rungs[k] for k in r]
    split = placed.replace(stage_layers=counts)
    mixed = with_rungs(split, picked)
    if not (stage_totals(mixed, prof, mems) <= rank_limits(mems)).all():
        return None
    for rung in set(picked):
        if rung[1] != "none":
            on = split.uniform(*rung)
            ok = host_fit_ranks(on, stage_rows(on, prof, mems).rows["host"], cluster)
            if not ok[[s for s, x in enumerate(picked) if x == rung]].all():
                return None
    t = surrogate_step_s(mixed, prof, cluster, profs)
    return (mixed, t) if t < incumbent_s * (1.0 - ROUND_OFF) else None
