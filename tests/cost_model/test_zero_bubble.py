"""Zero-bubble schedules: the op orders are torch's own, the weight gradient fills the
bubbles the way Qi et al. (ICLR 2024) count them, activations stay until ``W`` runs, and the
step prices the split from the graph's weight-gradient GEMMs."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from torch_versions import needs

from fxplan.cost_model.step.pipeline_schedules import BACKWARD, FORWARD, WEIGHT, schedule_order
from fxplan.cost_model.step.simulator import StageCosts, simulate_pipeline, simulate_step

_KIND = {"F": FORWARD, "I": BACKWARD, "W": WEIGHT}


def torch_orders(kind: str, p: int, v: int, m: int) -> list[list[tuple[int, int, int]]]:
    """Each rank's ``(kind, microbatch, chunk)`` ops as torch's schedule class orders them
    (its ``pipeline_order``, idle slots dropped), chunk from torch's stage index."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules

    cls = getattr(schedules, {"zbv": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV"}
                  .get(kind, "ScheduleInterleavedZeroBubble"))
    v_shape = kind in ("zbv", "dualpipev")
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod = 0, p, None
    stage.num_stages = p * v
    schedule = cls([stage] * v, m)
    out = []
    for rank in range(p):
        row = []
        for action in schedule.pipeline_order[rank]:
            if action is None:
                continue
            for sub in action.sub_actions or (action,):   # OVERLAP_F_B: its F, then its B
                j = sub.stage_index
                chunk = (0 if j < p else 1) if v_shape else j // p
                if v_shape:   # torch's V: rank r holds stages r and 2p − 1 − r
                    assert j == (rank if chunk == 0 else 2 * p - 1 - rank)
                mb, what = sub.microbatch_index, sub.computation_type.value
                # a whole backward (FULL_BACKWARD) is our B with its W right after it
                row += ([(BACKWARD, mb, chunk), (WEIGHT, mb, chunk)] if what == "B"
                        else [(_KIND[what], mb, chunk)])
        out.append(row)
    return out


@pytest.mark.parametrize("kind,p,v,m", [("zb", 4, 1, 8), ("zb", 2, 1, 2), ("zb", 4, 2, 8),
                                        ("zb", 3, 2, 6), ("zb", 4, 3, 12), ("zb", 4, 2, 4),
                                        ("zbv", 4, 2, 8), ("zbv", 3, 2, 4), ("zbv", 2, 2, 7),
                                        ("zbv", 4, 2, 2)] + [
    pytest.param("dualpipev", p, 2, m, marks=needs("pipelining_dualpipev"))
    for p, m in [(2, 4), (3, 6), (4, 8), (4, 11), (5, 10), (8, 24)]])
def test_orders_are_torchs(kind: str, p: int, v: int, m: int) -> None:
    order = schedule_order(kind, p, v, m)
    ours = [list(zip(order.kind[s].tolist(), order.microbatch[s].tolist(),
                     order.chunk[s].tolist())) for s in range(p)]
    assert ours == torch_orders(kind, p, v, m)


@pytest.mark.parametrize("p,m", [(4, 8), (8, 32), (6, 12)])
def test_zb_h1_bubble(p: int, m: int) -> None:
    """F = B = W = 1: ZB1P's step is ``3m + (p−1)·(F + B − W)`` against 1F1B's
    ``(m + p − 1)·(F + B + W)`` (Qi et al. 2024, ZB-H1)."""
    split = np.ones((p, 1, 3))
    whole = np.stack([np.ones((p, 1)), np.full((p, 1), 2.0)], axis=-1)
    assert simulate_pipeline("zb", p, 1, m, split).makespan == pytest.approx(3 * m + (p - 1))
    assert simulate_pipeline("1f1b", p, 1, m, whole).makespan == pytest.approx(3 * (m + p - 1))


@pytest.mark.parametrize("p,m", [(4, 8), (8, 32)])
def test_activations_held_until_weight_gradient(p: int, m: int) -> None:
    """A microbatch stays in flight until its W: every ZB1P stage holds ``p`` microbatches
    (1F1B's stage 0), ZB-V ``2p`` half-size chunk activations, ``p`` layer-stages' worth."""
    assert schedule_order("zb", p, 1, m).inflight_total.tolist() == [p] * p
    assert schedule_order("zbv", p, 2, m).inflight_total.tolist() == [2 * p] * p
    assert schedule_order("1f1b", p, 1, m).inflight_total.tolist() == [p - s for s in range(p)]


def test_zbv_places_chunks_in_a_v() -> None:
    """Under zbv the loss is on stage 0 (virtual stage 2p−1): the first backward of stage 0's
    chunk 1 waits for its own forward; stage p−1 turns forward chunk 0 into chunk 1."""
    p = 4
    order = schedule_order("zbv", p, 2, 8)
    k = int(np.flatnonzero((order.kind[0] == BACKWARD) & (order.chunk[0] == 1))[0])
    assert (order.dep_stage[0, k], order.kind[0, order.dep_pos[0, k]]) == (0, FORWARD)
    k = int(np.flatnonzero((order.kind[p - 1] == FORWARD) & (order.chunk[p - 1] == 1))[0])
    assert order.dep_stage[p - 1, k] == p - 1


def _costs(p: int, v: int, weight: float, bucket_s: float = 0.0) -> StageCosts:
    forward, backward = np.zeros((4, p, v)), np.zeros((4, p, v))
    forward[0], backward[0] = 1.0, 2.0
    buckets = tuple(tuple(((i + 1) / 2, bucket_s) for i in range(2)) for _ in range(v))
    return StageCosts(forward, backward, (buckets,) * p, np.zeros(p), np.zeros(p),
                      weight=np.full((p, v), weight))


def test_step_uses_the_weight_split() -> None:
    """The same costs: zb with half the backward as W beats 1F1B; with no weight-gradient
    work it degenerates to 1F1B's step; the breakdown still sums to the step."""
    p, m = 4, 8
    one = simulate_step(_costs(p, 1, 1.0), "1f1b", m)
    zb = simulate_step(_costs(p, 1, 1.0), "zb", m)
    none = simulate_step(_costs(p, 1, 0.0), "zb", m)
    assert zb.step_time_s < one.step_time_s
    assert none.step_time_s == pytest.approx(one.step_time_s)
    assert sum(zb.breakdown.values()) == pytest.approx(zb.step_time_s)
    assert zb.breakdown["bubble"] == pytest.approx((p - 1) * (1.0 + 1.0 - 1.0))


def test_gradient_buckets_wait_for_the_last_weight_gradient() -> None:
    """Under zb a chunk's gradients are final after its last W: its two buckets are ready
    halfway through and at the end of that 1 s op, so at 0.8 s each the stream ends
    0.5 + 2·0.8 − 1 = 1.1 s after it; 1F1B's 2 s backward leaves only the last, 0.8 s."""
    assert simulate_step(_costs(1, 1, 1.0, 0.8), "zb", 4).breakdown["dp_comm"] == \
        pytest.approx(1.1)
    assert simulate_step(_costs(1, 1, 1.0, 0.8), "1f1b", 4).breakdown["dp_comm"] == \
        pytest.approx(0.8)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 16)])
def test_dualpipev_holds_what_1f1b_over_its_virtual_stages_holds(p: int, m: int) -> None:
    """DualPipeV's virtual stage ``j`` keeps ``2p − j`` microbatches in flight at its peak, as
    1F1B over ``2p`` stages does; in the V stage ``s`` holds ``j = s`` and ``j = 2p−1−s``,
    ``2p − s`` and ``s + 1``, and both peak together: ``2p + 1`` chunk activations on every
    stage (zbv: ``2p``) — the DualPipe README's ``PP + 1`` with ``PP = 2p`` —, so ``p + ½``
    stage activations where 1F1B's stage 0 holds ``p``."""
    order = schedule_order("dualpipev", p, 2, m)
    assert order.inflight_peak.tolist() == [[2 * p - s, s + 1] for s in range(p)]
    assert order.inflight_total.tolist() == [2 * p + 1] * p
    assert schedule_order("1f1b", 2 * p, 1, m).inflight_total.tolist() == \
        [2 * p - j for j in range(2 * p)]


def test_dualpipev_sends_after_the_pair() -> None:
    """torch sends an ``OVERLAP_F_B`` pair's outputs after the whole pair and a whole
    backward's input gradient after its weight gradient; a split backward's at once."""
    p, m = 4, 8
    order = schedule_order("dualpipev", p, 2, m)

    def pos(s: int, kind: int, mb: int, chunk: int) -> int:
        return int(np.flatnonzero((order.kind[s] == kind) & (order.microbatch[s] == mb)
                                  & (order.chunk[s] == chunk))[0])

    def waits_for(s: int, kind: int, mb: int, chunk: int) -> tuple[int, int]:
        k = pos(s, kind, mb, chunk)
        return int(order.dep_stage[s, k]), int(order.dep_pos[s, k])

    # stage 0's first pair: F0 of microbatch 2p−1 (virtual stage 0), then B1 of microbatch
    # p−1 (the warm-up ran the split B1 of microbatches 0 … p−2); virtual stage 1 (stage 1's
    # chunk 0) gets that forward after the pair
    first_pair = pos(0, FORWARD, 2 * p - 1, 0)
    assert order.kind[0, first_pair + 1] == BACKWARD
    assert order.microbatch[0, first_pair + 1] == p - 1
    assert waits_for(1, FORWARD, 2 * p - 1, 0) == (0, first_pair + 2)
    # virtual stage 1 runs microbatch 0's backward whole (in a pair): virtual stage 0 gets
    # its input gradient after its W
    whole = pos(1, BACKWARD, 0, 0)
    assert order.kind[1, whole + 1] == WEIGHT
    assert waits_for(0, BACKWARD, 0, 0) == (1, whole + 1)
    # stage 0's warm-up B1 (virtual 2p−1, the loss) is split: stage 1's chunk 1 gets it at once
    split = pos(0, BACKWARD, 0, 1)
    assert order.kind[0, split + 1] == WEIGHT   # its W, run at once but as its own action
    assert waits_for(1, BACKWARD, 0, 1) == (0, split)


def _uniform(p: int, v: int, f: float, b: float, w: float) -> np.ndarray:
    durations = np.zeros((p, v, 3))
    durations[..., FORWARD], durations[..., BACKWARD], durations[..., WEIGHT] = f, b, w
    return durations


@pytest.mark.parametrize("p", [2, 4, 8])
def test_dualpipev_bubble(p: int) -> None:
    """Chunk ops F = B = W = 1 (B the input gradient): the DualPipe README's bubble
    ``(PP/2 − 1)·(F&B + B − 3W)`` — its B a whole backward, here ``B + W = 2``, its F&B a
    forward-backward pair, here run in sequence, ``F + B + W = 3`` — over ``PP = 2p``
    virtual stages is ``(p − 1)·(3 + 2 − 3) = 2(p − 1)``, whatever ``m ≥ 2p``: more than
    zbv's ``p − 1`` (zbv defers every W, DualPipeV runs the backwards of its pairs whole) and
    less than 1F1B's ``(p − 1)·(2F + 2(B + W)) = 6(p − 1)`` over the same two-chunk stages."""
    for m in (2 * p, 4 * p):
        busy = 2 * m * 3.0
        dual = simulate_pipeline("dualpipev", p, 2, m, _uniform(p, 2, 1.0, 1.0, 1.0))
        zbv = simulate_pipeline("zbv", p, 2, m, _uniform(p, 2, 1.0, 1.0, 1.0))
        one = simulate_pipeline("1f1b", p, 1, m, _uniform(p, 1, 2.0, 4.0, 0.0)[..., :2])
        assert dual.makespan - busy == pytest.approx(2 * (p - 1))
        assert zbv.makespan - busy == pytest.approx(p - 1)
        assert one.makespan - busy == pytest.approx(6 * (p - 1))


def test_dualpipev_between_zbv_and_1f1b() -> None:
    """For any uniform F, B, W the V schedules beat 1F1B over the same stages, and zbv,
    which defers every weight gradient, idles no more than DualPipeV run without overlap."""
    rng = np.random.default_rng(7)
    for _ in range(20):
        p = int(rng.integers(2, 7))
        m = 2 * p + int(rng.integers(0, 5))
        f, b, w = rng.uniform(0.2, 2.0, 3)
        dual = simulate_pipeline("dualpipev", p, 2, m, _uniform(p, 2, f, b, w)).makespan
        zbv = simulate_pipeline("zbv", p, 2, m, _uniform(p, 2, f, b, w)).makespan
        one = simulate_pipeline("1f1b", p, 1, m,
                                _uniform(p, 1, 2 * f, 2 * (b + w), 0.0)[..., :2]).makespan
        assert zbv <= dual + 1e-9 and dual < one, (p, m, f, b, w)
