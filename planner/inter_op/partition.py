"""Split ``L`` layers into ``S`` contiguous pipeline stages: min–max time under a memory cap.

Layer ``i`` costs ``t_{j,i}`` seconds per microbatch on stage ``j`` (forward + backward +
recompute + tp comm; one row for every stage on one kind of device, a row per stage on a
heterogeneous cluster, :mod:`fxplan.inter_op.stage_devices`), keeps ``ψ_i`` bytes of model
state and ``a_i`` bytes of saved activations per microbatch in flight. Stage ``j``
(``0 … S−1`` in pipeline order, capacity ``cap_j``) holding layers ``[k, i)`` costs

    T_j(k, i) = e_j + P_{t,j}[i] − P_{t,j}[k]
    M_j(k, i) = c_j + (P_ψ[i] − P_ψ[k]) + n_j · (P_a[i] − P_a[k])   ≤ cap_j

with prefix sums ``P``, ``e_j`` the stage's extra time (embedding on stage 0, head and loss on
stage ``S−1``), ``c_j`` its fixed bytes (their states and activations, buffers, reserve) and
``n_j`` the microbatches it holds in flight (``min(S−j, m)`` for 1F1B, ``m`` for GPipe, the
schedule's own count for interleaved). Every stage holds at least one layer. The dynamic
program over prefixes

    D_0(i)   = T_0(0, i)                                   if M_0(0, i) ≤ cap_0 else ∞
    D_j(i)   = min_{k < i, M_j(k, i) ≤ cap_j} max(D_{j−1}(k), T_j(k, i))
    answer   = D_{S−1}(L)

is exact for contiguous partitions; each ``j`` is one vectorised ``(L+1)²`` step, so a
partition costs ``O(S·L²)`` flops in ``S`` numpy calls.

**Identical layers** (every repeated block of a GPT): the DP state collapses to the number of
layers placed, and stage ``j`` with ``n_j`` layers costs ``e_j + n_j·t_j`` and fits while
``n_j ≤ ν_j = ⌊(cap_j − c_j) / (ψ + n_j·a)⌋``. The optimum bottleneck is the smallest value
``T ∈ {e_j + n·t_j}`` with ``Σ_j min(ν_j, ⌊(T − e_j)/t_j⌋) ≥ L`` (feasibility is monotone in
``T``: binary search), then surplus layers are taken off the fullest stages
(:func:`_uniform_partition`, ``O(S·L)``, same answer as the DP). ``∞`` means no split fits; the pruning
message then quotes the memory of the most even split (:func:`balanced_counts`).

**Recompute chosen per stage** (:func:`partition_recompute`). Stage ``j`` may recompute its
first ``q_j`` layers under a policy ``ρ`` and keep the others whole: layer ``i`` then costs
``t^0_i`` and keeps ``a^0_i`` per microbatch, or ``t^ρ_i = t^0_i + δt_i`` and
``a^ρ_i = a^0_i − δa_i``; a stage that recomputes anything also holds ``ρ``'s working set,
``c^ρ_j = c^0_j + Δc_j``. For the span ``[k, i)`` with ``M^0_j(k, i)`` its bytes without
recompute, the fewest layers that make it fit are

    q_j(k, i) = 0                                                  if M^0_j(k, i) ≤ cap_j
              = min { q ≥ 1 : n_j·(P_δa[k+q] − P_δa[k]) ≥ M^0_j(k, i) + Δc_j − cap_j }
    T_j(k, i) = e_j + P_{t0}[i] − P_{t0}[k] + P_δt[k+q] − P_δt[k]     (∞ when q > i − k)

(a binary search in the prefix sums ``P_δa``), and the same DP over prefixes runs on these
``T_j``: the split and each stage's recompute are chosen together, so an early 1F1B stage,
holding ``p − j`` microbatches in flight, recomputes more layers than a late one (Mist,
EuroSys'25). For identical layers it is closed form: stage ``j`` with ``n`` layers needs

    q_j(n) = 0                                             if c^0_j + n·(ψ + n_j·a^0) ≤ cap_j
           = ⌈(c^0_j + Δc_j + n·(ψ + n_j·a^0) − cap_j) / (n_j·δa)⌉   else (fits while ≤ n)
    T_j(n) = e_j + n·t^0_j + q_j(n)·δt_j

both non-decreasing in ``n``, so the bottleneck search of the identical case applies to the
table ``T_j(n)`` (``O(S·L)`` per probe). ``q ≡ 0`` is the split without recompute and
``q_j = n_j`` everywhere the split with ``ρ`` on every layer: the answer is never slower than
either (under the same linearised memory).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

__all__ = ["Partition", "partition_layers", "partition_recompute", "balanced_counts"]


@dataclass(frozen=True)
class Partition:
    """Layer counts per stage, the bottleneck stage time and each stage's bytes."""

    counts: tuple[int, ...]
    bottleneck_s: float
    stage_time_s: tuple[float, ...]
    stage_bytes: tuple[float, ...]
    #: layers each stage recomputes (:func:`partition_recompute`); ``None``: as priced
    recomputed: tuple[int, ...] | None = None

    @property
    def bounds(self) -> tuple[tuple[int, int], ...]:
        """``[start, stop)`` layer range of each stage."""
        edges = np.concatenate([[0], np.cumsum(self.counts)]).astype(int)
        return tuple((int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]))


def _prefix(x: Sequence[float]) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(np.asarray(x, dtype=float))])


def _per_stage(values: Sequence[float] | np.ndarray | float, S: int, L: int | None) -> np.ndarray:
    """``values`` as one row per stage: ``(S, L)`` for per-layer arrays, ``(S,)`` for scalars
    (a read-only view where ``values`` has one row for all)."""
    arr = np.asarray(values, dtype=float)
    if L is None:
        return np.broadcast_to(arr, (S,))
    return np.broadcast_to(arr if arr.ndim == 2 else arr[None, :], (S, L))


def partition_layers(time: Sequence[float] | np.ndarray, state: Sequence[float],
                     acts: Sequence[float], extra_time: Sequence[float],
                     fixed_bytes: Sequence[float], inflight: Sequence[float],
                     cap: float | Sequence[float]) -> Partition | None:
    """The min–max partition of the module docstring, or ``None`` when none fits.

    ``time``: ``(L,)`` layer times, or ``(S, L)`` — layer ``i``'s time on stage ``j`` (its
    device group's); ``cap``: bytes, one for all stages or one per stage."""
    S, L = len(extra_time), np.shape(time)[-1]
    if S > L or S < 1:
        return None
    T, caps = _per_stage(time, S, L), _per_stage(cap, S, None)
    if L and np.ptp(T, axis=1).max() == 0 and all(
            np.ptp(np.asarray(x, dtype=float)) == 0 for x in (state, acts)):
        counts = _uniform_partition(T[:, 0], float(state[0]), float(acts[0]),
                                    np.asarray(extra_time, float), np.asarray(fixed_bytes, float),
                                    np.asarray(inflight, float), caps, L)
        return None if counts is None else _describe(counts, T, state, acts, extra_time,
                                                     fixed_bytes, inflight)
    Ppsi, Pa = _prefix(state), _prefix(acts)
    span_psi = Ppsi[None, :] - Ppsi[:, None]   # [k, i] = Σ_{k ≤ l < i} ψ_l
    span_a = Pa[None, :] - Pa[:, None]
    nonempty = np.triu(np.ones((L + 1, L + 1), dtype=bool), k=1)
    D = np.full(L + 1, np.inf)
    D[0] = 0.0
    choice = np.zeros((S, L + 1), dtype=np.int64)
    span_t = None
    for j in range(S):
        if span_t is None or not np.array_equal(T[j], T[j - 1]):
            Pt = _prefix(T[j])
            span_t = Pt[None, :] - Pt[:, None]
        mem = fixed_bytes[j] + span_psi + inflight[j] * span_a
        ok = nonempty & (mem <= caps[j])
        val = np.where(ok, np.maximum(D[:, None], span_t + extra_time[j]), np.inf)
        choice[j] = np.argmin(val, axis=0)
        D = val[choice[j], np.arange(L + 1)]
    if not np.isfinite(D[L]):
        return None
    counts, i = [], L
    for j in range(S - 1, -1, -1):
        k = int(choice[j, i])
        counts.append(i - k)
        i = k
    counts.reverse()
    return _describe(counts, T, state, acts, extra_time, fixed_bytes, inflight)


def _uniform_partition(t: np.ndarray, psi: float, a: float, extra: np.ndarray, fixed: np.ndarray,
                       inflight: np.ndarray, cap: np.ndarray, L: int) -> list[int] | None:
    """Identical layers (``t_j`` per stage): the bottleneck search of the module docstring."""
    per_layer = psi + inflight * a
    with np.errstate(divide="ignore", invalid="ignore"):
        nu = np.where(per_layer > 0, np.floor((cap - fixed) / np.where(per_layer > 0, per_layer, 1)),
                      np.where(fixed <= cap, L, -1))
    nu = np.minimum(nu, L)
    if (nu < 1).any() or nu.sum() < L:
        return None

    def take(T: float) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            by_time = np.where(t > 0, np.floor((T - extra) / np.where(t > 0, t, 1) + 1e-9), L)
        return np.minimum(nu, by_time)

    values = np.unique((extra[:, None] + t[:, None] * np.arange(1, L + 1)[None, :]).ravel())
    return _bottleneck(values, take, lambda n: extra + n * t, L)


def _bottleneck(values: np.ndarray, take: Callable[[float], np.ndarray],
                cost: Callable[[np.ndarray], np.ndarray], L: int) -> list[int] | None:
    """The smallest ``T`` of the sorted ``values`` at which the stages can take ``L`` layers
    (``take(T)``: each stage's most layers with time ``≤ T``; monotone in ``T``), then the
    surplus taken off the stages of largest ``cost(n)``, one layer at a time."""
    lo, hi = 0, len(values) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        n = take(values[mid])
        if (n >= 1).all() and n.sum() >= L:
            hi = mid
        else:
            lo = mid + 1
    if not len(values):
        return None
    n = take(values[lo]).astype(int)
    if (n < 1).any() or n.sum() < L:
        return None
    for _ in range(int(n.sum()) - L):
        j = int(np.argmax(np.where(n > 1, cost(n), -np.inf)))
        n[j] -= 1
    return [int(x) for x in n]


def partition_recompute(time: np.ndarray, time_r: np.ndarray, state: Sequence[float],
                        acts: Sequence[float], acts_r: Sequence[float],
                        extra_time: Sequence[float], fixed_bytes: Sequence[float],
                        fixed_r: Sequence[float], inflight: Sequence[float],
                        cap: float | Sequence[float]) -> Partition | None:
    """The split and the layers each stage recomputes (module docstring, "Recompute chosen
    per stage"), or ``None`` when nothing fits even with every layer recomputed.

    ``time``/``acts``/``fixed_bytes``: the layers and stages without recompute; ``time_r``,
    ``acts_r``, ``fixed_r``: the same under the policy ``ρ`` (``fixed_r − fixed_bytes`` is
    ``ρ``'s working set); shapes as :func:`partition_layers`'s."""
    S, L = len(extra_time), np.shape(time)[-1]
    if S > L or S < 1:
        return None
    T0, Tr = _per_stage(time, S, L), _per_stage(time_r, S, L)
    caps = _per_stage(cap, S, None)
    extra, fixed0, n_in = (np.asarray(x, dtype=float) for x in (extra_time, fixed_bytes,
                                                                 inflight))
    dfixed = np.asarray(fixed_r, dtype=float) - fixed0
    psi = np.asarray(state, dtype=float)
    a0 = np.asarray(acts, dtype=float)
    da = np.maximum(0.0, a0 - np.asarray(acts_r, dtype=float))
    dT = Tr - T0
    if np.ptp(T0, axis=1).max() == 0 and np.ptp(dT, axis=1).max() == 0 and all(
            np.ptp(x) == 0 for x in (psi, a0, da)):
        table, need = _recompute_table(T0[:, 0], dT[:, 0], float(psi[0]), float(a0[0]),
                                       float(da[0]), extra, fixed0, dfixed, n_in, caps, L)
        rows = np.arange(S)

        def take(T: float) -> np.ndarray:
            return (table[:, 1:] <= T).sum(axis=1)

        least = _least_bottleneck(table[:, 1:], L)
        counts = None if least is None else \
            _bottleneck(np.array([least]), take, lambda n: table[rows, n], L)
        if counts is None:
            return None
        q = need[rows, counts].tolist()
    else:
        found = _recompute_dp(T0, dT, psi, a0, da, extra, fixed0, dfixed, n_in, caps, S, L)
        if found is None:
            return None
        counts, q = found
    edges = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    Pt0 = np.concatenate([np.zeros((S, 1)), np.cumsum(T0, axis=1)], axis=1)
    PdT = np.concatenate([np.zeros((S, 1)), np.cumsum(dT, axis=1)], axis=1)
    Ppsi, Pa, Pda = _prefix(psi), _prefix(a0), _prefix(da)
    j, a, b, qs = np.arange(S), edges[:-1], edges[1:], np.asarray(q, dtype=int)
    times = (extra + Pt0[j, b] - Pt0[j, a] + PdT[j, a + qs] - PdT[j, a]).tolist()
    mems = (fixed0 + np.where(qs > 0, dfixed, 0.0) + Ppsi[b] - Ppsi[a]
            + n_in * (Pa[b] - Pa[a] - (Pda[a + qs] - Pda[a]))).tolist()
    return Partition(tuple(int(n) for n in counts), max(times), tuple(times), tuple(mems),
                     tuple(int(n) for n in q))


def _least_bottleneck(table: np.ndarray, L: int) -> float | None:
    """The smallest ``T`` at which stages with times ``T_j(n)`` (``table[j, n−1]``,
    non-decreasing in ``n``, ``∞`` where the stage cannot hold ``n`` layers) can take ``L``
    layers with at least one each, or ``None``: stage ``j`` takes ``#{n : T_j(n) ≤ T}``, so
    the stages take ``#{(j, n) : T_j(n) ≤ T}`` in all, ``≥ L`` from the ``L``-th smallest
    entry on, and each at least one from ``max_j T_j(1)`` on —

        T* = max(L-th smallest T_j(n), max_j T_j(1))

    the value the bottleneck search over the sorted entries (:func:`_bottleneck`) ends at."""
    finite = table[np.isfinite(table)]
    if len(finite) < L or not np.isfinite(table[:, 0]).all():
        return None
    return max(float(np.partition(finite, L - 1)[L - 1]), float(table[:, 0].max()))


def _recompute_table(t0: np.ndarray, dt: np.ndarray, psi: float, a0: float, da: float,
                     extra: np.ndarray, fixed0: np.ndarray, dfixed: np.ndarray,
                     inflight: np.ndarray, cap: np.ndarray, L: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Identical layers: ``T_j(n)`` and ``q_j(n)`` for ``n = 0 … L`` (``(S, L+1)`` each; ``∞``
    where stage ``j`` cannot hold ``n`` layers, and at ``n = 0``)."""
    n = np.arange(L + 1, dtype=float)[None, :]
    bare = fixed0[:, None] + n * (psi + inflight[:, None] * a0)
    saving = inflight[:, None] * da
    with np.errstate(divide="ignore", invalid="ignore"):
        need = np.where(bare <= cap[:, None], 0.0,
                        np.where(saving > 0, np.ceil((bare + dfixed[:, None] - cap[:, None])
                                                     / np.where(saving > 0, saving, 1.0)),
                                 np.inf))
    ok = need <= n
    ok[:, 0] = False
    table = np.where(ok, extra[:, None] + n * t0[:, None] + np.where(ok, need, 0.0)
                     * dt[:, None], np.inf)
    return table, np.where(ok, need, 0).astype(int)


def _recompute_dp(T0: np.ndarray, dT: np.ndarray, psi: np.ndarray, a0: np.ndarray,
                  da: np.ndarray, extra: np.ndarray, fixed0: np.ndarray, dfixed: np.ndarray,
                  inflight: np.ndarray, caps: np.ndarray, S: int, L: int
                  ) -> tuple[list[int], list[int]] | None:
    """The DP over prefixes with ``T_j(k, i)`` and ``q_j(k, i)`` of the module docstring."""
    Ppsi, Pa, Pda = _prefix(psi), _prefix(a0), _prefix(da)
    span_psi = Ppsi[None, :] - Ppsi[:, None]
    span_a = Pa[None, :] - Pa[:, None]
    rows = np.arange(L + 1)[:, None]
    cols = np.arange(L + 1)[None, :]
    nonempty = cols > rows
    D = np.full(L + 1, np.inf)
    D[0] = 0.0
    choice = np.zeros((S, L + 1), dtype=np.int64)
    recomputed = np.zeros((S, L + 1), dtype=np.int64)
    for j in range(S):
        Pt, Pdt = _prefix(T0[j]), _prefix(dT[j])
        bare = fixed0[j] + span_psi + inflight[j] * span_a
        fits = bare <= caps[j]
        target = Pda[:, None] + (bare + dfixed[j] - caps[j]) / inflight[j]
        end = np.searchsorted(Pda, target.ravel(), side="left").reshape(target.shape)
        q = np.where(fits, 0, np.maximum(end - rows, 1))
        ok = nonempty & (fits | (end <= cols))
        stop = np.minimum(rows + np.where(ok, q, 0), L)
        span_t = Pt[None, :] - Pt[:, None] + Pdt[stop] - Pdt[rows] + extra[j]
        val = np.where(ok, np.maximum(D[:, None], span_t), np.inf)
        choice[j] = np.argmin(val, axis=0)
        D = val[choice[j], np.arange(L + 1)]
        recomputed[j] = np.where(ok, q, 0)[choice[j], np.arange(L + 1)]
    if not np.isfinite(D[L]):
        return None
    counts, q_out, i = [], [], L
    for j in range(S - 1, -1, -1):
        k = int(choice[j, i])
        counts.append(i - k)
        q_out.append(int(recomputed[j, i]))
        i = k
    return counts[::-1], q_out[::-1]


def _describe(counts: Sequence[int], time: np.ndarray, state: Sequence[float],
              acts: Sequence[float], extra_time: Sequence[float], fixed_bytes: Sequence[float],
              inflight: Sequence[float]) -> Partition:
    """``time`` is ``(S, L)``: layer times on each stage's device."""
    Ppsi, Pa = _prefix(state), _prefix(acts)
    edges = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    times = tuple(float(extra_time[j] + _prefix(time[j])[b] - _prefix(time[j])[a])
                  for j, (a, b) in enumerate(zip(edges[:-1], edges[1:])))
    mems = tuple(float(fixed_bytes[j] + Ppsi[b] - Ppsi[a] + inflight[j] * (Pa[b] - Pa[a]))
                 for j, (a, b) in enumerate(zip(edges[:-1], edges[1:])))
    return Partition(tuple(int(n) for n in counts), max(times), times, mems)


def balanced_counts(layers: int, stages: int) -> tuple[int, ...]:
    """``layers`` split as evenly as possible, the larger stages first (used to report the
    memory of the lightest split when no split fits)."""
    q, r = divmod(layers, stages)
    return tuple(q + (1 if j < r else 0) for j in range(stages))
