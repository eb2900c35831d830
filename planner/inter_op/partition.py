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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["Partition", "partition_layers", "balanced_counts"]


@dataclass(frozen=True)
class Partition:
    """Layer counts per stage, the bottleneck stage time and each stage's bytes."""

    counts: tuple[int, ...]
    bottleneck_s: float
    stage_time_s: tuple[float, ...]
    stage_bytes: tuple[float, ...]

    @property
    def bounds(self) -> tuple[tuple[int, int], ...]:
        """``[start, stop)`` layer range of each stage."""
        edges = np.concatenate([[0], np.cumsum(self.counts)]).astype(int)
        return tuple((int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]))


def _prefix(x: Sequence[float]) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(np.asarray(x, dtype=float))])


def _per_stage(values: Sequence[float] | np.ndarray | float, S: int, L: int | None) -> np.ndarray:
    """``values`` as one row per stage: ``(S, L)`` for per-layer arrays, ``(S,)`` for scalars."""
    arr = np.asarray(values, dtype=float)
    if L is None:
        return np.broadcast_to(arr, (S,)).astype(float)
    return np.broadcast_to(arr if arr.ndim == 2 else arr[None, :], (S, L)).astype(float)


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
    lo, hi = 0, len(values) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        n = take(values[mid])
        if (n >= 1).all() and n.sum() >= L:
            hi = mid
        else:
            lo = mid + 1
    n = take(values[lo]).astype(int)
    if (n < 1).any() or n.sum() < L:
        return None
    for _ in range(int(n.sum()) - L):
        j = int(np.argmax(np.where(n > 1, extra + n * t, -np.inf)))
        n[j] -= 1
    return [int(x) for x in n]


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
