"""Roofline compute times on a DGX A100 device, worked by hand.

A100-SXM4-80GB (dgx-a100-80g.yaml): bf16 312, tf32 156, fp32 19.5 TFLOP/s; 2039 GB/s;
kernel launch 5 µs; compute_efficiency matmul 0.75, attention 0.6, memory_bound 0.8.
Curve shapes (cost_model/data/efficiency.json, "a100"): matmul F_half = 2e9 FLOPs,
B_half = 4e6 bytes for every family.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fxplan.cluster_specs import Cluster
from fxplan.cost_model.compute.op_time import BACKWARD, backward_time_s, node_time_s, op_time_s, roofline_time_s
from fxplan.cost_model.compute.op_database import OpDatabase, Record
from fxplan.passes.node_info import NodeInfo

LAUNCH = 5e-6


@pytest.fixture(scope="module")
def a100():  # type: ignore[no-untyped-def]
    return Cluster.load("dgx-a100-80g").device_groups[0]


def matmul_time(flops: float, nbytes: float, peak: float, c_max: float = 0.75) -> float:
    compute = flops / (peak * c_max * flops / (flops + 2e9))
    memory = nbytes / (2039e9 * 0.8 * nbytes / (nbytes + 4e6))
    return max(compute, memory) + LAUNCH


def test_large_bf16_matmul_is_compute_bound(a100) -> None:  # type: ignore[no-untyped-def]
    n = 8192
    flops, nbytes = 2.0 * n**3, 3 * n * n * 2
    t = op_time_s("matmul", flops, nbytes, torch.bfloat16, a100, database=None)
    assert t == pytest.approx(matmul_time(flops, nbytes, 312e12), rel=1e-12)
    assert t == pytest.approx(4.712e-3, rel=1e-3)  # ≈ 0.75 × 312 TF/s, + 5 µs


def test_fp32_peak_and_explicit_tf32(a100) -> None:  # type: ignore[no-untyped-def]
    flops, nbytes = 2.0 * 4096**3, 3 * 4096**2 * 4
    fp32 = op_time_s("matmul", flops, nbytes, "float32", a100, database=None)
    tf32 = op_time_s("matmul", flops, nbytes, "float32", a100, database=None, allow_tf32=True)
    assert fp32 == pytest.approx(matmul_time(flops, nbytes, 19.5e12))
    assert tf32 == pytest.approx(matmul_time(flops, nbytes, 156e12))
    # cuDNN allows TF32 by default: an fp32 conv runs at the tf32 peak unless told otherwise
    conv = roofline_time_s("conv", flops, 0, "fp32", a100)
    conv_fp32 = roofline_time_s("conv", flops, 0, "fp32", a100, allow_tf32=False)
    assert (conv_fp32 - LAUNCH) / (conv - LAUNCH) == pytest.approx(156 / 19.5)


def test_memory_bound_elementwise(a100) -> None:  # type: ignore[no-untyped-def]
    nbytes = 3 * 2**30
    t = op_time_s("elementwise", 2**29, nbytes, "bf16", a100, database=None)
    assert t == pytest.approx(nbytes / (2039e9 * 0.8 * nbytes / (nbytes + 4e6)) + LAUNCH)


def test_small_op_pays_launch_and_half_work(a100) -> None:  # type: ignore[no-untyped-def]
    # 2e9 FLOPs = F_half: half of the 0.75 efficiency
    t = op_time_s("matmul", 2e9, 1.0, "bf16", a100, database=None)
    assert t == pytest.approx(2e9 / (312e12 * 0.375) + LAUNCH)


def test_efficiency_falls_back_to_the_data_file(a100) -> None:  # type: ignore[no-untyped-def]
    bare = dataclasses.replace(a100, compute_efficiency={})
    flops = 2.0 * 8192**3
    t = roofline_time_s("matmul", flops, 0, "bf16", bare)
    assert t == pytest.approx(flops / (312e12 * 0.80 * flops / (flops + 2e9)) + LAUNCH)


def test_views_and_empty_ops_are_free(a100) -> None:  # type: ignore[no-untyped-def]
    assert op_time_s("view", 0, 1e9, "bf16", a100) == 0.0
    assert op_time_s("elementwise", 0, 0, "bf16", a100) == 0.0
    assert backward_time_s("view", 0, 1e9, "bf16", a100) == 0.0


def test_missing_peak_is_an_error(a100) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="fp8"):
        op_time_s("matmul", 1e12, 1e6, torch.float8_e4m3fn, a100, database=None)
    with pytest.raises(ValueError, match="unknown op class"):
        op_time_s("teleport", 1e12, 1e6, "bf16", a100, database=None)


def test_backward_rules(a100) -> None:  # type: ignore[no-untyped-def]
    flops, nbytes = 2.0 * 4096**3, 3 * 4096**2 * 2
    fwd = op_time_s("matmul", flops, nbytes, "bf16", a100, database=None)
    assert backward_time_s("matmul", flops, nbytes, "bf16", a100, database=None) == pytest.approx(2 * fwd)
    assert backward_time_s("matmul", flops, nbytes, "bf16", a100, database=None,
                           recompute=True) == pytest.approx(3 * fwd)
    nb = 2**28
    ew = backward_time_s("elementwise", nb / 2, nb, "bf16", a100, database=None)
    assert ew == pytest.approx(op_time_s("elementwise", nb, 2 * nb, "bf16", a100, database=None))
    # cross-entropy backward: nll_loss's dense gradient, then log_softmax's (2 kernels, 4 passes)
    logits = 2**30
    loss = backward_time_s("loss", logits / 2, logits, "fp32", a100, database=None)
    assert loss == pytest.approx(2 * op_time_s("loss", logits / 4, 2 * logits, "fp32", a100,
                                               database=None))
    assert loss > 3.5 * op_time_s("loss", logits / 2, logits, "fp32", a100, database=None)
    assert set(BACKWARD) >= {"matmul", "attention", "conv", "elementwise", "norm", "softmax",
                             "embedding", "dropout", "view", "other"}


def test_node_time_divides_work_by_the_shard_factor(a100) -> None:  # type: ignore[no-untyped-def]
    info = NodeInfo(shape=(8, 2048, 4096), dtype=torch.bfloat16, flops=2 * 16384 * 4096 * 16384,
                    bytes_read=(16384 * 4096 + 4096 * 16384) * 2, bytes_written=16384 * 16384 * 2,
                    op_class="matmul")
    nbytes = info.bytes_read + info.bytes_written
    assert node_time_s(info, a100, shard_factor=4, database=None) == pytest.approx(
        op_time_s("matmul", info.flops / 4, nbytes / 4, "bf16", a100, database=None))
    assert node_time_s(info, a100, backward=True, database=None) == pytest.approx(
        backward_time_s("matmul", info.flops, nbytes, "bf16", a100, database=None))
    fp32 = node_time_s(info, a100, dtype=torch.float32, database=None)
    assert fp32 > 10 * node_time_s(info, a100, database=None)
    split = NodeInfo(shape=((2, 2), (2, 2)), dtype=(torch.bfloat16, torch.bfloat16),
                     bytes_read=16, bytes_written=16, op_class="elementwise")
    assert node_time_s(split, a100, database=None) > LAUNCH


def test_database_replaces_the_roofline(a100, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    shapes = ((4096, 4096), (4096, 4096))
    record = Record("linear", "square", "bf16", shapes, 2.0 * 4096**3, 3 * 4096**2 * 2, 1.0e-3)
    db = OpDatabase("NVIDIA A100-SXM4-80GB", "cuda", {}, [record])
    kwargs = dict(op="linear", shapes=shapes)
    assert op_time_s("matmul", record.flops, record.bytes, "bf16", a100, database=db, **kwargs) == 1.0e-3
    # only the work is known: interpolated along the op standing for the class (time ∝ work above)
    assert op_time_s("matmul", 2 * record.flops, 0, "bf16", a100, database=db) == pytest.approx(2.0e-3)
    # not measured in fp32: roofline
    assert op_time_s("matmul", record.flops, record.bytes, "fp32", a100, database=db) == pytest.approx(
        roofline_time_s("matmul", record.flops, record.bytes, "fp32", a100))
    with pytest.raises(ValueError, match="measured on"):
        op_time_s("matmul", 1e9, 1e6, "bf16", a100, database=OpDatabase("H100", "cuda"))
    # "auto" finds a database measured on the device's model
    db.save(tmp_path / "a100.json")
    monkeypatch.setenv("FXPLAN_OP_DB_PATH", str(tmp_path))
    assert op_time_s("matmul", record.flops, record.bytes, "bf16", a100, **kwargs) == 1.0e-3


def test_auto_database_sees_a_database_profiled_later(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    a100 = Cluster.load("dgx-a100-80g").device_groups[0]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("FXPLAN_OP_DB_PATH", str(tmp_path / "dbs"))
    shapes = ((512, 512), (512, 512))
    record = Record("linear", "square", "bf16", shapes, 2.0 * 512**3, 3 * 512**2 * 2, 1.0e-3)
    kwargs = dict(op="linear", shapes=shapes)
    roofline = roofline_time_s("matmul", record.flops, record.bytes, "bf16", a100)
    # no database anywhere yet: the roofline (and that answer must not stick)
    assert op_time_s("matmul", record.flops, record.bytes, "bf16", a100, **kwargs) == roofline
    (tmp_path / "dbs").mkdir()
    OpDatabase(a100.model, "cuda", records=[record]).save(tmp_path / "dbs" / "a100.json")
    assert op_time_s("matmul", record.flops, record.bytes, "bf16", a100, **kwargs) == 1.0e-3
    # the search path changes: the database is no longer found
    monkeypatch.setenv("FXPLAN_OP_DB_PATH", str(tmp_path / "elsewhere"))
    assert op_time_s("matmul", record.flops, record.bytes, "bf16", a100, **kwargs) == roofline


def test_cpu_devices_use_the_cpu_curves() -> None:
    cpu = Cluster.load("local-cpu:devices=1").device_groups[0]
    assert cpu.kind == "cpu"
    flops = 2.0 * 512**3  # data "cpu": F_half = 5e5 FLOPs; the spec's measured matmul efficiency
    peak = cpu.peak_tflops["fp32"] * 1e12
    eff = cpu.compute_efficiency["matmul"]
    t = roofline_time_s("matmul", flops, 0, "fp32", cpu)
    assert t == pytest.approx(flops / (peak * eff * flops / (flops + 5e5)) + cpu.kernel_launch_us * 1e-6)
