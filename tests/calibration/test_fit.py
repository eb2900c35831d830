"""The calibration's pure parts: the link-level fit, the implied efficiencies, the YAML with
comments and the validation's comparison — each against values it must recover."""

from __future__ import annotations

import math

import pytest
import yaml

from fxplan.calibration.collectives import Point, fit_level, predict, with_level
from fxplan.calibration.compute import implied_efficiencies
from fxplan.calibration.spec_yaml import dump
from fxplan.cluster_specs import Cluster
from fxplan.cost_model.compute.op_time import roofline_time_s
from fxplan.cost_model.compute.op_database import OpDatabase, Record

SIZES = (1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30)
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def _measured(spec: dict, level: str, ranks: int) -> list[Point]:
    """What a node whose level is ``spec``'s would measure: the cost model's own times."""
    truth = Cluster.from_dict(spec)
    return [Point(kind, size, predict(truth, Point(kind, size, 0.0), ranks))
            for kind in KINDS for size in SIZES]


@pytest.mark.parametrize("bandwidth, latency", [(300.0, 3.5), (150.0, 0.5), (380.0, 8.0)])
def test_the_fit_recovers_the_level_the_times_came_from(bandwidth: float, latency: float) -> None:
    base = Cluster.load("dgx-h100").to_dict()
    level = base["device_groups"][0]["intra_node_level"]
    truth = with_level(base, level, bandwidth_gb_per_s=bandwidth, latency_us=latency)
    fit = fit_level(base, level, _measured(truth, level, 8), 8)
    assert fit.bandwidth_gb_per_s == pytest.approx(bandwidth, rel=2e-3)
    assert fit.latency_us == pytest.approx(latency, abs=0.02)
    assert fit.rms_error_after < 1e-3 < fit.rms_error_before


def test_the_fit_keeps_the_nominal_bandwidth_and_sets_the_efficiency() -> None:
    base = Cluster.load("dgx-h100").to_dict()
    level = base["device_groups"][0]["intra_node_level"]
    nominal = next(lv for lv in base["levels"] if lv["name"] == level)["bandwidth_gb_per_s"]
    slower = with_level(base, level, bandwidth_gb_per_s=nominal / 2)
    spec_level = next(lv for lv in slower["levels"] if lv["name"] == level)
    assert spec_level["bandwidth_gb_per_s"] == nominal and spec_level["efficiency"] == 0.5
    faster = with_level(base, level, bandwidth_gb_per_s=nominal * 1.5)
    spec_level = next(lv for lv in faster["levels"] if lv["name"] == level)
    assert spec_level["bandwidth_gb_per_s"] == pytest.approx(nominal * 1.5) and spec_level["efficiency"] == 1.0


def test_implied_efficiencies_recover_the_efficiency_the_times_were_priced_at() -> None:
    cluster = Cluster.load("dgx-h100")
    group = cluster.device_groups[0]
    slower = Cluster.from_dict({**cluster.to_dict(), "device_groups": [{
        **cluster.to_dict()["device_groups"][0],
        "compute_efficiency": {"matmul": 0.4, "attention": 0.6, "memory_bound": 0.7}}]})
    truth = slower.device_groups[0]
    records = []
    for n in (1024, 2048, 4096, 8192, 16384, 32768):
        flops = 2.0 * n * n * 4096
        nbytes = 2.0 * (2 * n * 4096 + 4096 * 4096)
        records.append(Record("linear", "square", "bf16", ((n, 4096), (4096, 4096)), flops, nbytes,
                              roofline_time_s("matmul", flops, nbytes, "bf16", truth)))
        size = float(n * 4096 * 2)
        records.append(Record("add", "flat", "bf16", ((n, 4096), (n, 4096)), n * 4096.0, 3 * size,
                              roofline_time_s("elementwise", n * 4096.0, 3 * size, "bf16", truth)))
    found = {e.key: e for e in implied_efficiencies(OpDatabase("H100", "cuda", {}, records), group)}
    assert found["matmul"].implied == pytest.approx(0.4, rel=1e-6)
    assert found["matmul"].spec == group.compute_efficiency["matmul"]
    assert found["memory_bound"].implied == pytest.approx(0.7, rel=1e-6)   # add → memory_bound on a GPU spec


def test_the_yaml_carries_the_comments_and_loads_back_to_the_spec() -> None:
    for name in ("dgx-h100", "local-cpu:devices=2", "hetero-v100-a100"):
        spec = Cluster.load(name).to_dict()
        text = dump(spec, {("levels", 0, "latency_us"): "measured: 3 µs",
                           ("device_groups", 0, "compute_efficiency", "matmul"): "implied"},
                    header="first line\nsecond line")
        assert yaml.safe_load(text) == spec
        lines = text.splitlines()
        assert lines[:2] == ["# first line", "# second line"]
        assert any(line.strip().startswith("latency_us:") and line.endswith("# measured: 3 µs")
                   for line in lines)
        assert any(line.strip().startswith("matmul:") and line.endswith("# implied") for line in lines)
        Cluster.from_dict(yaml.safe_load(text))


def _summary(cuda: bool) -> dict:
    return {"steps": 6, "memory_measured_as": "torch.cuda.max_memory_allocated" if cuda else "rss",
            "ranks": [{"step_times_s": [9.0, 1.1, 1.0, 1.0, 0.9, 1.0], "peak_memory_gib": 2.0,
                       "peak_reserved_gib": 2.5 if cuda else None},
                      {"step_times_s": [9.0, 1.3, 1.2, 1.2, 1.2, 1.2], "peak_memory_gib": 4.0,
                       "peak_reserved_gib": 4.4 if cuda else None}]}


def _plan(pp: int):
    from fxplan.core.plan import Plan

    import fxplan

    plan = fxplan.search("gpt-tiny", "local-cpu:devices=2", batch=8, progress=False,
                         constraints={"pp": pp})
    data = plan.to_dict()
    data["estimate"]["step_time_s"] = 1.0
    data["estimate"]["memory_breakdown_gib"] = [
        {"total": 2.2, "cuda_context": 0.5, "nccl": 0.25, "fragmentation": 0.1, "reserved": 0.0},
        {"total": 4.0, "cuda_context": 0.5, "nccl": 0.25, "fragmentation": 0.2, "reserved": 0.0}][:pp]
    return Plan.from_dict(data)


@pytest.mark.parametrize("cuda", [False, True])
def test_validation_compares_each_rank_with_its_own_stage(cuda: bool) -> None:
    from fxplan.calibration.validate import compare

    plan = _plan(pp=2)
    result = compare(plan, _summary(cuda), [3.0, 2.5], warmup=2, tolerance=0.1, memory_tolerance=0.05)
    r0, r1 = result.ranks
    assert (r0.stage, r1.stage) == (0, 1)
    assert r0.measured_step_s == 1.0 and r1.measured_step_s == 1.2     # medians after the warm-up
    assert r0.step_error == 0.0 and r1.step_error == pytest.approx(1 / 1.2 - 1)
    if cuda:   # allocated against the tensors, reserved against tensors + fragmentation
        assert r0.predicted_memory_gib == pytest.approx(2.2 - 0.85)
        assert r0.predicted_reserved_gib == pytest.approx(2.2 - 0.85 + 0.1)
        assert r1.reserved_error == pytest.approx((4.0 - 0.95 + 0.2) / 4.4 - 1)
    else:      # the whole stage total against the resident set; no reserved figure
        assert r0.predicted_memory_gib == 2.2 and r0.reserved_error is None
        assert r1.memory_error == 0.0
    assert any("rank 1: step time off by -16.7%" in f for f in result.failures)
    loose = compare(plan, _summary(cuda), [], warmup=2, tolerance=1.0, memory_tolerance=1.0)
    assert loose.failures == [] and loose.to_dict()["passed"]
    assert all(math.isfinite(v) for r in loose.to_dict()["ranks"] for k, v in r.items()
               if k.endswith("error") and v is not None)
