"""A small cluster spec with a domain level (a "rack" of trays), for the level-scope tests.

``nodes`` trays of ``per_node`` devices; the tray level 200 GB/s × 0.5 per device, 1 µs; a
domain level of ``scope`` trays at 100 GB/s × 0.5 per device, 3 µs (with NVLink SHARP's
all-reduce bandwidth ``nvls`` when given); the network 10 GB/s × 1.0 per NIC, one NIC a tray,
9 µs.
"""

from __future__ import annotations

from typing import Any


def rack_spec(*, nodes: int = 4, scope: Any = 2, per_node: int = 2,
              nvls: float | None = None) -> dict:
    rack = {"name": "rack", "kind": "nvswitch", "scope": scope, "bandwidth_gb_per_s": 100,
            "latency_us": 3.0, "efficiency": 0.5}
    if nvls:
        rack["allreduce_bandwidth_gb_per_s"] = nvls
    return {
        "schema_version": 1, "name": "racks",
        "device_groups": [{
            "name": "g", "kind": "gpu", "model": "X", "nodes": nodes, "devices_per_node": per_node,
            "memory_gib": 80, "memory_bandwidth_gb_per_s": 1000, "peak_tflops": {"bf16": 100},
            "intra_node_level": "tray"}],
        "levels": [
            {"name": "tray", "kind": "nvswitch", "scope": "node", "bandwidth_gb_per_s": 200,
             "latency_us": 1.0, "efficiency": 0.5},
            rack,
            {"name": "net", "kind": "infiniband", "scope": "cluster", "bandwidth_gb_per_s": 10,
             "nics_per_node": 1, "latency_us": 9.0, "efficiency": 1.0},
        ],
    }
