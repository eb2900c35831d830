"""Collectives measured among the node's devices, and the link level fitted to them.

:func:`measure` starts :mod:`~fxplan.calibration.collectives_worker` under torchrun on ``n``
local ranks (gloo over loopback on CPU, nccl on GPUs) and returns what rank 0 wrote.

:func:`fit_level` fits the two constants of the node's link level — the effective bandwidth
``B = bandwidth_gb_per_s × efficiency`` and the hop latency ``h = latency_us`` — to the measured
times in the cost model's own form. For a fixed algorithm every collective's price
(:mod:`fxplan.cost_model.comm.collectives`) is affine in ``h`` and in ``u = 1/B``:

    t_i(h, u) = t_i(h₀, u₀) + a_i·(h − h₀) + b_i·(u − u₀)

with ``a_i`` and ``b_i`` read off the model itself (the price of each measured point on the
spec, on the spec with ``h₀ + 1 µs`` and on the spec with ``2·B₀``), so α, the bus factors, the
algorithm choice and gloo's CPU per step are the model's, not re-derived here. ``h`` and ``u``
minimise the relative squared error ``Σ ((t_i(h, u) − m_i)/m_i)²`` over every measured point,
with ``h ≥ 0`` and ``u > 0`` (a two-variable non-negative least squares: the unconstrained
solution, else the best with one variable held at its bound). The form is affine only while
the model keeps its choice of algorithm (ring, tree, NVLS), so the fit is re-linearised at each
new estimate until it stops moving (at most :data:`FIT_ROUNDS` rounds): on times the model
itself produced, it recovers the level they came from.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from fxplan.cluster_specs import Cluster
from fxplan.core.errors import UserError
from fxplan.cost_model.comm.collectives import collective_time_s

__all__ = ["CalibrationError", "Point", "LevelFit", "measure", "points", "fit_level",
           "with_level", "predict"]


class CalibrationError(UserError):
    """A calibration step could not run (the message says which and why)."""


@dataclass(frozen=True)
class Point:
    """One measured collective: kind, nccl-tests size in bytes, seconds."""

    kind: str
    nbytes: int
    seconds: float


@dataclass(frozen=True)
class LevelFit:
    """The fitted level: effective bandwidth (GB/s) and hop latency (µs), with the relative RMS
    error of the model over the measured points before (the spec) and after (the fit)."""

    level: str
    bandwidth_gb_per_s: float
    latency_us: float
    points: int
    rms_error_before: float
    rms_error_after: float


def measure(ranks: int, sizes: Sequence[int], iters: int, *, timeout_s: float = 600) -> dict[str, Any]:
    """Run the worker on ``ranks`` local ranks under torchrun; its JSON (module docstring)."""
    from fxplan.core.loopback import loopback_torchrun

    with tempfile.TemporaryDirectory(prefix="fxplan-calibrate-") as tmp:
        out = Path(tmp) / "collectives.json"
        sockets, torchrun = loopback_torchrun(ranks)
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               **sockets}
        cmd = [*torchrun, "-m", "fxplan.calibration.collectives_worker", "--out", str(out),
               "--sizes", ",".join(str(s) for s in sizes), "--iters", str(iters)]
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as err:
            raise CalibrationError(f"the collectives benchmark on {ranks} ranks did not finish in "
                                   f"{timeout_s:.0f} s; check that the devices are free") from err
        if done.returncode != 0 or not out.exists():
            tail = " | ".join(line for line in done.stderr.strip().splitlines()[-3:])
            raise CalibrationError(f"the collectives benchmark on {ranks} ranks failed (exit "
                                   f"{done.returncode}): {tail or 'no output'}")
        return json.loads(out.read_text())


def points(data: Mapping[str, Any]) -> list[Point]:
    """The measured points of a worker's JSON (kinds that failed are left out)."""
    found = []
    for kind, row in data["collectives"].items():
        if "error" in row:
            continue
        found += [Point(kind, int(size), float(seconds)) for size, seconds in row.items()]
    return found


def _level(spec: Mapping[str, Any], name: str) -> dict[str, Any]:
    for level in spec["levels"]:
        if level["name"] == name:
            return level
    raise KeyError(name)


def with_level(spec: Mapping[str, Any], name: str, *, bandwidth_gb_per_s: float | None = None,
               latency_us: float | None = None) -> dict[str, Any]:
    """A copy of ``spec`` whose level ``name`` has effective bandwidth ``bandwidth_gb_per_s``
    (the nominal bandwidth kept and the efficiency set, while that needs an efficiency ≤ 1;
    else the bandwidth set at efficiency 1) and hop latency ``latency_us``."""
    out = copy.deepcopy(dict(spec))
    level = _level(out, name)
    if bandwidth_gb_per_s is not None:
        nominal = float(level["bandwidth_gb_per_s"])
        if bandwidth_gb_per_s <= nominal:
            level["efficiency"] = round(bandwidth_gb_per_s / nominal, 4)
        else:
            level["bandwidth_gb_per_s"], level["efficiency"] = round(bandwidth_gb_per_s, 4), 1.0
    if latency_us is not None:
        level["latency_us"] = round(latency_us, 3)
    return out


def predict(cluster: Cluster, point: Point, ranks: int) -> float:
    """The cost model's seconds for ``point`` over ranks ``0 … ranks−1`` (a send/recv: 0 → 1)."""
    group = (0, 1) if point.kind == "send_recv" else tuple(range(ranks))
    return collective_time_s(point.kind, point.nbytes, group, cluster)


def _rms(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.sqrt(np.mean(((predicted - measured) / measured) ** 2)))


def _nnls2(a: np.ndarray, b: np.ndarray, r: np.ndarray) -> tuple[float, float]:
    """``(x, y) ≥ 0`` minimising ``‖x·a + y·b − r‖²`` (two columns)."""
    best: tuple[float, float, float] | None = None
    matrix = np.stack([a, b], axis=1)
    candidates: list[tuple[float, float]] = []
    solution, *_ = np.linalg.lstsq(matrix, r, rcond=None)
    candidates.append((float(solution[0]), float(solution[1])))
    for column, other in ((a, "x"), (b, "y")):
        denom = float(column @ column)
        if denom > 0:
            value = max(0.0, float(column @ r) / denom)
            candidates.append((value, 0.0) if other == "x" else (0.0, value))
    for x, y in candidates:
        if x < 0 or y < 0:
            continue
        err = float(np.sum((x * a + y * b - r) ** 2))
        if best is None or err < best[2]:
            best = (x, y, err)
    return (best[0], best[1]) if best is not None else (0.0, 0.0)


def _linearised(spec: Mapping[str, Any], level_name: str, measured: Sequence[Point], ranks: int,
                h0: float, b0: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(t0, a, b)``: the model's times at ``(h0, b0)`` and their slopes in ``h`` and ``u = 1/B``."""
    at = Cluster.from_dict(with_level(spec, level_name, bandwidth_gb_per_s=b0, latency_us=h0),
                           source="calibration")
    hop = Cluster.from_dict(with_level(spec, level_name, bandwidth_gb_per_s=b0,
                                       latency_us=h0 + 1.0), source="calibration")
    wide = Cluster.from_dict(with_level(spec, level_name, bandwidth_gb_per_s=2 * b0,
                                        latency_us=h0), source="calibration")
    t0 = np.array([predict(at, p, ranks) for p in measured])
    a = np.array([predict(hop, p, ranks) for p in measured]) - t0
    u0 = 1.0 / b0
    b = (np.array([predict(wide, p, ranks) for p in measured]) - t0) / (0.5 * u0 - u0)
    return t0, a, b


#: Re-linearisations of :func:`fit_level` (the algorithm the model picks — ring, tree, NVLS —
#: can change with the constants, so the affine form holds piecewise).
FIT_ROUNDS = 12


def fit_level(spec: Mapping[str, Any], level_name: str, measured: Sequence[Point],
              ranks: int) -> LevelFit:
    """Fit the level's effective bandwidth and hop latency (module docstring), re-linearising
    the model at each new estimate until it stops moving."""
    level = _level(spec, level_name)
    b0 = float(level["bandwidth_gb_per_s"]) * float(level.get("efficiency", 1.0))
    h0 = float(level["latency_us"])
    m = np.array([p.seconds for p in measured])
    first = None
    h, bandwidth = h0, b0
    for _ in range(FIT_ROUNDS):
        t0, a, b = _linearised(spec, level_name, measured, ranks, h, bandwidth)
        if first is None:
            first = t0
        u0 = 1.0 / bandwidth
        # t = t0 − a·h0 − b·u0 + a·h + b·u, relative weights 1/m
        r = (m - t0 + a * h + b * u0) / m
        new_h, u = _nnls2(a / m, b / m, r)
        new_bandwidth = 1.0 / u if u > 0 else bandwidth
        done = abs(new_h - h) < 1e-4 and abs(new_bandwidth / bandwidth - 1) < 1e-6
        h, bandwidth = new_h, new_bandwidth
        if done:
            break
    fitted = Cluster.from_dict(with_level(spec, level_name, bandwidth_gb_per_s=bandwidth,
                                          latency_us=h), source="calibration")
    after = np.array([predict(fitted, p, ranks) for p in measured])
    return LevelFit(level_name, bandwidth, h, len(measured), _rms(first, m), _rms(after, m))


def busbw_gb_per_s(point: Point, ranks: int) -> float:
    """nccl-tests' bus bandwidth of a measured point (GB/s)."""
    from fxplan.cost_model.comm.collectives import bus_factor

    n = 2 if point.kind == "send_recv" else ranks
    return point.nbytes / point.seconds * bus_factor(point.kind, n) / 1e9 if point.seconds > 0 \
        else math.inf
