"""The recomputed layers of each stage, chosen with the split (``partition_recompute``) and by
the search (``StageSplits.fit_recompute``): the fewest that make each stage fit, more on the
early stages of a 1F1B pipeline, which hold more microbatches in flight."""

from __future__ import annotations

import numpy as np
import pytest

import fxplan
from fxplan.api import capture_for_search
from fxplan.cluster_specs import Cluster, training_dtype
from fxplan.cost_model import estimate
from fxplan.inter_op.partition import partition_layers, partition_recompute
from fxplan.inter_op.pricing import priced_config
from fxplan.report.terminal import plan_summary, recompute_line, stage_recompute

L, S = 12, 4
T0, TR = np.full(L, 1.0), np.full(L, 1.3)        # seconds per layer, without / with recompute
PSI, A0, AR = np.full(L, 10.0), np.full(L, 5.0), np.full(L, 1.0)   # bytes
EXTRA = np.array([0.5, 0.0, 0.0, 0.7])            # embedding on stage 0, head on stage 3
FIXED = np.full(S, 20.0)
FIXED_R = FIXED + 3.0                             # the re-run layer's working set
INFLIGHT = np.array([4.0, 3.0, 2.0, 1.0])         # 1F1B: p − j microbatches on stage j


def _split(cap: float, state: np.ndarray = PSI):  # type: ignore[no-untyped-def]
    return partition_recompute(T0, TR, state, A0, AR, EXTRA, FIXED, FIXED_R, INFLIGHT, cap)


def test_fewest_recomputed_layers_by_hand() -> None:
    """cap 90, three layers a stage: stage 0 holds 20 + 3·(10 + 4·5) = 110 bytes without
    recompute, so ⌈(110 + 3 − 90) / (4·(5 − 1))⌉ = ⌈23/16⌉ = 2 layers; stage 1
    ⌈(95 + 3 − 90)/12⌉ = 1; stages 2 and 3 (80 and 65 bytes) none. The slowest stage is
    stage 0: 0.5 + 3·1 + 2·0.3 = 4.1 s."""
    part = _split(90.0)
    assert part.counts == (3, 3, 3, 3) and part.recomputed == (2, 1, 0, 0)
    assert part.bottleneck_s == pytest.approx(4.1)
    assert part.stage_bytes[0] == pytest.approx(20 + 3 + 3 * 10 + 4 * (15 - 2 * 4))


def test_no_recompute_where_everything_fits() -> None:
    part, plain = _split(1e9), partition_layers(T0, PSI, A0, EXTRA, FIXED, INFLIGHT, 1e9)
    assert part.recomputed == (0, 0, 0, 0)
    assert part.counts == plain.counts and part.bottleneck_s == pytest.approx(plain.bottleneck_s)


def test_never_slower_than_one_policy_and_more_recompute_early() -> None:
    """At every cap the chosen split is at least as fast as the best split without recompute
    and the best with it on every layer, and stage j recomputes at least as many layers as
    stage j + 1 (equal layer counts)."""
    seen = 0
    for cap in np.linspace(50.0, 130.0, 33):
        part = _split(float(cap))
        plain = partition_layers(T0, PSI, A0, EXTRA, FIXED, INFLIGHT, float(cap))
        whole = partition_layers(TR, PSI, AR, EXTRA, FIXED_R, INFLIGHT, float(cap))
        if part is None:
            assert plain is None and whole is None
            continue
        for other in (plain, whole):
            if other is not None:
                assert part.bottleneck_s <= other.bottleneck_s + 1e-12
        if len(set(part.counts)) == 1:
            assert list(part.recomputed) == sorted(part.recomputed, reverse=True)
            seen += 1
    assert seen > 5


def test_layer_by_layer_dp_agrees_with_the_closed_form() -> None:
    """Layers made unequal by a byte take the general DP; its answer is the closed form's."""
    for cap in (70.0, 90.0, 110.0):
        state = PSI.copy()
        state[5] += 1e-9
        uniform, general = _split(cap), _split(cap, state)
        assert general.counts == uniform.counts and general.recomputed == uniform.recomputed
        assert general.bottleneck_s == pytest.approx(uniform.bottleneck_s)


MODEL = "gpt:layers=8,hidden=1024,heads=16,vocab=8192,seq=2048"
#: a pipeline of 4 on one DGX A100 with most of each GPU's memory held back: a microbatch of 4
#: needs some recompute, more on the early stages
CONSTRAINTS = {"pp": 4, "tp": 1, "schedule": "1f1b", "zero_stage": 0, "microbatch_size": 4}
HEADROOM = "70GiB"


@pytest.fixture(scope="module")
def searched():  # type: ignore[no-untyped-def]
    cluster = Cluster.load("dgx-a100-80g:nodes=1")
    graph = capture_for_search(MODEL, dtype=training_dtype(cluster))
    per_stage = fxplan.search(graph, cluster, batch=64, progress=False, constraints=CONSTRAINTS,
                              memory_headroom=HEADROOM)
    single = fxplan.search(graph, cluster, batch=64, progress=False,
                           constraints={**CONSTRAINTS, "recompute": ["none", "selective", "full"]},
                           memory_headroom=HEADROOM)
    return graph, cluster, per_stage, single


def test_recompute_per_stage_beats_one_policy_for_the_whole_plan(searched) -> None:  # type: ignore[no-untyped-def]
    graph, cluster, per_stage, single = searched
    assert single.block_recompute is None and single.config.recompute_layers is None
    assert per_stage.config.recompute_layers is not None, per_stage.summary
    assert per_stage.estimate["fits"]
    assert per_stage.estimate["step_time_s"] < single.estimate["step_time_s"]
    counts = [k for k, _ in stage_recompute(per_stage)]
    assert counts == list(per_stage.config.recompute_layers)
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1]
    # the estimate of the plan is what the search priced
    again = estimate(graph, cluster, priced_config(per_stage), batch=64,
                     memory_headroom=per_stage.estimate["memory_headroom"])
    assert again.step_time_s == pytest.approx(per_stage.estimate["step_time_s"], rel=1e-12)
    assert again.fits


def test_the_plan_says_what_each_stage_recomputes(searched) -> None:  # type: ignore[no-untyped-def]
    _, _, plan, _ = searched
    assert plan.recompute_summary == "mixed" and "recompute=mixed" in plan.summary
    n = plan.stages[0].num_layers
    line = recompute_line(plan)
    assert line.startswith(", ".join(f"{k}/{n}" for k in plan.config.recompute_layers))
    assert f"layers {plan.config.recompute}" in line
    assert plan_summary(plan)["recompute_per_stage"] == [
        [k, s.num_layers] for k, s in zip(plan.config.recompute_layers, plan.stages)]
    loaded = fxplan.Plan.from_json(plan.to_json())
    assert loaded.block_recompute == plan.block_recompute
    assert loaded.block_recompute == plan.config.layer_recompute(8)
