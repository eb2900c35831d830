"""Pipeline schedules as per-stage op orders with cross-stage dependencies.

A schedule for ``p`` stages, ``v`` model chunks per stage and ``m`` microbatches is, for each
stage ``s``, the order in which it runs its ``2·m·v`` ops ``F(mb, c)`` (forward of microbatch
``mb`` through chunk ``c``) and ``B(mb, c)`` (its backward). Virtual stage ``j = c·p + s``
holds the ``j``-th slice of the layers (Megatron's interleaved assignment), so the data
dependencies are::

    F(s, mb, c) ← F(s−1, mb, c)          s > 0
                ← F(p−1, mb, c−1)        s = 0, c > 0   (wrap to the next chunk)
    B(s, mb, c) ← B(s+1, mb, c)          s < p−1
                ← B(0, mb, c+1)          s = p−1, c < v−1
                ← F(p−1, mb, v−1)        s = p−1, c = v−1 (the loss; same stage)

The orders (what each stage runs next, whatever has arrived):

- ``gpipe``: all ``m`` forwards, then all ``m`` backwards.
- ``1f1b`` (PipeDream-Flush, Megatron's non-interleaved schedule): stage ``s`` runs
  ``w = min(p−s−1, m)`` warm-up forwards, then alternates one forward and one backward for
  the remaining ``m − w`` microbatches, then drains ``w`` backwards.
- ``interleaved:v`` (Megatron ``forward_backward_pipelining_with_interleaving``): ``m·v``
  virtual microbatches; virtual forward ``k`` runs chunk ``(k mod p·v) // p`` on microbatch
  ``(k // p·v)·p + k mod p`` (backwards visit the chunks in reverse); warm-up
  ``w = min(2·(p−s−1) + (v−1)·p, m·v)`` forwards (all of them when ``m = p``), then 1F1B on
  virtual microbatches, then the drain.

- ``zb:v`` (torch's ``ScheduleInterleavedZeroBubble``, ZB1P of Qi et al., "Zero Bubble
  Pipeline Parallelism", ICLR 2024): the backward is split into ``B`` (the input gradient,
  sent to the previous stage at once) and ``W`` (the weight gradient, which nothing waits
  for). The order is torch's: with ``r = max(1, m // p)`` rounds of ``q = m / r``
  microbatches, ``w = min((v−1)·q + (p−1−s), m·v)`` warm-up forwards, then each step one
  ``F`` and one ``B`` — and, from step ``s`` on, the ``W`` of the oldest ``B`` still
  waiting —, the cool-down's ``B`` (each with its delayed ``W``), then the ``W`` left.
  Stage ``s`` thus holds up to ``s`` weight gradients back while the pipeline drains, which
  fills its drain bubble.
- ``zbv`` (torch's ``ScheduleZBVZeroBubble``, ZB-V of the same paper): ``v = 2`` chunks in a
  V, stage ``s`` holding virtual stages ``s`` (chunk 0) and ``2p−1−s`` (chunk 1), so the
  loss and the first forward are both on stage 0. Warm-up ``2(p−s)−1`` forwards of chunk 0,
  ``s`` pairs ``F1 F0``, ``p−s`` triples ``F1 B1 W1``; steady state ``F0 B0 W0 F1 B1 W1``;
  cool-down ``s`` pairs ``B0 B1``, ``p−s`` pairs ``B0 W0``, then the ``W`` left; torch builds
  it for ``max(2p−1, m)`` microbatches and drops the ops of microbatches ``≥ m``.
- ``dualpipev`` (torch's ``ScheduleDualPipeV``: DeepSeek's DualPipe, DeepSeek-V3 report
  2024, folded into the same V; ``m ≥ 2p``): stage ``s`` runs ``2(p−s−1)`` forwards of chunk
  0, ``s+1`` pairs ``F0 F1``, ``p−s−1`` triples ``B1 W F1``; then the main phase, ``m−2p+s+1``
  times ``(F0 & B1) (F1 & B0)``, then ``p−s−1`` times ``B1 (F1 & B0)``; the cool-down
  alternates ``B1 B0`` for ``2(s+1)`` backwards, ``p−s−1`` times ``W B0``, then ``s+1`` ``W``.
  Every ``W`` is the oldest split backward's. ``F & B`` is torch's ``OVERLAP_F_B``: a
  forward and a backward of two different microbatches meant to overlap one's compute with
  the other's communication; torch runs it as the forward, then the backward, unless a custom
  overlap function is registered (fxplan registers none), so it is priced as the two in
  sequence, with no compute overlap. Most backwards are whole (torch's ``FULL_BACKWARD``,
  here a ``B`` with its ``W`` right after it): those in an ``F & B`` pair, the lone ``B1``
  and the first ``s+1`` of the cool-down; the others (warm-up's ``B1``, the cool-down's last
  ``s+1`` and its ``B0``) are split, their ``W`` run later in the bubbles.

For the V, the dependencies read virtual stages: ``F`` of virtual stage ``j`` waits for ``F``
of ``j−1``, ``B`` of ``j`` for ``B`` of ``j+1`` (the last virtual stage for its own ``F``),
each located at the ``(stage, chunk)`` of :meth:`~fxplan.core.schedule.Schedule.placement`.
``W`` waits for nothing but its stage's order (its ``B`` runs earlier on the same stage).
An op's output leaves its stage when torch sends it: right after the op, except under
``dualpipev``, where a whole backward sends its input gradient after its ``W`` and an
``F & B`` pair sends both outputs after the pair, so what waits for them waits for those
ends (``dep_pos`` points there).

Peak in-flight microbatches (forwards whose backward has not run) fall out of the orders:
``m`` on every stage for GPipe, ``min(p−s, m)`` for 1F1B, and ``w + 1`` chunk-microbatches
for interleaved, i.e. on stage 0 ``(v+1)·p − 1`` chunks of ``L/(p·v)`` layers
``= L·(1 + (p−1)/(p·v))`` layer-activations (Korthikanti et al. 2022, §4.2.3). Under a split
backward a microbatch stays in flight until its ``W``: torch's ``stage_backward_input`` keeps
the autograd graph (every saved tensor) for ``stage_backward_weight``, so the memory of a
delayed ``W`` is the whole activation of its microbatch.

Everything here depends only on ``(kind, p, v, m)`` and is cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

__all__ = ["FORWARD", "BACKWARD", "WEIGHT", "SPLIT_BACKWARD", "InflightCounts", "ScheduleOrder",
           "inflight_counts", "schedule_order"]

FORWARD = 0
#: the backward; under a split backward (:data:`SPLIT_BACKWARD`) its input-gradient part
BACKWARD = 1
#: the weight-gradient part of a split backward
WEIGHT = 2
#: Schedule kinds whose backward is split into ``B`` and ``W``.
SPLIT_BACKWARD: tuple[str, ...] = ("zb", "zbv", "dualpipev")
#: Schedule kinds whose two chunks sit in a V.
V_SHAPED: tuple[str, ...] = ("zbv", "dualpipev")


@dataclass(frozen=True, eq=False)
class ScheduleOrder:
    """Per-stage op orders as ``(p, K)`` integer arrays: ``K = 2·m·v`` ops per stage (a
    forward and a backward per microbatch and chunk), ``K = 3·m·v`` where the backward is split
    into ``B`` and ``W``.

    ``kind[s, k]`` is :data:`FORWARD`, :data:`BACKWARD` or (a split backward's weight
    gradient) :data:`WEIGHT`, ``microbatch`` and ``chunk`` the op's microbatch and model
    chunk; ``dep_stage``/``dep_pos`` locate the op it waits for (``dep_pos = -1``: none);
    ``inflight_peak[s, c]`` is the most microbatches of chunk ``c`` stage ``s`` holds at once
    and ``inflight_total[s]`` the most over all its chunks.
    """

    name: str
    stages: int
    chunks: int
    microbatches: int
    kind: np.ndarray
    microbatch: np.ndarray
    chunk: np.ndarray
    dep_stage: np.ndarray
    dep_pos: np.ndarray
    inflight_peak: np.ndarray
    inflight_total: np.ndarray

    @property
    def ops_per_stage(self) -> int:
        return self.kind.shape[1]

    @property
    def split_backward(self) -> bool:
        """Whether the backward runs as ``B`` and ``W`` ops."""
        return bool((self.kind == WEIGHT).any())

    @property
    def release_kind(self) -> int:
        """The op after which a microbatch's activations are freed and its chunk's gradients
        final: :data:`WEIGHT` under a split backward, else :data:`BACKWARD`."""
        return WEIGHT if self.split_backward else BACKWARD

    def peak_inflight(self, weights: np.ndarray) -> np.ndarray:
        """``(p,)``: the peak over time of ``Σ_c n_c(τ)·weights[s, c]`` on each stage, where
        ``n_c(τ)`` counts the microbatches of chunk ``c`` forwarded and not yet backwarded."""
        return self.counts.peak_inflight(weights)

    def peak_held(self, saved: np.ndarray, pending: np.ndarray | None) -> np.ndarray:
        """:meth:`InflightCounts.peak_held` of this order."""
        return self.counts.peak_held(saved, pending)

    @property
    def counts(self) -> "InflightCounts":
        """The order's :class:`InflightCounts` (profiles cached per order)."""
        return InflightCounts(self.stages, self.inflight_peak, _inflight_profiles(self),
                              *_held_of(self))

    def last_backward_pos(self) -> np.ndarray:
        """``(p, v)``: position of the last backward (its ``W`` under a split backward) of
        each chunk on each stage (its gradients are final when it ends)."""
        p, v = self.stages, self.chunks
        release = self.release_kind
        out = np.zeros((p, v), dtype=np.int64)
        for s in range(p):
            for c in range(v):
                out[s, c] = np.flatnonzero((self.kind[s] == release) & (self.chunk[s] == c))[-1]
        return out


@dataclass(frozen=True, eq=False)
class InflightCounts:
    """What the memory model reads of a :class:`ScheduleOrder` — the stage count, the
    in-flight peaks and the per-chunk in-flight counts after each forward — without the op
    arrays: a few hundred bytes where the order holds ``5·p·K`` integers, so the search keeps
    one for every ``(kind, p, v, m)`` it visits (:func:`inflight_counts`)."""

    stages: int
    inflight_peak: np.ndarray               # (p, v), as ScheduleOrder.inflight_peak
    profiles: tuple[np.ndarray, ...]        # per stage, (n, v): _inflight_profiles
    #: under a split backward, the most microbatches of each chunk between their ``B`` and
    #: their ``W`` at once, ``(p, v)``, and per stage the distinct rows ``(n_c, n^W_c)`` of
    #: both counts right after each ``F`` and each ``B`` (:func:`_held_profiles`); ``None``
    #: without one
    pending_peak: np.ndarray | None = None
    held_profiles: tuple[np.ndarray, ...] | None = None

    @cached_property
    def padded(self) -> np.ndarray:
        """``(p, n, v)``: :attr:`profiles` stacked, each padded to the longest by repeating its
        last row (a repeated row leaves every stage's maximum as it is)."""
        n = max(len(rows) for rows in self.profiles)
        return np.stack([np.concatenate([rows, np.repeat(rows[-1:], n - len(rows), axis=0)])
                         for rows in self.profiles])

    def peak_inflight(self, weights: np.ndarray) -> np.ndarray:
        """:meth:`ScheduleOrder.peak_inflight`, every stage at once: ``max_τ Σ_c
        n_c(τ)·w[s, c]`` over the rows of :attr:`padded` (one batched product, each stage's
        the one ``profiles[s] @ w[s]`` gives)."""
        return np.matmul(self.padded, weights[:, :, None])[:, :, 0].max(axis=1)

    def peak_held(self, saved: np.ndarray, pending: np.ndarray | None) -> np.ndarray:
        """``(p,)``: the peak over time of ``Σ_c n_c(τ)·saved[s, c] + n^W_c(τ)·pending[s, c]``,
        ``n^W_c(τ)`` the microbatches of chunk ``c`` past their ``B`` and not yet at their
        ``W``: what a recomputed block holds under a split backward, whose recompute (in the
        ``B``) is kept for the ``W`` (:mod:`fxplan.passes.rewrite.split_recompute`) — its
        checkpointed input from ``F`` to ``W`` (in ``saved``) and its recomputed activations
        from ``B`` to ``W`` (``pending``). The total can peak right after a ``B`` as well as
        after an ``F``; every row of both is read. :meth:`peak_inflight` of ``saved`` where
        nothing is pending (no split backward, or ``pending`` ``None`` or zero)."""
        if self.held_profiles is None or pending is None or not np.any(pending):
            return self.peak_inflight(saved)
        both = np.concatenate([np.asarray(saved, float), np.asarray(pending, float)], axis=1)
        return np.array([float((rows @ both[s]).max())
                         for s, rows in enumerate(self.held_profiles)])


@lru_cache(maxsize=1 << 13)
def inflight_counts(kind: str, stages: int, chunks: int, microbatches: int) -> InflightCounts:
    """The cached :class:`InflightCounts` of :func:`schedule_order`'s order, read off the op
    kinds and chunks alone (:func:`_op_arrays`; the dependencies are not needed), kept for
    every ``(kind, p, v, m)`` the search visits (:func:`schedule_order` keeps only the most
    recent orders). One chunk per stage (GPipe, 1F1B), the count grows only at forwards, one at
    a time, so it passes every value from 1 to its peak right after a forward: the profile
    of stage ``s`` is ``1, 2, …, n_s`` with ``n_s = m`` (GPipe) or ``min(p − s, m)`` (1F1B)."""
    if kind in ("gpipe", "1f1b") and chunks == 1:
        peak = np.minimum(stages - np.arange(stages), microbatches) if kind == "1f1b" \
            else np.full(stages, microbatches)
        return InflightCounts(stages, peak[:, None],
                              tuple(np.arange(1.0, n + 1.0)[:, None] for n in peak))
    kinds, _, chunk, _ = _op_arrays(kind, stages, chunks, microbatches, numbered=False)
    counts = _chunk_counts(kinds, chunk, chunks)
    return InflightCounts(stages, counts.max(axis=1), _profiles(kinds, counts),
                          *_held_profiles(kinds, chunk, chunks, counts))


def _held_profiles(kinds: np.ndarray, chunk: np.ndarray, v: int, counts: np.ndarray
                   ) -> tuple[np.ndarray | None, tuple[np.ndarray, ...] | None]:
    """``(pending_peak, held_profiles)`` of :class:`InflightCounts` from the ``(p, K)`` op
    arrays and their :func:`_chunk_counts`: ``n^W_c`` steps up at a split backward's ``B`` and
    down at its ``W``; the rows ``(n_c, n^W_c)`` right after every ``F`` and ``B``, distinct
    per stage. ``(None, None)`` without a split backward."""
    if not (kinds == WEIGHT).any():
        return None, None
    step = np.where(kinds == BACKWARD, 1, np.where(kinds == WEIGHT, -1, 0))
    pending = np.stack([np.cumsum(np.where(chunk == c, step, 0), axis=1) for c in range(v)],
                       axis=-1)
    both = np.concatenate([counts, pending], axis=-1)
    at = (kinds == FORWARD) | (kinds == BACKWARD)
    profiles = tuple(_unique_rows(both[s][at[s]]).astype(float) for s in range(len(kinds)))
    return pending.max(axis=1), profiles


@lru_cache(maxsize=256)
def _held_of(order: ScheduleOrder) -> tuple[np.ndarray | None, tuple[np.ndarray, ...] | None]:
    """:func:`_held_profiles` of ``order``."""
    return _held_profiles(order.kind, order.chunk, order.chunks,
                          _chunk_counts(order.kind, order.chunk, order.chunks))


def _signs(kinds: np.ndarray) -> np.ndarray:
    """+1 at a forward, −1 where a microbatch's activations are released (its ``W`` under a
    split backward, else its backward), 0 at a split backward's ``B``."""
    release = WEIGHT if (kinds == WEIGHT).any() else BACKWARD
    return np.where(kinds == FORWARD, 1, np.where(kinds == release, -1, 0))


@lru_cache(maxsize=256)
def _inflight_profiles(order: ScheduleOrder) -> tuple[np.ndarray, ...]:
    """:func:`_profiles` of ``order``."""
    return _profiles(order.kind, _chunk_counts(order.kind, order.chunk, order.chunks))


def _chunk_counts(kinds: np.ndarray, chunk: np.ndarray, v: int) -> np.ndarray:
    """``(p, K, v)``: the microbatches of each chunk each stage holds right after each of its
    ops (``kinds``, ``chunk``: the ``(p, K)`` op arrays)."""
    signs = _signs(kinds)
    return np.stack([np.cumsum(np.where(chunk == c, signs, 0), axis=1) for c in range(v)],
                    axis=-1)


def _profiles(kinds: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per stage, the distinct per-chunk in-flight counts right after each forward (the only
    places a weighted total can peak), as ``(n, v)`` arrays; ``counts``: :func:`_chunk_counts`
    of the ``(p, K)`` op kinds ``kinds``."""
    forward = kinds == FORWARD
    # every stage's rows at once, the stage as their first column: sorted by stage, then row
    stage = np.nonzero(forward)[0]
    rows = _unique_rows(np.column_stack([stage, counts[forward]]))
    ends = np.searchsorted(rows[:, 0], np.arange(1, kinds.shape[0]))
    return tuple(part[:, 1:].astype(float) for part in np.split(rows, ends))


def _unique_rows(rows: np.ndarray) -> np.ndarray:
    """``np.unique(rows, axis=0)`` of small integer rows (sorted lexicographically), each row
    packed into one integer first, its first column the most significant digit in base
    ``max − min + 1``: ``np.unique`` along an axis sorts a structured view, and was most of
    the time of building the search's in-flight counts."""
    if rows.size == 0 or rows.ndim != 2:
        return np.unique(rows, axis=0)
    low = rows.min(axis=0)
    base = int((rows.max(axis=0) - low).max()) + 1
    if base ** rows.shape[1] >= 1 << 62:
        return np.unique(rows, axis=0)
    code = np.zeros(len(rows), dtype=np.int64)
    for k in range(rows.shape[1]):
        code = code * base + (rows[:, k] - low[k])
    keys = np.unique(code)
    out = np.empty((len(keys), rows.shape[1]), dtype=rows.dtype)
    for k in range(rows.shape[1] - 1, -1, -1):
        out[:, k] = keys % base + low[k]
        keys = keys // base
    return out


def _warmup_steady_drain(kind: str, p: int, v: int, m: int
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(kind, microbatch, chunk)`` op arrays, ``(p, 2·m·v)`` each, of ``gpipe``, ``1f1b`` and
    ``interleaved:v`` (module docstring): stage ``s`` runs ``w_s`` warm-up forwards, then
    alternates a forward and a backward, then drains the backwards, over the ``n = m·v``
    virtual microbatches (``w_s = n`` for GPipe; ``v = 1`` but for interleaved). Forward
    ``k`` and backward ``k`` of stage ``s`` thus sit at

        pos_F(k) = k                    k < w_s       pos_B(k) = w_s + 2k + 1    k < n − w_s
                 = w_s + 2(k − w_s)     else                   = n + k           else

    and virtual microbatch ``k`` is microbatch ``(k div p·v)·p + k mod p`` of chunk
    ``(k mod p·v) div p`` (the backwards visit the chunks in reverse)."""
    n = m * v
    s = np.arange(p)
    if kind == "gpipe":
        warmup = np.full(p, n)
    elif kind == "1f1b":
        warmup = np.minimum(p - s - 1, m)
    else:
        warmup = np.full(p, n) if m == p else np.minimum(2 * (p - s - 1) + (v - 1) * p, n)
    k = np.arange(n)[None, :]
    w = warmup[:, None]
    forward = np.where(k < w, k, w + 2 * (k - w))
    backward = np.where(k < n - w, w + 2 * k + 1, n + k)
    group = p * v
    microbatch = (k // group) * p + k % p
    chunk = (k % group) // p
    rows = np.broadcast_to(s[:, None], (p, n))
    kinds = np.empty((p, 2 * n), dtype=np.int64)
    mbs = np.empty((p, 2 * n), dtype=np.int64)
    chs = np.empty((p, 2 * n), dtype=np.int64)
    kinds[rows, forward], kinds[rows, backward] = FORWARD, BACKWARD
    mbs[rows, forward], mbs[rows, backward] = microbatch, microbatch
    chs[rows, forward], chs[rows, backward] = chunk, v - 1 - chunk
    return kinds, mbs, chs


def _numbered(kinds: np.ndarray, chunks: np.ndarray, v: int) -> np.ndarray:
    """Each op's microbatch where the ops of one kind and chunk take the microbatches in
    order: how many ops of its kind and chunk come before it on its stage (``(p, K)`` op
    arrays, the order along the last axis)."""
    code = (kinds * v + chunks)[..., None]
    seen = np.cumsum(code == np.arange(3 * v), axis=-2)
    return np.take_along_axis(seen, code, axis=-1)[..., 0] - 1


def _zero_bubble(p: int, v: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """torch's ``ScheduleInterleavedZeroBubble`` order (module docstring) as ``(p, K)`` kind
    and chunk arrays. Over steps ``t = 0, 1, …`` (``n = m·v`` virtual microbatches, ``w_s``
    stage ``s``'s warm-up, ``q`` microbatches a round) step ``t`` of stage ``s`` runs

        F of chunk (t div q) mod v                 t < n
        B of chunk v−1 − ((t−w_s) div q) mod v      w_s ≤ t < w_s + n
        W of the B of step t − s                   w_s + s ≤ t < w_s + s + n

    (so ``s`` weight gradients wait, the last ``s`` run after the last ``B``): ``3n`` ops on
    every stage."""
    rounds = max(1, m // p)
    q = m // rounds
    n = m * v
    s = np.arange(p)[:, None]
    w = np.minimum((v - 1) * q + (p - 1 - s), n)
    t = np.arange(int((w + s).max()) + n)[None, :]

    def b_chunk(step: np.ndarray) -> np.ndarray:
        return v - 1 - ((step - w) // q) % v

    present = np.stack([np.broadcast_to(t < n, (p, t.shape[1])), (t >= w) & (t < w + n),
                        (t >= w + s) & (t < w + s + n)], axis=-1)
    chunks = np.stack([np.broadcast_to((t // q) % v, (p, t.shape[1])), b_chunk(t),
                       b_chunk(t - s)], axis=-1)
    kinds = np.broadcast_to(np.array([FORWARD, BACKWARD, WEIGHT]), present.shape)
    return kinds[present].reshape(p, 3 * n), chunks[present].reshape(p, 3 * n)


def _repeated(*phases: tuple[tuple[tuple[int, ...], ...], int]) -> np.ndarray:
    """The op rows of ``phases`` run in turn, each a pattern of rows (``(kind, chunk, …)``)
    repeated a number of times (none when it is ``≤ 0``)."""
    return np.concatenate([np.tile(np.array(pattern, dtype=np.int64), (max(times, 0), 1))
                           for pattern, times in phases])


def _zbv(p: int, s: int, m: int) -> np.ndarray:
    """torch's ``ScheduleZBVZeroBubble`` order of stage ``s`` (module docstring) as ``(6n, 2)``
    ``(kind, chunk)`` rows; chunk 0 is virtual stage ``s``, chunk 1 virtual stage ``2p−1−s``.
    torch builds it
    for ``n = max(2p−1, m)`` microbatches: warm-up ``2(p−s)−1`` ``F0``, ``s`` pairs
    ``F1 F0``, ``p−s`` triples ``F1 B1 W1``; ``n−p`` steady steps ``F0 B0 W0 F1 B1 W1``, the
    last ``p−s−1`` without their ``F0`` (chunk 0 has run its ``n`` forwards); cool-down ``s``
    pairs ``B0 B1``, ``p−s`` pairs ``B0 W0``, then the ``s`` ``W1`` and ``s`` ``W0`` left
    (the ops of microbatches ``≥ m`` are dropped by :func:`_op_arrays`)."""
    n = max(2 * p - 1, m)
    F, B, W = FORWARD, BACKWARD, WEIGHT
    rows = _repeated((((F, 0),), 2 * (p - s) - 1),
                              (((F, 1), (F, 0)), s),
                              (((F, 1), (B, 1), (W, 1)), p - s),
                              (((F, 0), (B, 0), (W, 0), (F, 1), (B, 1), (W, 1)), n - 2 * p + s + 1),
                              (((B, 0), (W, 0), (F, 1), (B, 1), (W, 1)), p - s - 1),
                              (((B, 0), (B, 1)), s),
                              (((B, 0), (W, 0)), p - s),
                              (((W, 1),), s),
                              (((W, 0),), s))
    return rows


def _dualpipev(p: int, s: int, m: int) -> np.ndarray:
    """torch's ``ScheduleDualPipeV`` order of stage ``s`` (module docstring) as ``(6m, 4)``
    ``(kind, chunk, later, waits)`` rows: the op's output leaves the stage ``later`` ops
    after it (a whole backward's input gradient after its ``W``, both outputs of an
    ``F & B`` pair after the pair). Built from the module docstring's phases with each op's
    chunk and ``later``; the forwards and backwards of a chunk take its microbatches in
    order, a ``W`` right after its ``B`` is that ``B``'s (``waits = 0``), and the other ``W``
    take the split backwards still waiting (``waits = 1``), oldest first
    (:func:`_dualpipev_numbered`)."""
    F, B, W = FORWARD, BACKWARD, WEIGHT
    # (kind, chunk, later, waits): a split backward whose W waits (waits = 1), a W taking
    # the oldest of them (waits = 1, chunk set below), else a W right after its own B
    f0, f1, pf0, pf1 = (F, 0, 0, 0), (F, 1, 0, 0), (F, 0, 2, 0), (F, 1, 2, 0)
    whole0, whole1 = ((B, 0, 1, 0), (W, 0, 0, 0)), ((B, 1, 1, 0), (W, 1, 0, 0))
    oldest = (W, 0, 0, 1)
    steps = m - 2 * p + s + 1
    apart = 1 if s == p - 1 and steps > 0 else 0   # torch keeps this first pair apart
    drain = 1 - np.arange(2 * (s + 1)) % 2          # the cool-down's backwards' chunks
    rows = np.concatenate([
        _repeated(((f0,), 2 * (p - s - 1)),
                  ((f0, f1), s + 1),
                  (((B, 1, 0, 0), (W, 1, 0, 0), f1), p - s - 1),
                  ((f0, *whole1, pf1, *whole0), apart),
                  ((pf0, *whole1, pf1, *whole0), steps - apart),
                  ((*whole1, pf1, *whole0), p - s - 1)),
        *(np.array(whole1 if c else whole0, dtype=np.int64) for c in drain[:s + 1]),
        np.array([(B, c, 0, 1) for c in drain[s + 1:]], dtype=np.int64).reshape(-1, 4),
        _repeated(((oldest, (B, 0, 0, 1)), p - s - 1), ((oldest,), s + 1))])
    kinds, chunks, waits = rows[:, 0], rows[:, 1], rows[:, 3]
    chunks[(kinds == W) & (waits == 1)] = chunks[(kinds == B) & (waits == 1)]
    return rows


def _dualpipev_numbered(rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(kind, microbatch, chunk, later)`` ``(p, K)`` arrays of :func:`_dualpipev`'s rows
    of every stage (``(p, K, 4)``): a ``W`` right after its ``B`` takes that ``B``'s
    microbatch, the ``k``-th ``W`` that waits the ``k``-th split backward's."""
    kinds, chunks, later, waits = (rows[..., k] for k in range(4))
    mbs = _numbered(kinds, chunks, 2)
    after = (kinds == WEIGHT) & (waits == 0)
    after[:, 0] = False
    mbs[:, 1:][after[:, 1:]] = mbs[:, :-1][after[:, 1:]]
    mbs[(kinds == WEIGHT) & (waits == 1)] = mbs[(kinds == BACKWARD) & (waits == 1)]
    return kinds, mbs, chunks, later


def _op_arrays(kind: str, p: int, v: int, m: int, numbered: bool = True
               ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray | None]:
    """``(kind, microbatch, chunk)`` op arrays, ``(p, K)`` each, of ``kind``'s order, and under
    ``dualpipev`` how many ops after each op its output is sent (``None`` elsewhere: right
    after it). ``numbered=False``: the microbatches may be left out (``None``; the in-flight
    counts read only the kinds and chunks)."""
    if kind in ("gpipe", "1f1b") and v != 1:
        raise ValueError(f"{kind} runs one model chunk per stage, got v={v}")
    if kind in ("gpipe", "1f1b", "interleaved"):
        return (*_warmup_steady_drain(kind, p, v, m), None)
    if kind == "zb":
        kinds, chunks = _zero_bubble(p, v, m)
        return kinds, _numbered(kinds, chunks, v) if numbered else None, chunks, None
    if kind == "zbv":
        if v != 2:
            raise ValueError(f"zbv runs two model chunks per stage, got v={v}")
        rows = np.stack([_zbv(p, s, m) for s in range(p)])    # (p, 6n, 2), n ≥ m
        if not numbered and m >= 2 * p - 1:                    # n = m: nothing dropped
            return rows[..., 0], None, rows[..., 1], None
        mbs = _numbered(rows[..., 0], rows[..., 1], 2)
        kept = mbs < m                                         # 6m ops on every stage
        return (rows[..., 0][kept].reshape(p, -1), mbs[kept].reshape(p, -1),
                rows[..., 1][kept].reshape(p, -1), None)
    if kind == "dualpipev":
        if v != 2 or m < 2 * p:
            raise ValueError(f"dualpipev runs two model chunks per stage and m ≥ 2p "
                             f"microbatches, got v={v}, p={p}, m={m}")
        rows = np.stack([_dualpipev(p, s, m) for s in range(p)])
        if not numbered:
            return rows[..., 0], None, rows[..., 1], rows[..., 2]
        return _dualpipev_numbered(rows)
    raise ValueError(f"unknown schedule {kind!r}")


@lru_cache(maxsize=256)
def schedule_order(kind: str, stages: int, chunks: int, microbatches: int) -> ScheduleOrder:
    """The cached :class:`ScheduleOrder` of ``kind`` (``gpipe``, ``1f1b``, ``interleaved``,
    ``zb``, ``zbv``, ``dualpipev``)."""
    p, v, m = stages, chunks, microbatches
    kinds, mbs, chs, later = _op_arrays(kind, p, v, m)
    K = kinds.shape[1]
    position = np.zeros((p, 3, m, v), dtype=np.int64)
    stage_idx = np.repeat(np.arange(p), K)
    position[stage_idx, kinds.ravel(), mbs.ravel(), chs.ravel()] = np.tile(np.arange(K), p)
    dep_stage, dep_pos = _dependencies(kinds, mbs, chs, position, p, v, kind in V_SHAPED)
    if later is not None:   # wait for the op after which the output is sent
        sent = np.arange(K)[None, :] + later
        dep_pos = np.where(dep_pos >= 0, sent[dep_stage, np.maximum(dep_pos, 0)], dep_pos)
    peak = _chunk_counts(kinds, chs, v).max(axis=1)    # (p, v)
    total = np.cumsum(_signs(kinds), axis=1).max(axis=1)
    name = (f"interleaved:{v}" if kind == "interleaved" else
            (f"zb:{v}" if v > 1 else "zb") if kind == "zb" else kind)
    for array in (kinds, mbs, chs, dep_stage, dep_pos, peak, total):
        array.setflags(write=False)
    return ScheduleOrder(name, p, v, m, kinds, mbs, chs, dep_stage, dep_pos, peak, total)


def _dependencies(kinds: np.ndarray, mbs: np.ndarray, chs: np.ndarray, position: np.ndarray,
                  p: int, v: int, v_shape: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``dep_stage``/``dep_pos`` arrays from the rules in the module docstring: each op's
    virtual stage ``j`` (loop or V placement), ``F`` waiting for ``F`` of ``j−1``, ``B`` for
    ``B`` of ``j+1`` (the last virtual stage for its own ``F``), ``W`` for nothing."""
    S = p * v
    rank_of = np.empty(S, dtype=np.int64)
    chunk_of = np.empty(S, dtype=np.int64)
    virtual = np.empty((p, v), dtype=np.int64)
    for s in range(p):
        for c in range(v):
            j = (s if c == 0 else 2 * p - 1 - s) if v_shape else c * p + s
            virtual[s, c] = j
            rank_of[j], chunk_of[j] = s, c
    stage = np.broadcast_to(np.arange(p)[:, None], kinds.shape)
    j = virtual[stage, chs]
    fwd = kinds == FORWARD
    loss = j == S - 1
    prev, nxt = np.maximum(j - 1, 0), np.minimum(j + 1, S - 1)
    dep_stage = np.where(fwd, rank_of[prev], np.where(loss, stage, rank_of[nxt]))
    dep_chunk = np.where(fwd, chunk_of[prev], np.where(loss, chs, chunk_of[nxt]))
    dep_kind = np.where(fwd | loss, FORWARD, BACKWARD)
    dep_pos = position[dep_stage, dep_kind, mbs, dep_chunk]
    dep_pos = np.where((fwd & (j == 0)) | (kinds == WEIGHT), -1, dep_pos)
    return dep_stage, dep_pos
