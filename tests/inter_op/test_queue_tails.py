"""The closed form's gradient reductions as one stream serves them
(:func:`fxplan.inter_op.rank_parts._queue_tails`) against the queue itself: each rank's
segments in backward order (its chunks last to first, each one's layers last to first), each
reduction ready when its segment's backward ends, served first come first served; what
outlasts the backward (``ω``-scaled, as the closed form hides it) is exposed."""

from __future__ import annotations

import types

import numpy as np
import pytest

from fxplan.core.schedule import Schedule
from fxplan.inter_op.rank_parts import _queue_tails


def _served(c, profs, edges, per_layer, ends, overlap) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Walk each rank's queue: ``t = max(t, ready_k) + d_k``; exposed ``max(0, t − end)``."""
    p, v = c.pp, c.virtual_stages
    L = len(per_layer)
    out = np.zeros(p)
    for s in range(p):
        own = profs[s]
        items = []   # (segment index in [pre, layers, post], its backward, its reduction)
        for k in range(v):
            j = c.schedule.virtual_stage(s, k, p)
            segs = list(range(int(edges[j]) + 1, int(edges[j + 1]) + 1))
            if j == 0:
                segs = [0] + segs
            if j == p * v - 1:
                segs = segs + [L + 1]
            for i in segs:
                back = (own.pre[1] if i == 0 else own.post[1] if i == L + 1
                        else own.bwd[i - 1] + own.tp_bwd[i - 1]) / v
                d = ends[0] if i == 0 else ends[1] if i == L + 1 else per_layer[i - 1]
                items.append((back, d))
        clock, stream = 0.0, 0.0
        for back, d in reversed(items):   # the backward runs the forward order in reverse
            clock += overlap[s] * back
            stream = max(stream, clock) + d
        out[s] = max(0.0, stream - clock)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_closed_form_is_the_queue(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(40):
        p = int(rng.integers(1, 6))
        kind = str(rng.choice(["1f1b", "interleaved", "zbv"])) if p > 1 else "1f1b"
        v = 1 if kind == "1f1b" else 2
        L = int(rng.integers(p * v, p * v + 12))
        cuts = (np.sort(rng.choice(np.arange(1, L), p * v - 1, replace=False))
                if p * v > 1 else np.array([], dtype=int))
        edges = np.concatenate([[0], cuts, [L]])
        c = types.SimpleNamespace(pp=p, virtual_stages=v,
                                  schedule=Schedule(kind, v) if v > 1 else Schedule("1f1b"))

        def profile():  # type: ignore[no-untyped-def]
            return types.SimpleNamespace(bwd=rng.random(L), tp_bwd=0.1 * rng.random(L),
                                         pre=(0.0, rng.random(), 0.0, 0.0),
                                         post=(0.0, rng.random(), 0.0, 0.0))

        base = profile()
        per_rank = [profile() for _ in range(p)] if rng.random() < 0.5 else None
        per_layer, ends, overlap = 3 * rng.random(L), 3 * rng.random(2), rng.random(p)
        got = _queue_tails(c, base, per_rank, edges, per_layer, ends, overlap)
        want = _served(c, per_rank or [base] * p, edges, per_layer, ends, overlap)
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12)
