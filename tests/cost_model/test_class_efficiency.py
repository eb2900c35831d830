"""Per-op-class efficiencies (cost_model/compute/class_efficiency.py): the ratio-of-sums fit gives back
the efficiency of times that follow the roofline's law, the roofline then prices those nodes
at their measured total, and the node timer attributes forward and backward to fx nodes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fxplan.cluster_specs import Cluster
from fxplan.cost_model.compute.class_efficiency import NodeSample, fit_class_efficiency, time_graph_nodes
from fxplan.cost_model.compute.op_time import BACKWARD, backward_time_s, op_time_s
from fxplan.cost_model.compute.efficiency import load_efficiency

P, M, LAUNCH = 1e11, 2e10, 5e-6
HALVES = load_efficiency().devices["cpu"]


def _law(op_class: str, flops: float, nbytes: float, eff: float, backward: bool = False) -> float:
    """Seconds by the roofline's law with efficiency ``eff`` (compute or memory leg)."""
    rule = BACKWARD[op_class]
    k = rule.kernels if backward else 1
    if op_class == "matmul":
        work = flops * (rule.flops if backward else 1) + k * HALVES["matmul"]["half_flops"]
        return work / (P * eff) + k * LAUNCH
    work = nbytes * (rule.bytes if backward else 1) + k * HALVES["memory"]["half_bytes"]
    return work / (M * eff) + k * LAUNCH


def test_fit_gives_back_the_law_efficiency_forward_and_backward():
    sizes = [(2e6, 1e5), (3e7, 6e5), (1e8, 2e6)]
    for backward in (False, True):
        samples = [NodeSample("matmul", f, b, _law("matmul", f, b, 0.66, backward))
                   for f, b in sizes]
        samples += [NodeSample("norm", f / 100, b, _law("norm", f / 100, b, 0.25, backward))
                    for f, b in sizes]
        fit = fit_class_efficiency(samples, peak_flops=P, bandwidth_bytes_s=M, launch_s=LAUNCH,
                                   backward=backward)
        assert fit["matmul"]["efficiency"] == pytest.approx(0.66)
        assert fit["norm"]["efficiency"] == pytest.approx(0.25)
        assert fit["matmul"]["nodes"] == 3


def test_dropout_backward_is_fitted_as_the_elementwise_kernel_that_prices_it():
    s = NodeSample("dropout", 0.0, 1e6, 1e-4)
    fit = fit_class_efficiency([s], peak_flops=P, bandwidth_bytes_s=M, launch_s=LAUNCH,
                               backward=True)
    assert set(fit) == {"elementwise"}


def test_fitted_efficiencies_price_the_measured_totals():
    """A spec carrying the fitted η prices each class's nodes at their measured sum."""
    times = {(2e6, 1e5): 80e-6, (3e7, 6e5): 700e-6, (1e8, 2e6): 2.1e-3}
    samples = [NodeSample("matmul", f, b, t) for (f, b), t in times.items()]
    fwd = fit_class_efficiency(samples, peak_flops=P, bandwidth_bytes_s=M, launch_s=LAUNCH)
    bwd = fit_class_efficiency(samples, peak_flops=P, bandwidth_bytes_s=M, launch_s=LAUNCH,
                               backward=True)
    base = Cluster.load("local-cpu:devices=1").device_groups[0]
    device = dataclasses.replace(
        base, peak_tflops={"fp32": P / 1e12}, memory_bandwidth_gb_per_s=M / 1e9,
        kernel_launch_us=LAUNCH * 1e6,
        compute_efficiency={**base.compute_efficiency, "matmul": fwd["matmul"]["efficiency"]},
        backward_efficiency={"matmul": bwd["matmul"]["efficiency"]})
    priced = sum(op_time_s("matmul", f, b, "fp32", device, database=None) for f, b in times)
    assert priced == pytest.approx(sum(times.values()), rel=1e-3)   # memory leg never binds
    priced_bwd = sum(backward_time_s("matmul", f, b, "fp32", device, database=None)
                     for f, b in times)
    assert priced_bwd == pytest.approx(sum(times.values()), rel=1e-3)


def test_backward_efficiency_moves_only_the_backward():
    base = Cluster.load("local-cpu:devices=1").device_groups[0]
    faster = dataclasses.replace(base, backward_efficiency={"matmul": 2 * base.compute_efficiency["matmul"]})
    plain = dataclasses.replace(base, backward_efficiency={})
    f, b = 5e7, 1e6
    assert op_time_s("matmul", f, b, "fp32", faster, database=None) == \
        op_time_s("matmul", f, b, "fp32", plain, database=None)
    assert backward_time_s("matmul", f, b, "fp32", faster, database=None) < \
        backward_time_s("matmul", f, b, "fp32", plain, database=None)


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.fc(x)).sum()


def test_node_timer_attributes_forward_and_backward_to_nodes():
    gm = torch.fx.symbolic_trace(_Tiny())
    fwd, bwd = time_graph_nodes(gm, (torch.randn(8, 16),), repeats=2)
    assert {"fc", "gelu", "sum_1"} <= set(fwd)
    assert all(t >= 0 for t in fwd.values())
    # the linear's backward (its addmm and the weight/bias accumulation) and GELU's are timed
    assert {"fc", "gelu"} <= set(bwd)
    assert all(p.grad is None for p in gm.parameters())   # set to None after each pass


def test_local_cpu_spec_carries_the_measured_class_efficiencies():
    from fxplan.cluster_specs import local_cpu

    group = Cluster.load("local-cpu:devices=1").device_groups[0]
    assert dict(group.compute_efficiency) == local_cpu.COMPUTE_EFFICIENCY
    assert dict(group.backward_efficiency) == local_cpu.BACKWARD_EFFICIENCY
    # given only a matmul rate, the in-cache bandwidth follows it from the rate of its own probes
    slow = Cluster.load(
        f"local-cpu:devices=1,matmul_tflops={local_cpu.MEMORY_REFERENCE_MATMUL_TFLOPS / 2}")
    assert slow.device_groups[0].memory_bandwidth_gb_per_s == pytest.approx(
        group.memory_bandwidth_gb_per_s / 2, rel=1e-3)
