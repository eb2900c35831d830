"""``fxplan calibrate``: measure this node and write the cluster spec the measurements imply.

Starting from a spec ``S`` (by default the one ``fxplan doctor`` matches), four measurements:

1. **Op database** — ``fxplan profile``'s grid on the local device (bf16 on GPUs, fp32 on CPU),
   written beside the spec (``<spec>.ops.json``; the cost model prices from it when its folder
   is on ``FXPLAN_OP_DB_PATH`` or it is copied to the user cache), and the compute efficiencies
   it implies (:mod:`~fxplan.calibration.compute`).
2. **Collectives** among the node's devices — all-reduce, all-gather, reduce-scatter,
   all-to-all and send/recv over a size sweep, under torchrun on every local device
   (:mod:`~fxplan.calibration.collectives_worker`) — and the node level's effective bandwidth
   and hop latency fitted to them in the cost model's own form
   (:func:`~fxplan.calibration.collectives.fit_level`).
3. **Memory** a process holds before its first tensor: the CUDA context on GPUs
   (``cuda_context_gib``), the process baseline on CPU ranks (``reserved_memory_gib``); the
   device's total memory on GPUs (``memory_gib``).
4. **Host↔device bandwidth** on GPUs (``host_link_gb_per_s``, for offload).

What is written into the derived spec: on GPUs, every value above. On CPU ranks, the process
baseline only: the ``local-cpu`` spec's compute and gloo constants are measured inside training
steps (a model's timed graph nodes, and collectives between its computations, where gloo costs
several times what it does in a tight loop; ``benchmarks/gloo_in_situ.py``), so the grid's and
the tight loop's values are reported beside them, not written over them. Every written value
carries a comment saying how and when it was measured.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from fxplan.calibration import collectives as coll
from fxplan.calibration.compute import implied_efficiencies
from fxplan.calibration.spec_yaml import Path as SpecPath
from fxplan.calibration.spec_yaml import dump
from fxplan.cluster_specs import Cluster

__all__ = ["Row", "Calibration", "SWEEPS", "calibrate", "derived_name"]

#: (sizes in bytes, timed iterations) per device kind and mode.
SWEEPS: dict[tuple[str, bool], tuple[tuple[int, ...], int]] = {
    ("gpu", False): ((1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30), 20),
    ("gpu", True): ((1 << 20, 16 << 20, 256 << 20), 5),
    ("cpu", False): ((4 << 10, 64 << 10, 1 << 20, 4 << 20), 10),
    ("cpu", True): ((64 << 10, 1 << 20, 4 << 20), 5),
}


@dataclass(frozen=True)
class Row:
    """One line of the comparison: the spec's value, the measured one, whether it was written."""

    quantity: str
    unit: str
    spec: float | None
    measured: float | None
    written: bool
    how: str = ""

    @property
    def difference(self) -> float | None:
        """``measured / spec − 1``, or ``None`` where either is missing or the spec's is 0."""
        if self.spec is None or self.measured is None or self.spec == 0:
            return None
        return self.measured / self.spec - 1.0


@dataclass
class Calibration:
    """The derived spec, its comments, the comparison rows and what the runs measured."""

    base: str
    spec: dict[str, Any]
    comments: dict[SpecPath, str] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    op_database: Path | None = None
    collectives: dict[str, Any] | None = None

    def yaml(self) -> str:
        today = datetime.date.today().isoformat()
        header = (f"{self.spec['name']}: derived from {self.base} by `fxplan calibrate` on {today}.\n"
                  "Values with a comment were measured on this node; the rest are the base spec's.")
        return dump(self.spec, self.comments, header)

    def to_dict(self) -> dict[str, Any]:
        return {"base": self.base, "name": self.spec["name"],
                "op_database": str(self.op_database) if self.op_database else None,
                "rows": [{"quantity": r.quantity, "unit": r.unit, "spec": r.spec,
                          "measured": r.measured, "difference": r.difference,
                          "written": r.written, "how": r.how} for r in self.rows],
                "notes": self.notes, "collectives": self.collectives}


def derived_name(base: str) -> str:
    """``local-cpu:devices=2`` → ``local-cpu-devices-2-calibrated``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-") + "-calibrated"


def _stamp(ranks: int, backend: str) -> str:
    from importlib import metadata

    return (f"fxplan calibrate {datetime.date.today().isoformat()}, torch "
            f"{metadata.version('torch')}, {ranks} rank(s) on {backend}")


def _group_path(key: str) -> SpecPath:
    """The path of ``key`` of the (first) device group in the spec."""
    return ("device_groups", 0, key)


def _compute(cal: Calibration, cluster: Cluster, device: str, quick: bool, out: Path,
             say: Callable[[str], None]) -> None:
    from fxplan.cost_model.compute.profiler import profile

    gpu = device == "cuda"
    dtype = "bf16" if gpu else "fp32"
    say(f"op database: timing the profile grid on {device} in {dtype}"
        f"{' (quick)' if quick else ''} …")
    group = cluster.device_groups[0]
    db = profile(device, quick=quick, dtype=dtype, device_model=group.model if not gpu else None)
    cal.op_database = db.save(out.with_suffix(".ops.json"))
    cal.rows.append(Row("op database records", "", None, float(len(db.records)), True,
                        f"{cal.op_database.name}"))
    stamp = _stamp(1, device)
    for e in implied_efficiencies(db, group):
        written = gpu
        if written:
            cal.spec["device_groups"][0].setdefault("compute_efficiency", {})[e.key] = round(e.implied, 4)
            cal.comments[("device_groups", 0, "compute_efficiency", e.key)] = (
                f"{stamp}: implied by the op database ({', '.join(e.ops)}, largest third, "
                f"{e.samples} shapes); was {e.spec:g}")
        cal.rows.append(Row(f"compute efficiency {e.key}", "", e.spec, e.implied, written,
                            f"from {', '.join(e.ops)}"))
    if not gpu:
        cal.notes.append("CPU: the op grid's efficiencies are reported, not written — local-cpu's "
                         "class efficiencies come from a model's timed graph nodes "
                         "(cost_model/compute/class_efficiency.py)")


def _collectives(cal: Calibration, cluster: Cluster, ranks: int, kind: str, quick: bool,
                 say: Callable[[str], None]) -> None:
    group = cluster.device_groups[0]
    level = group.intra_node_level
    if ranks < 2:
        cal.notes.append("one device on this node: no collective to measure")
        return
    sizes, iters = SWEEPS[(kind, quick)]
    say(f"collectives: {ranks} ranks, {len(sizes)} sizes × {iters} iterations under torchrun …")
    data = coll.measure(ranks, sizes, iters)
    cal.collectives = data
    measured = coll.points(data)
    for name, row in data["collectives"].items():
        if "error" in row:
            cal.notes.append(f"{name}: not run by {data['backend']} ({row['error']})")
    if not measured:
        return
    base = Cluster.from_dict(cal.spec, source="calibration")
    largest = max(p.nbytes for p in measured)
    for p in (p for p in measured if p.nbytes == largest):
        predicted = coll.predict(base, p, ranks)
        cal.rows.append(Row(f"{p.kind} {largest >> 20} MiB", "ms", predicted * 1e3, p.seconds * 1e3,
                            False, f"bus bandwidth {coll.busbw_gb_per_s(p, ranks):.3g} GB/s"))
    fit = coll.fit_level(cal.spec, level, measured, ranks)
    spec_level = cluster.level(level)
    written = kind == "gpu"
    cal.rows.append(Row(f"{level} effective bandwidth", "GB/s",
                        spec_level.bandwidth_gb_per_s * spec_level.efficiency,
                        fit.bandwidth_gb_per_s, written, "fitted to every measured point"))
    cal.rows.append(Row(f"{level} hop latency", "µs", spec_level.latency_us, fit.latency_us,
                        written, "fitted to every measured point"))
    cal.rows.append(Row("collectives: relative RMS error of the model", "%",
                        100 * fit.rms_error_before, 100 * fit.rms_error_after, written,
                        "the spec's level → the fitted one"))
    if written:
        cal.spec = coll.with_level(cal.spec, level, bandwidth_gb_per_s=fit.bandwidth_gb_per_s,
                                   latency_us=fit.latency_us)
        index = next(i for i, lv in enumerate(cal.spec["levels"]) if lv["name"] == level)
        how = (f"{_stamp(ranks, data['backend'])}: fitted to {fit.points} timed collectives "
               f"(relative RMS error {fit.rms_error_before:.0%} → {fit.rms_error_after:.0%})")
        for key in ("bandwidth_gb_per_s", "efficiency", "latency_us"):
            cal.comments[("levels", index, key)] = how
    else:
        cal.notes.append(
            f"CPU: the {level} fit is reported, not written — gloo inside a training step costs "
            "more than in a tight loop, which is what local-cpu's constants price "
            "(benchmarks/gloo_in_situ.py)")


def _memory(cal: Calibration, cluster: Cluster, kind: str) -> None:
    data = cal.collectives
    if data is None:
        return
    group = cluster.device_groups[0]
    stamp = _stamp(data["ranks"], data["backend"])
    memory = [m for m in data["memory"] if m]
    if kind == "gpu":
        from fxplan.cost_model.memory.runtime import CUDA_CONTEXT_BYTES

        context = max(m["context_gib"] for m in memory)
        total = min(m["total_gib"] for m in memory)
        nccl = max(m.get("nccl_gib", 0.0) for m in memory)
        spec_context = group.cuda_context_gib if group.cuda_context_gib is not None \
            else CUDA_CONTEXT_BYTES / 2**30
        cal.spec["device_groups"][0]["cuda_context_gib"] = round(context, 3)
        cal.comments[_group_path("cuda_context_gib")] = (
            f"{stamp}: total − free (torch.cuda.mem_get_info) after the context, a cuBLAS "
            "handle and a first kernel, largest over ranks")
        cal.spec["device_groups"][0]["memory_gib"] = round(total, 3)
        cal.comments[_group_path("memory_gib")] = (
            f"{stamp}: the device's total memory as the driver reports it")
        cal.rows += [Row("memory per device", "GiB", group.memory_gib, total, True),
                     Row("CUDA context per process", "GiB", spec_context, context, True),
                     Row("NCCL communicator (world group)", "GiB", None, nccl, False,
                         "priced per plan by cost_model/memory/runtime.py")]
        link = data.get("host_link_gb_per_s")
        if link:
            cal.spec["device_groups"][0]["host_link_gb_per_s"] = round(link, 3)
            cal.comments[_group_path("host_link_gb_per_s")] = (
                f"{stamp}: pinned host → device copy of 256 MiB, every device at once, median of 5")
            cal.rows.append(Row("host → device bandwidth", "GB/s", group.host_link_gb_per_s,
                                link, True))
        return
    baseline = max(m["baseline_gib"] for m in memory)
    cal.spec["device_groups"][0]["reserved_memory_gib"] = round(baseline, 3)
    cal.comments[_group_path("reserved_memory_gib")] = (
        f"{stamp}: resident set of a rank once torch, the gloo group and a first collective "
        "are up, largest over ranks")
    cal.rows.append(Row("process baseline per rank", "GiB", group.reserved_memory_gib, baseline,
                        True))


def calibrate(base: str, out: Path, *, quick: bool = False, ranks: int | None = None,
              progress: Callable[[str], None] | None = None) -> Calibration:
    """Measure this node and derive a spec from ``base`` (module docstring); ``out`` names the
    spec file (the op database goes beside it). Nothing is written to ``out`` here."""
    import torch

    say = progress or (lambda _: None)
    cluster = Cluster.load(base)
    group = cluster.device_groups[0]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    kind = "gpu" if device == "cuda" else "cpu"
    if group.kind != kind:
        raise coll.CalibrationError(
            f"--cluster {base} describes {group.kind} devices but this machine runs on "
            f"{'CUDA GPUs' if kind == 'gpu' else 'its CPU (no CUDA device)'}: calibrate "
            "from a spec of this machine's devices (`fxplan doctor` names one)")
    local = torch.cuda.device_count() if kind == "gpu" else group.devices_per_node
    ranks = min(local, group.devices_per_node) if ranks is None else ranks
    if not 1 <= ranks <= local:
        raise coll.CalibrationError(f"--ranks {ranks}: this node has {local} device(s) for "
                                    f"{base}; expected 1 … {local}")
    spec = cluster.to_dict()
    spec["name"] = derived_name(base)
    spec["description"] = (f"{spec.get('description', '')} — calibrated on this node "
                           f"{datetime.date.today().isoformat()}").strip(" —")
    cal = Calibration(base, spec)
    _compute(cal, cluster, device, quick, out, say)
    _collectives(cal, cluster, ranks, kind, quick, say)
    if cal.collectives is None and ranks == 1:   # one device: the worker still measures memory
        cal.collectives = coll.measure(1, SWEEPS[(kind, quick)][0][:1], 1)
    _memory(cal, cluster, kind)
    Cluster.from_dict(cal.spec, source=str(out))   # the derived spec must load
    return cal
