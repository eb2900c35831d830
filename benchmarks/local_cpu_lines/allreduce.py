"""Gloo's all-reduce on idle loopback ranks: hop latency and bus bandwidth (line 3.). The formulas
are in ``local_cpu_calibration.py``'s docstring."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["allreduce", "ALLREDUCE_BYTES"]


ALLREDUCE_BYTES = (4, 4 * 2**20, 16 * 2**20)


def allreduce(world: int) -> dict[str, float]:
    """Gloo all-reduce on ``world`` local processes: times, hop latency, bus bandwidth."""
    from collectives_table import measure_gloo  # benchmarks/, the script's folder

    alpha_s = _base_latency_s()
    times = measure_gloo(world, list(ALLREDUCE_BYTES))
    small, s1, s2 = ALLREDUCE_BYTES
    factor = 2 * (world - 1) / world
    return {"t_4B_us": times[small] * 1e6, "t_4MiB_ms": times[s1] * 1e3,
            "t_16MiB_ms": times[s2] * 1e3,
            "hop_latency_us": (times[small] - alpha_s) / (2 * (world - 1)) * 1e6,
            "bus_gb_per_s": factor * (s2 - s1) / (times[s2] - times[s1]) / 1e9}


def _base_latency_s() -> float:
    """The cost model's per-collective base latency ``α`` (ring), seconds."""
    data = json.loads((Path(__file__).resolve().parents[2] / "cost_model" / "data"
                       / "collectives.json").read_text())
    for key in ("base_latency_us", "alpha_us"):
        if key in data:
            value = data[key]
            return (value["ring"] if isinstance(value, dict) else value) * 1e-6
    return 6.0e-6
