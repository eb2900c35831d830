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
each located at the ``(stage, chunk)`` of :meth:`~fxplan.core.config.Schedule.placement`.
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
from functools import lru_cache

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
        return InflightCounts(self.stages, self.inflight_peak,
                              _inflight_profiles(self)).peak_inflight(weights)

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

    def peak_inflight(self, weights: np.ndarray) -> np.ndarray:
        """:meth:`ScheduleOrder.peak_inflight`."""
        return np.array([float((self.profiles[s] @ weights[s]).max())
                         for s in range(self.stages)])


@lru_cache(maxsize=1 << 13)
def inflight_counts(kind: str, stages: int, chunks: int, microbatches: int) -> InflightCounts:
    """The cached :class:`InflightCounts` of :func:`schedule_order`'s order (which keeps only
    the most recent orders: the search visits thousands of ``(kind, p, v, m)``)."""
    order = schedule_order(kind, stages, chunks, microbatches)
    return InflightCounts(order.stages, order.inflight_peak, _inflight_profiles(order))


def _signs(kinds: np.ndarray) -> np.ndarray:
    """+1 at a forward, −1 where a microbatch's activations are released (its ``W`` under a
    split backward, else its backward), 0 at a split backward's ``B``."""
    release = WEIGHT if (kinds == WEIGHT).any() else BACKWARD
    return np.where(kinds == FORWARD, 1, np.where(kinds == release, -1, 0))


@lru_cache(maxsize=256)
def _inflight_profiles(order: ScheduleOrder) -> tuple[np.ndarray, ...]:
    """Per stage, the distinct per-chunk in-flight counts right after each forward (the only
    places a weighted total can peak), as ``(n, v)`` arrays."""
    signs = _signs(order.kind)
    counts = np.stack([np.cumsum(np.where(order.chunk == c, signs, 0), axis=1)
                       for c in range(order.chunks)], axis=-1)          # (p, K, v)
    forward = order.kind == FORWARD
    return tuple(_unique_rows(counts[s][forward[s]]).astype(float)
                 for s in range(order.stages))


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


def _gpipe(p: int, s: int, m: int) -> list[tuple[int, int, int]]:
    return [(FORWARD, mb, 0) for mb in range(m)] + [(BACKWARD, mb, 0) for mb in range(m)]


def _one_f_one_b(p: int, s: int, m: int) -> list[tuple[int, int, int]]:
    warmup = min(p - s - 1, m)
    ops = [(FORWARD, mb, 0) for mb in range(warmup)]
    for k in range(m - warmup):
        ops += [(FORWARD, warmup + k, 0), (BACKWARD, k, 0)]
    return ops + [(BACKWARD, mb, 0) for mb in range(m - warmup, m)]


def _interleaved(p: int, v: int, s: int, m: int) -> list[tuple[int, int, int]]:
    total = m * v
    group = p * v

    def virtual(k: int, kind: int) -> tuple[int, int, int]:
        chunk = (k % group) // p
        if kind == BACKWARD:
            chunk = v - 1 - chunk
        return (kind, (k // group) * p + k % p, chunk)

    warmup = total if m == p else min(2 * (p - s - 1) + (v - 1) * p, total)
    ops = [virtual(k, FORWARD) for k in range(warmup)]
    for k in range(total - warmup):
        ops += [virtual(warmup + k, FORWARD), virtual(k, BACKWARD)]
    return ops + [virtual(k, BACKWARD) for k in range(total - warmup, total)]


def _zero_bubble(p: int, v: int, s: int, m: int) -> list[tuple[int, int, int]]:
    """torch's ``ScheduleInterleavedZeroBubble`` order of stage ``s`` (module docstring)."""
    rounds = max(1, m // p)
    per_round = m // rounds
    warmup = min((v - 1) * per_round + (p - 1 - s), m * v)
    total = m * v
    steady = total - warmup
    counters = {FORWARD: [0] * v, BACKWARD: [0] * v, WEIGHT: [0] * v}

    def op(kind: int, chunk: int) -> tuple[int, int, int]:
        mb = counters[kind][chunk]
        counters[kind][chunk] += 1
        return (kind, mb, chunk)

    def f_chunk(step: int) -> int:
        return (step // per_round) % v

    def b_chunk(step: int) -> int:
        return v - 1 - ((step - warmup) // per_round) % v

    ops: list[tuple[int, int, int]] = []
    backward_steps: list[int] = []
    weights = 0
    for step in range(warmup + steady + warmup):
        if step < warmup:
            ops.append(op(FORWARD, f_chunk(step)))
            continue
        if step < warmup + steady:
            ops.append(op(FORWARD, f_chunk(step)))
        ops.append(op(BACKWARD, b_chunk(step)))
        backward_steps.append(step)
        if step - warmup >= s:
            ops.append(op(WEIGHT, b_chunk(backward_steps[weights])))
            weights += 1
    for step in backward_steps[weights:]:
        ops.append(op(WEIGHT, b_chunk(step)))
    return ops


def _zbv(p: int, s: int, m: int) -> list[tuple[int, int, int]]:
    """torch's ``ScheduleZBVZeroBubble`` order of stage ``s`` (module docstring); chunk 0 is
    virtual stage ``s``, chunk 1 virtual stage ``2p−1−s``."""
    n = max(2 * p - 1, m)
    ops: list[tuple[int, int, int]] = []
    count = {(k, c): 0 for k in (FORWARD, BACKWARD, WEIGHT) for c in (0, 1)}

    def add(kind: int, chunk: int) -> None:
        ops.append((kind, count[kind, chunk], chunk))
        count[kind, chunk] += 1

    for _ in range(2 * (p - s) - 1):
        add(FORWARD, 0)
    for _ in range(s):
        add(FORWARD, 1)
        add(FORWARD, 0)
    for _ in range(p - s):
        add(FORWARD, 1)
        add(BACKWARD, 1)
        add(WEIGHT, 1)
    while count[FORWARD, 1] < count[FORWARD, 0] or count[FORWARD, 0] < n:
        if count[FORWARD, 0] < n:
            add(FORWARD, 0)
        add(BACKWARD, 0)
        add(WEIGHT, 0)
        add(FORWARD, 1)
        add(BACKWARD, 1)
        add(WEIGHT, 1)
    weights = {0: count[BACKWARD, 0], 1: count[BACKWARD, 1]}
    for _ in range(s):
        add(BACKWARD, 0)
        add(BACKWARD, 1)
    for _ in range(p - s):
        add(BACKWARD, 0)
        ops.append((WEIGHT, weights[0], 0))
        weights[0] += 1
    for chunk in (1, 0):
        while weights[chunk] < count[BACKWARD, chunk]:
            ops.append((WEIGHT, weights[chunk], chunk))
            weights[chunk] += 1
    return [o for o in ops if o[1] < m]


def _dualpipev(p: int, s: int, m: int) -> list[tuple[int, int, int, int]]:
    """torch's ``ScheduleDualPipeV`` order of stage ``s`` (module docstring) as ``(kind,
    microbatch, chunk, later)``: the op's output leaves the stage ``later`` ops after it
    (a whole backward's input gradient after its ``W``, both outputs of an ``F & B`` pair
    after the pair)."""
    ops: list[tuple[int, int, int, int]] = []
    issued = {(k, c): 0 for k in (FORWARD, BACKWARD) for c in (0, 1)}
    unweighted: list[tuple[int, int]] = []      # split backwards whose W has not run, oldest first

    def take(kind: int, chunk: int) -> int:
        issued[kind, chunk] += 1
        return issued[kind, chunk] - 1

    def forward(chunk: int, later: int = 0) -> None:
        ops.append((FORWARD, take(FORWARD, chunk), chunk, later))

    def backward(chunk: int, whole: bool) -> None:
        mb = take(BACKWARD, chunk)
        ops.append((BACKWARD, mb, chunk, 1 if whole else 0))
        if whole:
            ops.append((WEIGHT, mb, chunk, 0))
        else:
            unweighted.append((mb, chunk))

    def weight() -> None:
        if unweighted:
            mb, chunk = unweighted.pop(0)
            ops.append((WEIGHT, mb, chunk, 0))

    def pair(f_chunk: int, b_chunk: int) -> None:   # OVERLAP_F_B, run in sequence
        forward(f_chunk, later=2)
        backward(b_chunk, whole=True)

    for _ in range(2 * (p - s - 1)):
        forward(0)
    for _ in range(s + 1):
        forward(0)
        forward(1)
    for _ in range(p - s - 1):
        backward(1, whole=False)
        weight()
        forward(1)
    for i in range(m - 2 * p + s + 1):
        if i == 0 and s == p - 1:   # torch keeps this first pair apart (a smaller bubble)
            forward(0)
            backward(1, whole=True)
        else:
            pair(0, 1)
        pair(1, 0)
    for _ in range(p - s - 1):
        backward(1, whole=True)
        pair(1, 0)
    for i in range(2 * (s + 1)):
        backward(1 - i % 2, whole=i < s + 1)
    for _ in range(p - s - 1):
        weight()
        backward(0, whole=False)
    for _ in range(s + 1):
        weight()
    return ops


@lru_cache(maxsize=256)
def schedule_order(kind: str, stages: int, chunks: int, microbatches: int) -> ScheduleOrder:
    """The cached :class:`ScheduleOrder` of ``kind`` (``gpipe``, ``1f1b``, ``interleaved``,
    ``zb``, ``zbv``, ``dualpipev``)."""
    p, v, m = stages, chunks, microbatches
    later = None
    if kind == "interleaved":
        rows = [_interleaved(p, v, s, m) for s in range(p)]
    elif kind == "zb":
        rows = [_zero_bubble(p, v, s, m) for s in range(p)]
    elif kind == "zbv":
        if v != 2:
            raise ValueError(f"zbv runs two model chunks per stage, got v={v}")
        rows = [_zbv(p, s, m) for s in range(p)]
    elif kind == "dualpipev":
        if v != 2 or m < 2 * p:
            raise ValueError(f"dualpipev runs two model chunks per stage and m ≥ 2p "
                             f"microbatches, got v={v}, p={p}, m={m}")
        full = np.asarray([_dualpipev(p, s, m) for s in range(p)], dtype=np.int64)
        rows, later = full[..., :3], full[..., 3]
    elif kind in ("gpipe", "1f1b"):
        if v != 1:
            raise ValueError(f"{kind} runs one model chunk per stage, got v={v}")
        build = _gpipe if kind == "gpipe" else _one_f_one_b
        rows = [build(p, s, m) for s in range(p)]
    else:
        raise ValueError(f"unknown schedule {kind!r}")
    ops = np.asarray(rows, dtype=np.int64)  # (p, K, 3)
    kinds, mbs, chs = ops[..., 0], ops[..., 1], ops[..., 2]
    position = np.zeros((p, 3, m, v), dtype=np.int64)
    stage_idx = np.repeat(np.arange(p), ops.shape[1])
    position[stage_idx, kinds.ravel(), mbs.ravel(), chs.ravel()] = np.tile(
        np.arange(ops.shape[1]), p)
    dep_stage, dep_pos = _dependencies(kinds, mbs, chs, position, p, v, kind in V_SHAPED)
    if later is not None:   # wait for the op after which the output is sent
        sent = np.arange(ops.shape[1])[None, :] + later
        dep_pos = np.where(dep_pos >= 0, sent[dep_stage, np.maximum(dep_pos, 0)], dep_pos)
    signs = _signs(kinds)
    peak = np.zeros((p, v), dtype=np.int64)
    for c in range(v):
        peak[:, c] = np.cumsum(np.where(chs == c, signs, 0), axis=1).max(axis=1)
    total = np.cumsum(signs, axis=1).max(axis=1)
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
