"""The measurement method of ``benchmarks/measured_vs_predicted.py``: launches
interleaved across rounds (every round runs every case once, in a new order), the median per
case and its spread stored with the results. No launch, no wall clock."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "measured_vs_predicted.py"


@pytest.fixture(scope="module")
def mvp():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("measured_vs_predicted", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [0, 7, None])
def test_every_round_runs_every_case_once(mvp, seed) -> None:  # type: ignore[no-untyped-def]
    order = mvp.rounds(17, 5, seed)
    assert len(order) == 5
    assert all(sorted(r) == list(range(17)) for r in order)
    # the rounds differ: no case keeps its place in the series
    assert len({tuple(r) for r in order}) == 5


def test_rotation_moves_each_case_through_the_series(mvp) -> None:  # type: ignore[no-untyped-def]
    order = mvp.rounds(6, 3, None)
    assert order == [[0, 1, 2, 3, 4, 5], [2, 3, 4, 5, 0, 1], [4, 5, 0, 1, 2, 3]]


def test_median_spread_and_quartiles_are_stored(mvp, tmp_path) -> None:  # type: ignore[no-untyped-def]
    case = mvp.Case("dp=2", 2, "dp=2", plan={"estimate": {"step_time_s": 0.02}},
                    predicted_s=0.02, predicted_gib=0.3,
                    measured_s=[0.030, 0.020, 0.025, 0.040], measured_gib=[0.3, 0.31, 0.3, 0.3],
                    loads=[2.0, 3.0, 4.0, 5.0])
    assert case.median_s == pytest.approx(0.0275)
    assert case.spread_s == (0.020, 0.040)
    assert case.iqr_s == pytest.approx((0.02375, 0.0325))
    assert case.load_median == 3.5
    path = tmp_path / "r.json"
    mvp.save([case], path, {"repeats": 4})
    row = json.loads(path.read_text())["cases"][0]
    assert (row["min_s"], row["max_s"], row["median_s"]) == (0.020, 0.040, pytest.approx(0.0275))
    assert row["loads"] == [2.0, 3.0, 4.0, 5.0]
    # the stored file loads back (the statistics are derived, not fields)
    again = mvp.load(path)[0]
    assert again.measured_s == case.measured_s and again.loads == case.loads
    assert "| 20.0–40.0 |" in mvp.table([again])


def test_probed_rates_are_the_medians_of_the_priced_keys(mvp) -> None:  # type: ignore[no-untyped-def]
    probes = [{"matmul_tflops": r, "memory_gb_per_s": 20.0, "eager_op_us": e, "load": 9.0}
              for r, e in ((0.08, 5.0), (0.10, 5.4), (0.09, 6.0))]
    case = mvp.Case("one rank", 1, "", predicted_s=0.03, predicted_gib=0.3,
                    measured_s=[0.04, 0.05, 0.045], measured_gib=[0.3] * 3, probes=probes,
                    predicted_probed_s=0.045, predicted_probed_gib=0.3)
    # the copy bandwidth is recorded, not priced (its method differs from the constant's)
    assert case.probed_rates == {"matmul_tflops": 0.09, "eager_op_us": 5.4}
    summary = mvp.summary([case])
    assert summary["mae_step_time"] == pytest.approx(1 / 3)
    assert summary["mae_step_time_probed"] == pytest.approx(0.0)
    assert mvp.Case("x", 1, "").probed_rates == {}
    # from 2026-11-24 (`c352b19`) the probe also measures the in-cache vector rate, which prices too
    vector = [dict(p, vector_gb_per_s=v) for p, v in zip(probes, (6.0, 5.0, 5.5))]
    assert mvp.Case("v", 1, "", probes=vector).probed_rates == {
        "matmul_tflops": 0.09, "eager_op_us": 5.4, "vector_gb_per_s": 5.5}


def test_the_planner_is_compared_by_configuration_not_by_case(mvp) -> None:  # type: ignore[no-untyped-def]
    """The planner's case runs the same plan as a constrained case: the two are one
    configuration, their launches pooled; a different plan stays its own configuration."""
    def plan(config: str) -> dict:
        return {"config": config, "degrees": {"dp": 4}, "stages": [], "placements": {},
                "estimate": {"step_time_s": 0.03}, "summary": config}

    def case(label: str, constrain: str, config: str, times: list[float]):  # type: ignore[no-untyped-def]
        return mvp.Case(label, 4, constrain, plan_summary=config, plan=plan(config),
                        predicted_s=0.03, predicted_gib=0.3, measured_s=times,
                        measured_gib=[0.3] * len(times))

    chosen = case("planner (4)", "", "dp=4", [0.041, 0.040, 0.039])
    same = case("dp=4", "dp=4", "dp=4", [0.036, 0.037, 0.038])
    other = case("dp=4 zero=1", "dp=4,zero=1", "dp=4,zero=1", [0.0385, 0.060, 0.061])
    assert mvp.configuration_key(chosen) == mvp.configuration_key(same)
    assert mvp.configuration_key(chosen) != mvp.configuration_key(other)
    s = mvp.summary([chosen, same, other])
    # pooled: dp=4 median of six launches 0.0385, zero=1 0.060 -> the planner's plan is the best
    assert s["grid_best"] == "planner (4) = dp=4"
    assert s["planner_over_best"] == pytest.approx(1.0)
    # case by case the planner's launches (0.040) are 8 % above the other case's (0.037)
    assert s["planner_case_over_best_case"] == pytest.approx(0.040 / 0.037)
    # had the planner picked a slower plan, the ratio says so
    worse = case("planner (4)", "", "dp=4,zero=1", [0.060, 0.061, 0.062])
    s = mvp.summary([worse, same, other])
    assert s["planner_configuration"] == "planner (4) = dp=4 zero=1"
    assert s["planner_over_best"] == pytest.approx(0.0605 / 0.037)
