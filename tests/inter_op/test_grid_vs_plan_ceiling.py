"""``benchmarks/grid_vs_plan.py``'s ceiling: the step's compute alone spread over the devices.
Every term the cost model adds to a plan (bubbles, communication, recompute, tp's split) is
≥ 0, so neither the grid's best nor the free plan may be priced below it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("grid_vs_plan",
                                                  ROOT / "benchmarks" / "grid_vs_plan.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["grid_vs_plan"] = module      # its dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        yield module
    finally:
        sys.modules.pop("grid_vs_plan", None)


@pytest.mark.parametrize("model, cluster, batch, seq", [
    ("gpt-1.7b:layers=8", "dgx-a100-80g:nodes=2", 128, 2048),
    ("llama-7b:layers=8", "dgx-h100:nodes=2", 64, 4096),
])
def test_no_plan_is_priced_below_its_compute_alone(bench, model, cluster, batch, seq):  # type: ignore[no-untyped-def]
    row = bench.run(bench.Case("t", model, cluster, batch, seq))
    assert row["ceiling_s"] > 0
    for side in ("grid", "plan"):
        assert row[side]["step_s"] >= row["ceiling_s"], (side, row)
    assert row["plan"]["step_s"] <= row["grid"]["step_s"] * (1 + 1e-9)


def test_the_ceiling_is_the_cheapest_microbatch_per_sample_over_the_devices(bench):  # type: ignore[no-untyped-def]
    from fxplan.api import capture_for_search
    from fxplan.cluster_specs import Cluster, training_dtype
    from fxplan.inter_op.profile import ModelProfile

    cluster = Cluster.load("dgx-a100-80g:nodes=2")
    graph = capture_for_search("gpt-1.7b", seq=2048, dtype=training_dtype(cluster))
    profile = ModelProfile(graph, cluster)
    per_sample = [profile.get(1, False, "none", b).total_work / b for b in (1, 2, 4)]
    assert bench.compute_ceiling(graph, cluster, 64, range(1, 5)) <= \
        64 * min(per_sample) / 16 * (1 + 1e-12)
    assert bench.compute_ceiling(graph, cluster, 64, range(2, 3)) == \
        pytest.approx(64 * per_sample[1] / 16, rel=1e-12)
