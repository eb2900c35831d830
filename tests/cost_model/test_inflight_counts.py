"""The schedules' in-flight counts as the search reads them (:func:`fxplan.cost_model.
pipeline_schedules.inflight_counts`): the same numbers as the full op order's, for every
schedule kind, with the distinct rows found by packing each row into one integer."""

from __future__ import annotations

import numpy as np
import pytest

from fxplan.cost_model.step.pipeline_schedules import (BACKWARD, FORWARD, _inflight_profiles,
                                                       _unique_rows, inflight_counts,
                                                       schedule_order)

KINDS = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 4), ("zb", 1),
         ("zb", 2), ("zbv", 2), ("dualpipev", 2))


def test_unique_rows_is_numpys_unique_along_rows() -> None:
    rng = np.random.default_rng(0)
    for v in (1, 2, 3, 4):
        for _ in range(100):
            rows = rng.integers(-3, 9, size=(int(rng.integers(0, 40)), v))
            want, got = np.unique(rows, axis=0), _unique_rows(rows)
            assert got.dtype == want.dtype and got.shape == want.shape
            assert (got == want).all()


@pytest.mark.parametrize("kind,v", KINDS)
def test_counts_equal_the_orders(kind: str, v: int) -> None:
    rng = np.random.default_rng(1)
    for p in (2, 4):
        m = 4 * p
        order, counts = schedule_order(kind, p, v, m), inflight_counts(kind, p, v, m)
        assert counts.stages == order.stages
        assert (counts.inflight_peak == order.inflight_peak).all()
        weights = rng.uniform(0, 1e9, size=(p, v))
        assert (counts.peak_inflight(weights) == order.peak_inflight(weights)).all()


def _warmup_steady_drain_reference(kind: str, p: int, v: int, s: int, m: int) -> list[tuple]:
    """Stage ``s``'s order of ``gpipe``, ``1f1b`` and ``interleaved:v`` written op by op from
    the module docstring's rule: ``w`` warm-up forwards, one forward and one backward at a
    time, then the drain, over the ``m·v`` virtual microbatches."""
    n, group = m * v, p * v
    warmup = {"gpipe": n, "1f1b": min(p - s - 1, m)}.get(
        kind, n if m == p else min(2 * (p - s - 1) + (v - 1) * p, n))

    def op(k: int, what: int) -> tuple:
        chunk = (k % group) // p
        return (what, (k // group) * p + k % p, v - 1 - chunk if what == BACKWARD else chunk)

    ops = [op(k, FORWARD) for k in range(warmup)]
    for k in range(n - warmup):
        ops += [op(warmup + k, FORWARD), op(k, BACKWARD)]
    return ops + [op(k, BACKWARD) for k in range(n - warmup, n)]


@pytest.mark.parametrize("kind,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2),
                                    ("interleaved", 3)])
def test_vectorised_orders_follow_the_rule(kind: str, v: int) -> None:
    for p in (1, 2, 3, 5):
        for m in sorted({1, 2, p, 2 * p, 3 * p + (0 if v > 1 else 1)}):
            if v > 1 and m % p:
                continue
            order = schedule_order(kind, p, v, m)
            for s in range(p):
                ours = list(zip(order.kind[s].tolist(), order.microbatch[s].tolist(),
                                order.chunk[s].tolist()))
                assert ours == _warmup_steady_drain_reference(kind, p, v, s, m), (p, m, s)


@pytest.mark.parametrize("kind,v", KINDS)
def test_counts_equal_the_orders_on_more_shapes(kind: str, v: int) -> None:
    """The closed form of one chunk (GPipe, 1F1B: the profile ``1 … n_s``) and the counts read
    off the op kinds alone, against the full order's, where ``m`` is below, at and above
    ``p``."""
    rng = np.random.default_rng(2)
    for p in (1, 3, 5):
        for m in sorted({1, p, 2 * p, 3 * p + 1}):
            try:
                order = schedule_order(kind, p, v, m)
            except (ValueError, IndexError):   # a shape the schedule does not run
                continue
            counts = inflight_counts(kind, p, v, m)
            assert (counts.inflight_peak == order.inflight_peak).all()
            assert [c.tolist() for c in counts.profiles] == \
                [c.tolist() for c in _inflight_profiles(order)]
            weights = rng.uniform(0, 1e9, size=(p, v))
            assert (counts.peak_inflight(weights) == order.peak_inflight(weights)).all()


def _held_by_walking(order, saved: np.ndarray, pending: np.ndarray) -> list[float]:
    """Each stage's peak of what its microbatches hold, walked op by op with the microbatch
    numbers: a forward adds its chunk's ``saved``, a split backward's ``B`` adds ``pending``
    (the recompute kept for the ``W``), the ``W`` (or a whole backward) frees both."""
    peaks = []
    for s in range(order.stages):
        held, peak, state = 0.0, 0.0, {}
        for kind, mb, c in zip(order.kind[s].tolist(), order.microbatch[s].tolist(),
                               order.chunk[s].tolist()):
            if kind == FORWARD:
                state[(mb, c)] = saved[s, c]
            elif kind == BACKWARD and order.split_backward:
                state[(mb, c)] += pending[s, c]
            else:
                del state[(mb, c)]
            held = sum(state.values())
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


@pytest.mark.parametrize("kind,v", KINDS)
def test_held_bytes_equal_a_walk_through_the_order(kind: str, v: int) -> None:
    """``peak_held`` (the in-flight rows and the ``B``-to-``W`` rows, the search's cached
    counts and the full order's) against a walk through the numbered op order; without a
    split backward it is ``peak_inflight``, and with one it exceeds it only by what is
    pending."""
    rng = np.random.default_rng(3)
    for p in (2, 3, 4):
        for m in sorted({p, 2 * p, 3 * p + 1}):
            try:
                order = schedule_order(kind, p, v, m)
            except (ValueError, IndexError):
                continue
            counts = inflight_counts(kind, p, v, m)
            saved, pending = rng.uniform(0, 1e9, size=(2, p, v))
            want = _held_by_walking(order, saved, pending)
            assert np.allclose(counts.peak_held(saved, pending), want, rtol=1e-12)
            assert np.allclose(order.peak_held(saved, pending), want, rtol=1e-12)
            plain = counts.peak_inflight(saved)
            if order.split_backward:
                assert (counts.pending_peak >= 1).all()
                assert (np.asarray(want) > plain).all()
            else:
                assert counts.pending_peak is None
                assert np.allclose(want, plain, rtol=1e-12)
