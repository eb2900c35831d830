"""The estimate on a heterogeneous cluster: each group in its own precision, the MFU
against every device's own peak."""

from __future__ import annotations

import pytest
import torch

from fxplan.api import capture
from fxplan.cluster_specs import Cluster
from fxplan.core.config import ParallelConfig
from fxplan.cost_model import estimate

MODEL = "gpt:layers=4,hidden=2048,heads=16,vocab=4096,seq=1024"
CONFIG = ParallelConfig(pp=2, dp=8, microbatch_size=1)


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    return Cluster.load("hetero-v100-a100:v100.nodes=1,a100.nodes=1")


def test_mfu_is_against_the_sum_of_each_device_peak(cluster: Cluster) -> None:
    graph = capture(MODEL, batch=1, dtype=torch.bfloat16)
    est = estimate(graph, cluster, CONFIG, batch=16)
    assert est.precisions == {"v100": "fp16", "a100": "bf16"}
    peaks = 8 * 125e12 + 8 * 312e12          # V100 fp16, A100 bf16: the spec's dense peaks
    assert est.mfu == pytest.approx(est.model_flops / (est.step_time_s * peaks), rel=1e-12)
    assert est.mfu < est.model_flops / (est.step_time_s * 16 * 125e12)   # not the V100's alone


def test_a_v100_stage_prices_a_bf16_model_as_fp16(cluster: Cluster) -> None:
    bf16 = estimate(capture(MODEL, batch=1, dtype=torch.bfloat16), cluster, CONFIG, batch=16)
    fp16 = estimate(capture(MODEL, batch=1, dtype=torch.float16), cluster, CONFIG, batch=16)
    # same bytes, and each device priced at the same 16-bit peak: the same step
    assert bf16.stage_time_s == pytest.approx(fp16.stage_time_s, rel=1e-12)
    assert fp16.precisions == {"v100": "fp16", "a100": "fp16"}
    # a layer on the V100 stage is slower than the same layer on the A100 stage
    plan = bf16.stage_plan
    assert [d.name for d in plan.devices] == ["v100", "a100"]
    on_v100, on_a100 = plan.chunks[0][0][1], plan.chunks[1][0][0]   # layers 0 and 2
    assert on_v100.forward_s > 1.5 * on_a100.forward_s
