"""The measured MFU's peak (``fxplan.rank.flops.flop_counts``): every device's own, as predicted."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fxplan.cluster_specs import Cluster
from fxplan.rank.flops import flop_counts


@pytest.mark.parametrize("spec, mean_peak", [
    ("hetero-v100-a100", (16 * 125e12 + 16 * 312e12) / 32),   # V100 fp16, A100 bf16
    ("dgx-a100-80g", 312e12),
    ("aws-p3-v100", 125e12),
])
def test_the_peak_is_the_mean_of_each_device_own(spec: str, mean_peak: float) -> None:
    cluster = Cluster.load(spec)
    plan = SimpleNamespace(estimate={"model_flops": 1e15, "hardware_flops": 1.3e15},
                           world_size=cluster.num_devices)
    counts, why = flop_counts(plan, cluster)
    assert why is None and counts is not None
    assert counts.peak_flops_per_device == pytest.approx(mean_peak)
