"""Zero-bubble schedules: the op orders are torch's own, the weight gradient fills the
bubbles the way Qi et al. (ICLR 2024) count them, activations stay until ``W`` runs, and the
step prices the split from the graph's weight-gradient GEMMs."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

from fxplan.cost_model.step.pipeline_schedules import BACKWARD, FORWARD, WEIGHT, schedule_order
from fxplan.cost_model.step.simulator import StageCosts, simulate_pipeline, simulate_step

_KIND = {"F": FORWARD, "I": BACKWARD, "W": WEIGHT}


def torch_orders(kind: str, p: int, v: int, m: int) -> list[list[tuple[int, int, int]]]:
    """Each rank's ``(kind, microbatch, chunk)`` ops as torch's schedule class orders them
    (its ``pipeline_order``, idle slots dropped), chunk from torch's stage index."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import (ScheduleInterleavedZeroBubble,
                                                        ScheduleZBVZeroBubble)

    cls = ScheduleZBVZeroBubble if kind == "zbv" else ScheduleInterleavedZeroBubble
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
            j = action.stage_index
            chunk = (0 if j < p else 1) if kind == "zbv" else j // p
            if kind == "zbv":   # torch's V: rank r holds stages r and 2p − 1 − r
                assert j == (rank if chunk == 0 else 2 * p - 1 - rank)
            row.append((_KIND[action.computation_type.value], action.microbatch_index, chunk))
        out.append(row)
    return out


@pytest.mark.parametrize("kind,p,v,m", [("zb", 4, 1, 8), ("zb", 2, 1, 2), ("zb", 4, 2, 8),
                                        ("zb", 3, 2, 6), ("zb", 4, 3, 12), ("zb", 4, 2, 4),
                                        ("zbv", 4, 2, 8), ("zbv", 3, 2, 4), ("zbv", 2, 2, 7),
                                        ("zbv", 4, 2, 2)])
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
