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

Peak in-flight microbatches (forwards whose backward has not run) fall out of the orders:
``m`` on every stage for GPipe, ``min(p−s, m)`` for 1F1B, and ``w + 1`` chunk-microbatches
for interleaved, i.e. on stage 0 ``(v+1)·p − 1`` chunks of ``L/(p·v)`` layers
``= L·(1 + (p−1)/(p·v))`` layer-activations (Korthikanti et al. 2022, §4.2.3).

Everything here depends only on ``(kind, p, v, m)`` and is cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

__all__ = ["FORWARD", "BACKWARD", "ScheduleOrder", "schedule_order"]

FORWARD = 0
BACKWARD = 1


@dataclass(frozen=True, eq=False)
class ScheduleOrder:
    """Per-stage op orders as ``(p, K)`` integer arrays, ``K = 2·m·v``.

    ``kind[s, k]`` is :data:`FORWARD` or :data:`BACKWARD`, ``microbatch`` and ``chunk`` the
    op's microbatch and model chunk; ``dep_stage``/``dep_pos`` locate the op it waits for
    (``dep_pos = -1``: none); ``inflight_peak[s, c]`` is the most microbatches of chunk
    ``c`` stage ``s`` holds at once and ``inflight_total[s]`` the most over all its chunks.
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

    def peak_inflight(self, weights: np.ndarray) -> np.ndarray:
        """``(p,)``: the peak over time of ``Σ_c n_c(τ)·weights[s, c]`` on each stage, where
        ``n_c(τ)`` counts the microbatches of chunk ``c`` forwarded and not yet backwarded."""
        profiles = _inflight_profiles(self)
        return np.array([float((profiles[s] @ weights[s]).max()) for s in range(self.stages)])

    def last_backward_pos(self) -> np.ndarray:
        """``(p, v)``: position of the last backward of each chunk on each stage (its
        gradients are final when it ends)."""
        p, v = self.stages, self.chunks
        out = np.zeros((p, v), dtype=np.int64)
        for s in range(p):
            for c in range(v):
                out[s, c] = np.flatnonzero((self.kind[s] == BACKWARD) & (self.chunk[s] == c))[-1]
        return out


@lru_cache(maxsize=256)
def _inflight_profiles(order: ScheduleOrder) -> tuple[np.ndarray, ...]:
    """Per stage, the distinct per-chunk in-flight counts right after each forward (the only
    places a weighted total can peak), as ``(n, v)`` arrays."""
    signs = np.where(order.kind == FORWARD, 1, -1)
    counts = np.stack([np.cumsum(np.where(order.chunk == c, signs, 0), axis=1)
                       for c in range(order.chunks)], axis=-1)          # (p, K, v)
    forward = order.kind == FORWARD
    return tuple(np.unique(counts[s][forward[s]], axis=0).astype(float)
                 for s in range(order.stages))


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


@lru_cache(maxsize=256)
def schedule_order(kind: str, stages: int, chunks: int, microbatches: int) -> ScheduleOrder:
    """The cached :class:`ScheduleOrder` of ``kind`` (``gpipe``, ``1f1b``, ``interleaved``)."""
    p, v, m = stages, chunks, microbatches
    if kind == "interleaved":
        rows = [_interleaved(p, v, s, m) for s in range(p)]
    elif kind in ("gpipe", "1f1b"):
        if v != 1:
            raise ValueError(f"{kind} runs one model chunk per stage, got v={v}")
        build = _gpipe if kind == "gpipe" else _one_f_one_b
        rows = [build(p, s, m) for s in range(p)]
    else:
        raise ValueError(f"unknown schedule {kind!r}")
    ops = np.asarray(rows, dtype=np.int64)  # (p, K, 3)
    kinds, mbs, chs = ops[..., 0], ops[..., 1], ops[..., 2]
    position = np.empty((p, 2, m, v), dtype=np.int64)
    stage_idx = np.repeat(np.arange(p), ops.shape[1])
    position[stage_idx, kinds.ravel(), mbs.ravel(), chs.ravel()] = np.tile(
        np.arange(ops.shape[1]), p)
    dep_stage, dep_pos = _dependencies(kinds, mbs, chs, position, p, v)
    signs = np.where(kinds == FORWARD, 1, -1)
    peak = np.zeros((p, v), dtype=np.int64)
    for c in range(v):
        peak[:, c] = np.cumsum(np.where(chs == c, signs, 0), axis=1).max(axis=1)
    total = np.cumsum(signs, axis=1).max(axis=1)
    name = f"interleaved:{v}" if kind == "interleaved" else kind
    for array in (kinds, mbs, chs, dep_stage, dep_pos, peak, total):
        array.setflags(write=False)
    return ScheduleOrder(name, p, v, m, kinds, mbs, chs, dep_stage, dep_pos, peak, total)


def _dependencies(kinds: np.ndarray, mbs: np.ndarray, chs: np.ndarray, position: np.ndarray,
                  p: int, v: int) -> tuple[np.ndarray, np.ndarray]:
    """``dep_stage``/``dep_pos`` arrays from the rules in the module docstring."""
    stage = np.broadcast_to(np.arange(p)[:, None], kinds.shape)
    fwd = kinds == FORWARD
    # Forward: previous stage, same chunk; stage 0 wraps to the last stage, previous chunk.
    f_stage = np.where(stage > 0, stage - 1, p - 1)
    f_chunk = np.where(stage > 0, chs, chs - 1)
    f_kind = np.full_like(kinds, FORWARD)
    f_none = (stage == 0) & (chs == 0)
    # Backward: next stage, same chunk; the last stage wraps to stage 0, next chunk; the
    # last virtual stage waits for its own forward (the loss).
    last = stage == p - 1
    b_stage = np.where(last, 0, stage + 1)
    b_chunk = np.where(last, chs + 1, chs)
    b_kind = np.full_like(kinds, BACKWARD)
    loss = last & (chs == v - 1)
    b_stage = np.where(loss, stage, b_stage)
    b_chunk = np.where(loss, chs, b_chunk)
    b_kind = np.where(loss, FORWARD, b_kind)
    dep_stage = np.where(fwd, f_stage, b_stage)
    dep_chunk = np.clip(np.where(fwd, f_chunk, b_chunk), 0, v - 1)
    dep_kind = np.where(fwd, f_kind, b_kind)
    dep_pos = position[dep_stage, dep_kind, mbs, dep_chunk]
    dep_pos = np.where(fwd & f_none, -1, dep_pos)
    return dep_stage, dep_pos
