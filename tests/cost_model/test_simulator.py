"""Pipeline timelines: event-driven reference, closed-form bubbles, in-flight microbatches,
and the data-parallel overlap of the step."""

from __future__ import annotations

import numpy as np
import pytest

from fxplan.cost_model.step.pipeline_schedules import BACKWARD, FORWARD, SPLIT_BACKWARD, schedule_order
from fxplan.cost_model.step.simulator import StageCosts, comm_stream_end, simulate_pipeline, simulate_step


def reference_ends(kind: str, p: int, v: int, m: int, durations: np.ndarray) -> np.ndarray:
    """Plain event-driven simulation: run each stage's next op as soon as its input exists."""
    order = schedule_order(kind, p, v, m)
    K = order.ops_per_stage
    end = np.full((p, K), np.nan)
    nxt, free = [0] * p, [0.0] * p
    remaining = p * K
    while remaining:
        progressed = False
        for s in range(p):
            while nxt[s] < K:
                k = nxt[s]
                dep_s, dep_k = order.dep_stage[s, k], order.dep_pos[s, k]
                ready = 0.0
                if dep_k >= 0:
                    if np.isnan(end[dep_s, dep_k]):
                        break
                    ready = end[dep_s, dep_k]
                free[s] = max(free[s], ready) + durations[s, order.chunk[s, k], order.kind[s, k]]
                end[s, k] = free[s]
                nxt[s] += 1
                remaining -= 1
                progressed = True
        assert progressed, "schedule deadlocks"
    return end


CASES = [("gpipe", 4, 1, 6), ("1f1b", 4, 1, 8), ("1f1b", 5, 1, 3), ("1f1b", 1, 1, 4),
         ("interleaved", 4, 2, 8), ("interleaved", 3, 3, 6), ("interleaved", 4, 2, 4),
         ("interleaved", 2, 4, 6), ("zb", 4, 1, 8), ("zb", 3, 2, 6), ("zb", 4, 3, 4),
         ("zbv", 4, 2, 8), ("zbv", 3, 2, 4), ("zbv", 2, 2, 7), ("dualpipev", 4, 2, 8),
         ("dualpipev", 3, 2, 9), ("dualpipev", 2, 2, 4)]


@pytest.mark.parametrize("kind,p,v,m", CASES)
def test_matches_event_driven_reference(kind: str, p: int, v: int, m: int) -> None:
    rng = np.random.default_rng(p * 100 + v * 10 + m)
    durations = rng.uniform(0.5, 2.0, (p, v, 3 if kind in SPLIT_BACKWARD else 2))
    timeline = simulate_pipeline(kind, p, v, m, durations)
    np.testing.assert_allclose(timeline.end, reference_ends(kind, p, v, m, durations), rtol=1e-12)


@pytest.mark.parametrize("kind,p,m", [("gpipe", 4, 8), ("1f1b", 4, 8), ("1f1b", 8, 64),
                                      ("1f1b", 16, 32)])
def test_bubble_matches_closed_form(kind: str, p: int, m: int) -> None:
    durations = np.zeros((p, 1, 2))
    durations[..., FORWARD], durations[..., BACKWARD] = 1.0, 2.0
    timeline = simulate_pipeline(kind, p, 1, m, durations)
    assert timeline.bubble_fraction(0) == pytest.approx((p - 1) / m)
    assert timeline.makespan == pytest.approx((m + p - 1) * 3.0)


@pytest.mark.parametrize("p,v,m", [(4, 2, 8), (8, 2, 64), (4, 3, 16), (16, 2, 32)])
def test_interleaved_bubble_matches_closed_form(p: int, v: int, m: int) -> None:
    durations = np.zeros((p, v, 2))
    durations[..., FORWARD], durations[..., BACKWARD] = 1.0 / v, 2.0 / v
    timeline = simulate_pipeline("interleaved", p, v, m, durations)
    assert timeline.bubble_fraction(0) == pytest.approx((p - 1) / (m * v))


@pytest.mark.parametrize("p,m", [(4, 8), (8, 3), (6, 6)])
def test_inflight_1f1b_and_gpipe(p: int, m: int) -> None:
    assert schedule_order("1f1b", p, 1, m).inflight_total.tolist() == [min(p - s, m) for s in range(p)]
    assert schedule_order("gpipe", p, 1, m).inflight_total.tolist() == [m] * p


@pytest.mark.parametrize("p,v,m", [(4, 2, 8), (8, 2, 64), (4, 3, 16)])
def test_inflight_interleaved_korthikanti_factor(p: int, v: int, m: int) -> None:
    """Stage 0 holds (v+1)·p − 1 chunks of L/(p·v) layers = L·(1 + (p−1)/(p·v))."""
    order = schedule_order("interleaved", p, v, m)
    expected = [min(2 * (p - s - 1) + (v - 1) * p + 1, m * v) for s in range(p)]
    assert order.inflight_total.tolist() == expected
    layers = p * v
    assert order.inflight_total[0] * layers / (p * v) == pytest.approx(layers * (1 + (p - 1) / (p * v)))


def test_comm_stream_is_fifo() -> None:
    assert comm_stream_end([0.0, 1.0], [2.0, 2.0]) == 4.0
    assert comm_stream_end([5.0, 0.0], [1.0, 1.0]) == 6.0
    assert comm_stream_end([], []) == 0.0


def _costs(p: int, v: int, bucket_seconds: float) -> StageCosts:
    forward = np.zeros((4, p, v))
    backward = np.zeros((4, p, v))
    forward[0], backward[0] = 1.0, 2.0
    buckets = tuple(tuple(((i + 1) / 4, bucket_seconds) for i in range(4)) for _ in range(v))
    return StageCosts(forward, backward, (buckets,) * p, np.zeros(p), np.full(p, 0.5))


def test_dp_sync_hides_behind_backward() -> None:
    """Four buckets released over the last backward (2 s): 0.1 s each hides except the last."""
    sim = simulate_step(_costs(1, 1, 0.1), "1f1b", 4)
    assert sim.breakdown["dp_comm"] == pytest.approx(0.1)
    assert sim.step_time_s == pytest.approx(4 * 3.0 + 0.1 + 0.5)


def test_dp_sync_longer_than_backward_is_exposed() -> None:
    """1 s per bucket: the stream ends at 0.5 + 4·1 = 4.5 s into the 2 s backward → 2.5 s exposed."""
    sim = simulate_step(_costs(1, 1, 1.0), "1f1b", 4)
    assert sim.breakdown["dp_comm"] == pytest.approx(2.5)


def test_breakdown_sums_to_step_time() -> None:
    sim = simulate_step(_costs(4, 2, 0.3), "interleaved", 8)
    assert sum(sim.breakdown.values()) == pytest.approx(sim.step_time_s)
    assert sim.breakdown["bubble"] > 0



def test_balanced_pipeline_has_no_stage_imbalance() -> None:
    """Uniform stages: all idle is the schedule's, ``(p−1)·(f+b)`` for 1F1B."""
    sim = simulate_step(_costs(4, 1, 0.0), "1f1b", 8)
    assert sim.breakdown["stage_imbalance"] == pytest.approx(0.0, abs=1e-12)
    assert sim.breakdown["bubble"] == pytest.approx(3 * (1.0 + 2.0))
    assert sum(sim.breakdown.values()) == pytest.approx(sim.step_time_s)


@pytest.mark.parametrize("schedule,v", [("1f1b", 1), ("gpipe", 1), ("interleaved", 2)])
def test_uneven_stages_split_idle_into_bubble_and_imbalance(schedule: str, v: int) -> None:
    """One stage twice as slow: the others wait for it beyond the schedule's own bubble, and
    bubble + imbalance is still all the idle time (the breakdown sums to the step)."""
    even = _costs(4, v, 0.0)
    forward, backward = even.forward.copy(), even.backward.copy()
    forward[0, 2], backward[0, 2] = 2.0, 4.0
    uneven = StageCosts(forward, backward, even.grad_buckets, even.post, even.optimizer)
    sim = simulate_step(uneven, schedule, 8)
    balanced = simulate_step(even, schedule, 8)
    c = sim.critical_stage
    assert sim.breakdown["stage_imbalance"] > 0.5
    assert sim.breakdown["bubble"] <= balanced.breakdown["bubble"] * (2 if c == 2 else 1) + 1e-9
    idle = sim.timeline.stage_end[c] - sim.timeline.busy[c]
    assert sim.breakdown["bubble"] + sim.breakdown["stage_imbalance"] == pytest.approx(idle)
    assert sum(sim.breakdown.values()) == pytest.approx(sim.step_time_s)
