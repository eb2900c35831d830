"""Every built-in spec loads and carries the numbers of benchmarks/data/hardware.md."""

from __future__ import annotations

import re

import pytest
import yaml

from fxplan.cluster_specs import Cluster, available_specs
from fxplan.cluster_specs.documents import BUILTIN_DIR

REQUIRED = {
    "dgx1-v100-16g", "dgx1-v100-32g", "dgx-a100-40g", "dgx-a100-80g", "dgx-h100", "hgx-h200",
    "a100-pcie-8", "aws-p3-v100", "hetero-v100-a100", "h200-single", "local-cpu",
}

# name: (model, memory GiB, memory GB/s, {dtype: peak}, intra GB/s, intra efficiency,
#        NICs per node, GB/s per NIC, devices per node, default nodes)
V100 = {"fp32": 15.7, "fp16": 125.0}
A100 = {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}
H100 = {"fp32": 67.0, "tf32": 495.0, "bf16": 989.0, "fp16": 989.0, "fp8": 1979.0}
EXPECTED = {
    "dgx1-v100-16g": ("V100-SXM2-16GB", 16, 900, V100, 150, 0.77, 4, 12.5, 8, 1),
    "dgx1-v100-32g": ("V100-SXM2-32GB", 32, 900, V100, 150, 0.77, 4, 12.5, 8, 1),
    "dgx-a100-40g": ("A100-SXM4-40GB", 40, 1555, A100, 300, 0.77, 8, 25, 8, 1),
    "dgx-a100-80g": ("A100-SXM4-80GB", 80, 2039, A100, 300, 0.77, 8, 25, 8, 1),
    "dgx-h100": ("H100-SXM5-80GB", 80, 3350, H100, 450, 0.82, 8, 50, 8, 1),
    "hgx-h200": ("H200-SXM-141GB", 141, 4800, H100, 450, 0.82, 8, 50, 8, 1),
    "a100-pcie-8": ("A100-PCIE-40GB", 40, 1555, A100, 32, 0.75, 1, 12.5, 8, 1),
    "aws-p3-v100": ("V100-SXM2-16GB", 16, 900, V100, 150, 0.77, 1, 3.125, 8, 1),
    "h200-single": ("H200-SXM-141GB", 141, 4800, H100, 450, 0.82, 1, 12.5, 1, 1),
}


def test_required_names_are_available():
    assert REQUIRED <= set(available_specs())


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_every_builtin_loads_and_takes_nodes(name):
    cluster = Cluster.load(name)
    assert cluster.num_devices >= 1 and cluster.levels[0].scope == "node"
    bigger = Cluster.load(f"{name}:nodes=4")
    assert bigger.num_nodes == 4 and bigger.num_devices == 4 * cluster.num_devices // cluster.num_nodes


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_numbers_match_hardware_reference(name):
    model, memory, membw, peaks, intra_bw, intra_eff, nics, nic_bw, per_node, nodes = EXPECTED[name]
    cluster = Cluster.load(name)
    (group,) = cluster.device_groups
    assert (group.model, group.memory_gib, group.memory_bandwidth_gb_per_s) == (model, memory, membw)
    assert dict(group.peak_tflops) == peaks
    assert (group.devices_per_node, cluster.num_nodes) == (per_node, nodes)
    intra = cluster.level(group.intra_node_level)
    assert (intra.bandwidth_gb_per_s, intra.efficiency) == (intra_bw, intra_eff)
    network = cluster.cluster_level
    assert (network.nics_per_node, network.bandwidth_gb_per_s) == (nics, nic_bw)
    assert group.kernel_launch_us > 0 and {"matmul", "attention", "memory_bound"} <= set(group.compute_efficiency)


def test_nvlink_sharp_and_measured_busbw():
    h100 = Cluster.load("dgx-h100:nodes=2")
    assert h100.level("nvswitch").allreduce_bandwidth_gb_per_s == 480  # hardware.md: NVLink SHARP
    assert h100.group_bandwidth_gb_per_s(range(8)) == pytest.approx(370, abs=1)  # ring ≈ 370
    a100 = Cluster.load("dgx-a100-80g:nodes=2")
    assert a100.group_bandwidth_gb_per_s(range(8)) == pytest.approx(230, abs=1)  # ≈ 230 busbw
    assert a100.group_bandwidth_gb_per_s(range(16)) == pytest.approx(192)  # cross-node ≈ 192


def test_heterogeneous_builtin_layout():
    cluster = Cluster.load("hetero-v100-a100")
    v100, a100 = cluster.device_groups
    assert (v100.model, v100.nodes, v100.first_rank, v100.intra_node_level) == ("V100-SXM2-32GB", 2, 0, "nvlink-v100")
    assert (a100.model, a100.nodes, a100.first_rank, a100.intra_node_level) == ("A100-SXM4-80GB", 2, 16, "nvswitch-a100")
    assert [lv.name for lv in cluster.levels] == ["nvlink-v100", "nvswitch-a100", "ib-hdr"]
    assert (v100.nics_per_node, cluster.cluster_level.nics_per_node) == (4, 8)


NUMERIC_KEYS = re.compile(
    r"^\s+-?\s*(memory_gib|reserved_memory_gib|memory_bandwidth_gb_per_s|peak_tflops|bandwidth_gb_per_s|"
    r"latency_us|efficiency|nics_per_node|allreduce_bandwidth_gb_per_s|kernel_launch_us|compute_efficiency):"
)


@pytest.mark.parametrize("path", sorted(BUILTIN_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_number_in_builtin_files_carries_a_comment(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    bare = [line for line in lines if NUMERIC_KEYS.match(line) and "#" not in line]
    assert not bare, f"{path.name}: numbers without a source comment: {bare}"
    assert yaml.safe_load("\n".join(lines))["name"] == path.stem
