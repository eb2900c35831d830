"""The search's per-rank memory model (``inter_op.stage_memory``) is the estimate's: one
memory model, stage by stage, over schedules, recompute, sequence parallelism, ZeRO stages
and uneven stages."""

from __future__ import annotations

import pytest

from fxplan.core.schedule import Schedule
from fxplan.cost_model import ParallelConfig, estimate
from fxplan.inter_op.partition import balanced_counts
from fxplan.inter_op.profile import ModelProfile
from fxplan.inter_op.stage_memory import DeviceMemory, stage_totals


# (tp, pp, dp, mb, m, schedule, recompute, sp, zero, uneven)
CONFIGS = [
    (1, 4, 8, 2, 32, "interleaved:2", "none", False, 0, False),   # the review's example
    (1, 4, 8, 2, 32, "interleaved:2", "none", False, 0, True),
    (1, 4, 8, 1, 8, "interleaved:4", "selective", False, 1, False),
    (1, 4, 8, 2, 32, "1f1b", "none", False, 0, True),
    (4, 4, 2, 1, 8, "gpipe", "selective", True, 3, False),
    (4, 2, 4, 4, 4, "interleaved:2", "full", True, 1, False),
    (2, 1, 16, 4, 8, "1f1b", "none", True, 3, False),
    (1, 2, 16, 2, 16, "1f1b", "full", False, 2, True),
    # split backwards: a recomputed block's recompute is kept from its B to its W
    (1, 4, 8, 1, 8, "zb", "full", False, 0, True),
    (2, 4, 4, 1, 8, "zb:2", "full", True, 1, False),
    (1, 4, 8, 1, 8, "zbv", "full", False, 0, False),
    (1, 2, 16, 1, 8, "dualpipev", "full", False, 0, False),
    (1, 4, 8, 1, 8, "zb", "none", False, 0, False),
]


def _config(tp: int, pp: int, dp: int, mb: int, m: int, schedule: str, recompute: str,
            sp: bool, zero: int) -> ParallelConfig:
    return ParallelConfig(dp=dp, tp=tp, pp=pp, microbatch_size=mb, num_microbatches=m,
                          schedule=Schedule.parse(schedule), recompute=recompute,
                          sequence_parallel=sp, zero_stage=zero)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"tp{c[0]}pp{c[1]}-{c[5]}-{c[6]}-z{c[8]}")
def test_search_memory_is_the_estimates(gpt17, cfg) -> None:  # type: ignore[no-untyped-def]
    """The search's per-rank memory is cost_model.estimate's peak memory, stage by stage."""
    graph, cluster = gpt17
    tp, pp, dp, mb, m, schedule, recompute, sp, zero, uneven = cfg
    prof = ModelProfile(graph, cluster)
    c = _config(tp, pp, dp, mb, m, schedule, recompute, sp, zero)
    counts = list(balanced_counts(prof.num_layers, pp * c.virtual_stages))
    if uneven:
        counts[0], counts[-1] = counts[0] - 1, counts[-1] + 1
    c = c.replace(stage_layers=tuple(counts))
    got = stage_totals(c, prof.get(tp, sp, recompute, mb), DeviceMemory.of(cluster.device(0)))
    est = estimate(graph, cluster, c, batch=dp * mb * m)
    want = [mem.total for mem in est.memory]
    assert list(got) == pytest.approx(want, rel=1e-6)


# (tp, pp, dp, mb, m, schedule, recompute, sp, zero, stage_layers, recompute_layers)
PER_STAGE = [
    (1, 4, 8, 2, 32, "1f1b", "full", False, 1, (6, 6, 6, 6), (5, 3, 1, 0)),
    (2, 2, 8, 1, 16, "interleaved:2", "selective", True, 0, (6, 6, 6, 6), (6, 2, 0, 1)),
    (1, 1, 32, 4, 4, "1f1b", "full", False, 3, (24,), (7,)),
    (1, 4, 8, 1, 8, "zb", "full", False, 0, (6, 6, 6, 6), (4, 3, 1, 0)),
    (1, 4, 8, 1, 8, "zbv", "full", False, 1, (3, 3, 3, 3, 3, 3, 3, 3),
     (3, 2, 0, 1, 0, 0, 2, 3)),
]


@pytest.mark.parametrize("cfg", PER_STAGE, ids=lambda c: f"pp{c[1]}-{c[5]}-{c[6]}")
def test_search_memory_is_the_estimates_with_recompute_per_stage(gpt17, cfg) -> None:  # type: ignore[no-untyped-def]
    """With some layers of each stage recomputed, the search's per-rank memory (each layer's
    row from its own policy's profile, ``ModelProfile.of``) is still the estimate's."""
    graph, cluster = gpt17
    tp, pp, dp, mb, m, schedule, recompute, sp, zero, stages, counts = cfg
    c = _config(tp, pp, dp, mb, m, schedule, recompute, sp, zero).replace(
        stage_layers=stages, recompute_layers=counts)
    prof = ModelProfile(graph, cluster)
    got = stage_totals(c, prof.of(c), DeviceMemory.of(cluster.device(0)))
    est = estimate(graph, cluster, c, batch=dp * mb * m)
    assert list(got) == pytest.approx([mem.total for mem in est.memory], rel=1e-6)
    plain = estimate(graph, cluster, c.replace(recompute_layers=None, recompute="none"),
                     batch=dp * mb * m)
    whole = estimate(graph, cluster, c.replace(recompute_layers=None), batch=dp * mb * m)
    for s in range(pp):   # between no recompute and the policy on every layer, rank by rank
        assert whole.memory[s].activations <= est.memory[s].activations \
            <= plain.memory[s].activations


def test_a_split_backward_holds_the_recompute_from_b_to_w(gpt17) -> None:  # type: ignore[no-untyped-def]
    """Under ``zb`` with every block recomputed, a rank holds each in-flight microbatch's
    checkpointed inputs and, from its ``B`` to its ``W``, the block's recomputed activations
    (the kept recompute, which includes the inputs): the estimate's activations are the
    schedule's ``peak_held`` of the two, above what the checkpoints alone would hold; on
    the last rank, whose ``W`` wait longest (its ``B``-to-``W`` peak is ``p`` microbatches,
    every one in flight), as much as no recompute holds, and below it on the others; 1F1B
    with the same recompute holds the checkpoints only."""
    import numpy as np

    from fxplan.cost_model.step.pipeline_schedules import inflight_counts

    graph, cluster = gpt17
    p, m = 4, 8
    c = _config(1, p, 8, 1, m, "zb", "full", False, 0)
    est = estimate(graph, cluster, c, batch=8 * m)
    saved = np.array([[sum(seg.activations.saved for seg in est.stage_plan.chunks[s][0])]
                      for s in range(p)])
    kept = np.array([[sum(max(seg.activations.working - seg.activations.saved, 0.0)
                          for seg in est.stage_plan.chunks[s][0])] for s in range(p)])
    counts = inflight_counts("zb", p, 1, m)
    held = counts.peak_held(saved, kept)
    assert [mem.activations for mem in est.memory] == pytest.approx(held.tolist(), rel=1e-9)
    assert (held > counts.peak_inflight(saved)).all()
    assert counts.pending_peak[-1, 0] == p and counts.inflight_peak[-1, 0] == p
    plain = estimate(graph, cluster, c.replace(recompute="none"), batch=8 * m)
    for s in range(p - 1):
        assert est.memory[s].activations < plain.memory[s].activations
    assert est.memory[-1].activations == pytest.approx(plain.memory[-1].activations,
                                                       rel=1e-9)
    one = estimate(graph, cluster, c.replace(schedule=Schedule("1f1b")), batch=8 * m)
    assert [mem.activations for mem in one.memory] == pytest.approx(
        inflight_counts("1f1b", p, 1, m).peak_inflight(saved).tolist(), rel=1e-9)
