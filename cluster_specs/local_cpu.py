"""``local-cpu``: this machine as a cluster of CPU ranks talking gloo over loopback.

Generated at load time (``Cluster.load("local-cpu")``, ``local-cpu:devices=4``) so that plans
for it really run here. ``devices=N`` is the number of CPU ranks (default: one per core, the
cores this process may run on); each rank gets ``1/N`` of the machine::

    memory_gib                 = MemTotal / N                 (/proc/meminfo)
    peak_tflops.fp32           = FP32_TFLOPS_PER_CORE × cores / N
    memory_bandwidth_gb_per_s  = MEMORY_GB_PER_S_PER_CORE × cores / N

The figures per core were measured on the 2-core machines these tests run on (see the
constants); they are deliberately conservative for larger machines. ``nodes=N`` describes N
such machines joined by a 100 Gb/s Ethernet NIC each (schema: a cluster-scope level).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

#: fp32 matmul per core: 1024² matmul on one thread took 21.7 ms ≈ 99 GFLOP/s
#: (shared/notes/torch-2.13-cpu.md, "Timing ops on CPU").
FP32_TFLOPS_PER_CORE = 0.099
#: One-thread copy of a 128 MiB tensor measured ≈ 13.7 GB/s counting bytes read plus written
#: (torch 2.13, these machines); rounded down.
MEMORY_GB_PER_S_PER_CORE = 12.0
#: Gloo over loopback, 4 MB all-reduce on 2 ranks: 4.5 ms ⇒ bus bandwidth
#: 4.19e6 B / 4.5e-3 s × 2(n−1)/n = 0.93 GB/s (shared/notes/torch-2.13-cpu.md). Measured, so
#: the level's efficiency is 1.
GLOO_BUS_GB_PER_S = 0.93
#: 4-byte gloo all-reduce on 2 ranks: 0.5–1.2 ms over 2(n−1) = 2 hops ⇒ ≥ 250 µs per hop.
GLOO_HOP_LATENCY_US = 250.0
#: PyTorch eager dispatch of a small CPU op measured ≈ 0.9 µs; rounded up.
OP_DISPATCH_US = 1.0

#: Override keys the generator takes itself (the others apply to the generated spec).
GENERATOR_PARAMS: tuple[str, ...] = ("devices",)


def cpu_cores() -> int:
    """Cores this process may run on (``sched_getaffinity``), else ``os.cpu_count()``."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def memory_gib() -> float:
    """Total memory from ``/proc/meminfo`` (``MemTotal``), else ``sysconf``."""
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 / 2**30
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (or ``platform``)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "cpu"


def local_cpu_spec(devices: int | None = None) -> dict[str, Any]:
    """The schema-v1 spec of this machine with ``devices`` CPU ranks (default: one per core)."""
    cores, total = cpu_cores(), memory_gib()
    ranks = devices or cores
    share = cores / ranks
    per_rank = total / ranks
    return {
        "schema_version": 1,
        "name": "local-cpu",
        "description": f"this machine: {cores} cores, {total:.1f} GiB; "
        f"{ranks} CPU ranks on gloo over loopback",
        "device_groups": [
            {
                "name": "cpu",
                "kind": "cpu",
                "model": cpu_model(),
                "nodes": 1,
                "devices_per_node": ranks,
                "memory_gib": round(per_rank, 3),
                # Python + torch take about half a GiB per process; never more than a quarter.
                "reserved_memory_gib": round(min(0.5, per_rank / 4), 3),
                "memory_bandwidth_gb_per_s": round(MEMORY_GB_PER_S_PER_CORE * share, 4),
                "peak_tflops": {"fp32": round(FP32_TFLOPS_PER_CORE * share, 5)},
                "intra_node_level": "loopback",
                "kernel_launch_us": OP_DISPATCH_US,
                # The fp32 peak is itself a measured matmul rate, hence matmul 1.0.
                "compute_efficiency": {"matmul": 1.0, "attention": 0.6, "memory_bound": 0.8},
            }
        ],
        "levels": [
            {
                "name": "loopback",
                "kind": "loopback",
                "scope": "node",
                "bandwidth_gb_per_s": GLOO_BUS_GB_PER_S,
                "latency_us": GLOO_HOP_LATENCY_US,
                "efficiency": 1.0,
            },
            {
                # Only used with nodes=N > 1. shared/reference/hardware.md: Ethernet 100 Gb/s =
                # 12.5 GB/s, "typical single-NIC cloud node"; efficiency and latency assumed.
                "name": "ethernet",
                "kind": "ethernet",
                "scope": "cluster",
                "bandwidth_gb_per_s": 12.5,
                "nics_per_node": 1,
                "latency_us": 14.0,
                "efficiency": 0.8,
            },
        ],
    }
