"""Unit tests of the inter-op search: the partition DP, the space, pruning reasons, the time
budget, constraints, infeasible inputs and the plan it produces."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fxplan.cluster_specs import Cluster
from fxplan import Plan, load_plan, search
from fxplan.core.errors import UserError
from fxplan.api import capture_for_search
from fxplan.inter_op import InfeasibleError
from fxplan.inter_op.partition import partition_layers
from fxplan.inter_op.space import Family, families, options

SMALL = "gpt:layers=4,hidden=256,heads=8,vocab=4096,seq=256"


def _brute(time, state, acts, extra, fixed, inflight, cap):  # type: ignore[no-untyped-def]
    L, S = len(time), len(extra)
    best = None
    for cuts in itertools.combinations(range(1, L), S - 1):
        e = (0,) + cuts + (L,)
        ok, T = True, 0.0
        for j in range(S):
            a, b = e[j], e[j + 1]
            if fixed[j] + sum(state[a:b]) + inflight[j] * sum(acts[a:b]) > cap:
                ok = False
            T = max(T, extra[j] + sum(time[a:b]))
        if ok and (best is None or T < best):
            best = T
    return best


@pytest.mark.parametrize("uniform", [False, True])
def test_partition_dp_matches_brute_force(uniform: bool) -> None:
    rng = np.random.default_rng(7 + uniform)
    for _ in range(150):
        L = int(rng.integers(2, 9))
        S = int(rng.integers(1, L + 1))
        if uniform:
            time, state, acts = ([float(rng.uniform(0.5, 2))] * L, [float(rng.uniform(0, 3))] * L,
                                 [float(rng.uniform(0, 2))] * L)
        else:
            time, state, acts = (list(rng.uniform(0.5, 2, L)), list(rng.uniform(0, 3, L)),
                                 list(rng.uniform(0, 2, L)))
        extra, fixed = rng.uniform(0, 3, S), rng.uniform(0, 5, S)
        inflight = rng.integers(1, 5, S).astype(float)
        cap = float(rng.uniform(5, 30))
        got = partition_layers(time, state, acts, extra, fixed, inflight, cap)
        want = _brute(time, state, acts, extra, fixed, inflight, cap)
        if want is None:
            assert got is None
        else:
            assert got is not None and got.bottleneck_s == pytest.approx(want)
            assert sum(got.counts) == L and min(got.counts) >= 1
            assert max(got.stage_bytes) <= cap + 1e-9


def test_families_record_reasons_with_arithmetic() -> None:
    pruned: list[str] = []
    fams = families(32, batch=48, layers=24, heads=24, tp_widths={"vocab": 51200}, pruned=pruned)
    assert Family(8, 1, 4) in fams and all(f.tp * f.pp * f.dp == 32 for f in fams)
    assert any("tp=16: does not divide heads=24 (24 mod 16 = 8)" in r for r in pruned)
    assert any("pp=32: more stages than layers (32 > 24)" in r for r in pruned)
    assert any("batch=48 not divisible by dp (48 mod 32 = 16)" in r for r in pruned)


def test_options_respect_batch_identity_and_schedule_rules() -> None:
    for c in options(Family(2, 4, 4), batch=64, layers=8, seq=256):
        assert c.dp * c.microbatch_size * c.num_microbatches == 64
        if c.schedule.interleaved:
            assert c.num_microbatches % c.pp == 0 and 8 >= c.pp * c.virtual_stages


@pytest.fixture(scope="module")
def small_plan() -> Plan:
    return search(capture_for_search(SMALL), Cluster.load("dgx-a100-80g:nodes=2"), batch=64,
                  progress=False)


def test_plan_is_complete_and_round_trips(small_plan: Plan, tmp_path) -> None:  # type: ignore[no-untyped-def]
    plan = small_plan
    assert plan.world_size == 16 and plan.batch == 64
    assert sum(s.num_layers for s in plan.stages) == 4
    assert plan.stages[0].has_embedding and plan.stages[-1].has_head
    assert plan.estimate["fits"] and plan.estimate["step_time_s"] > 0
    assert {"inter-op", "simulate", "intra-op"} <= set(plan.timings)
    assert plan.placements.params and plan.placements.nodes
    # no time budget: the intra-op solve of this small graph (well under a second against its
    # 30 s limit) is proven optimal, and nothing fell back
    assert (plan.solver.backend, plan.solver.status, plan.solver.gap) == ("highs", "optimal", 0.0)
    assert plan.fallbacks == ()
    deltas = [r["delta_s"] for r in plan.runners_up]
    assert len(plan.runners_up) == 3 and deltas == sorted(deltas) and deltas[0] >= 0
    path = plan.save(tmp_path / "plan.json")
    again = load_plan(path, graph_fingerprint=plan.graph_fingerprint,
                      cluster_fingerprint=plan.cluster_fingerprint)
    assert again.summary == plan.summary and again.to_dict() == plan.to_dict()


def test_constraints_fix_degrees(small_plan: Plan) -> None:
    forced = search(capture_for_search(SMALL), "dgx-a100-80g:nodes=2", batch=64,
                    progress=False, constraints={"tp": 2, "pp": 2, "zero_stage": (1, 2)})
    assert (forced.tp, forced.pp) == (2, 2) and forced.zero_stage in (1, 2)
    assert forced.estimate["step_time_s"] >= small_plan.estimate["step_time_s"] * (1 - 1e-9)
    with pytest.raises(UserError, match="unknown constraints"):
        search(capture_for_search(SMALL), "dgx-a100-80g", batch=8, progress=False,
               constraints={"tensor": 2})


def test_time_budget_is_recorded_not_silent() -> None:
    plan = search(capture_for_search(SMALL), "dgx-a100-80g:nodes=2", batch=64, progress=False,
                  time_budget_s=0.0)
    assert any("time budget" in f for f in plan.fallbacks)
    assert plan.estimate["fits"]


def test_infeasible_model_says_what_it_needs() -> None:
    # gpt-18.4b trains on these 8 V100s with offload (its 16 B/param fit the 488 GiB host);
    # a host of 64 GiB holds neither, and the error says both
    with pytest.raises(InfeasibleError) as info:
        search(capture_for_search("gpt-18.4b", dtype="float16"),
               "aws-p3-v100:v100.host_memory_gib=64", batch=8, progress=False)
    text = str(info.value)
    assert isinstance(info.value, UserError)
    assert "smallest memory any configuration needs is" in text and "16.0 GiB" in text
    assert "more devices" in text and "nodes" in text
    assert "Offload was tried as well" in text and "(it has 64 GiB)" in text


def test_seq_mismatch_is_a_user_error() -> None:
    with pytest.raises(UserError, match="captured at seq=256"):
        search(capture_for_search(SMALL), "dgx-a100-80g", batch=8, seq=512, progress=False)
