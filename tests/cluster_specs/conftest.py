"""Fixtures for the cluster_specs tests: a small valid two-level spec and a file writer."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

#: 2 nodes × 4 devices. Inside a node 100 GB/s × 0.5 = 50 GB/s per device; across nodes
#: 2 NICs × 10 GB/s × 0.5 = 10 GB/s per node. Round numbers so the tests can do the arithmetic.
TWO_LEVEL: dict[str, Any] = {
    "schema_version": 1,
    "name": "two-level",
    "device_groups": [
        {
            "name": "gpu",
            "kind": "gpu",
            "model": "TEST-GPU",
            "nodes": 2,
            "devices_per_node": 4,
            "memory_gib": 80,
            "reserved_memory_gib": 2,
            "memory_bandwidth_gb_per_s": 2000,
            "peak_tflops": {"fp32": 20, "bf16": 300},
            "intra_node_level": "nvswitch",
        }
    ],
    "levels": [
        {"name": "nvswitch", "kind": "nvswitch", "scope": "node",
         "bandwidth_gb_per_s": 100, "latency_us": 2, "efficiency": 0.5},
        {"name": "ib", "kind": "infiniband", "scope": "cluster",
         "bandwidth_gb_per_s": 10, "nics_per_node": 2, "latency_us": 8, "efficiency": 0.5},
    ],
}


@pytest.fixture
def two_level() -> dict[str, Any]:
    """A fresh copy of the two-level spec, to modify."""
    return copy.deepcopy(TWO_LEVEL)


@pytest.fixture
def write_spec(tmp_path: Path) -> Callable[..., Path]:
    """``write_spec(data_or_text, name)`` writes a YAML file under ``tmp_path``."""

    def write(content: Any, name: str = "cluster.yaml") -> Path:
        path = tmp_path / name
        text = content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False)
        path.write_text(text, encoding="utf-8")
        return path

    return write
