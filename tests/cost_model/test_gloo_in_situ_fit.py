"""The fit of ``benchmarks/gloo_in_situ.py``: the marginal costs it measures are
fitted in the cost model's own form, so constants that generated them come back, and the
spec priced with the fitted constants reproduces every point. No launch, no wall clock."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gloo_in_situ.py"


@pytest.fixture(scope="module")
def in_situ():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gloo_in_situ", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _points(module, n: int, h: float, cpu: dict[str, float], bandwidth: float):  # type: ignore[no-untyped-def]
    """Marginal costs in the model's form (module docstring of the script) for every point."""
    points = []
    for kind in module.KINDS:
        for nbytes in module.SIZES:
            steps, cpu_steps, moved = module._shape(kind, nbytes, n)
            alpha = module.BASE_LATENCY_US * (2 if kind == "send_recv" else 1)
            points.append({"kind": kind, "bytes": nbytes, "marginal_us": alpha + steps * h
                           + cpu_steps * cpu[kind] + moved / (bandwidth * 1e3)})
    return points


@pytest.mark.parametrize("n", [2, 4])
def test_fit_recovers_the_constants_that_made_the_points(in_situ, n) -> None:  # type: ignore[no-untyped-def]
    cpu = {"all_reduce": 800.0, "all_gather": 1400.0, "broadcast": 900.0, "send_recv": 450.0}
    fitted = in_situ.fit(_points(in_situ, n, 120.0, cpu, 1.5), n)
    assert fitted["latency_us"] == pytest.approx(120.0, rel=1e-6)
    assert fitted["bandwidth_gb_per_s"] == pytest.approx(1.5, rel=1e-6)
    assert fitted["step_cpu_us"] == pytest.approx(cpu, rel=1e-6)


def test_fit_keeps_every_constant_non_negative(in_situ) -> None:  # type: ignore[no-untyped-def]
    # points a negative hop latency would fit best: it is fixed at 0 and the rest refitted
    cpu = {"all_reduce": 500.0, "all_gather": 900.0, "broadcast": 600.0, "send_recv": 300.0}
    points = _points(in_situ, 2, 0.0, cpu, 1.0)
    for p in points:
        p["marginal_us"] -= 60.0 * in_situ._shape(p["kind"], p["bytes"], 2)[0]
    fitted = in_situ.fit(points, 2)
    assert fitted["latency_us"] == 0.0
    assert all(v >= 0 for v in fitted["step_cpu_us"].values())
    assert fitted["bandwidth_gb_per_s"] > 0


def test_the_spec_prices_the_fitted_points_as_the_fit_does(in_situ) -> None:  # type: ignore[no-untyped-def]
    # the spec's loopback level, given the fit's constants, prices each point at the fit's value
    from fxplan.cluster_specs import Cluster
    from fxplan.cost_model.comm.collectives import collective_time_s

    cpu = {"all_reduce": 859.0, "all_gather": 1494.0, "broadcast": 904.0, "send_recv": 453.0}
    points = _points(in_situ, 2, 0.0, cpu, 1.695)
    fitted = in_situ.fit(points, 2)
    spec = Cluster.load("local-cpu:devices=2").to_dict()
    spec["levels"][0].update(latency_us=fitted["latency_us"],
                             bandwidth_gb_per_s=fitted["bandwidth_gb_per_s"],
                             step_cpu_us=fitted["step_cpu_us"])
    cluster = Cluster.from_dict(spec, source="local-cpu:devices=2, the fit's loopback")
    for p in points:
        calls = 2 if p["kind"] == "send_recv" else 1     # the ping-pong: two messages
        priced = calls * collective_time_s(p["kind"], p["bytes"], (0, 1), cluster) * 1e6
        assert priced == pytest.approx(p["fit_us"], rel=1e-6)
    assert np.isfinite([p["fit_us"] for p in points]).all()
