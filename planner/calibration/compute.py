"""The compute efficiencies an op database implies, in the spec's own terms.

The roofline prices a forward op of class ``c`` as ``t = max(F/(P·e_c(F)), B/(BW·e_m(B))) +
t_launch`` (:mod:`fxplan.cost_model.compute.op_time`), where the saturating curves ``e(x) = e_max ·
x/(x + x_half)`` reach the spec's ``compute_efficiency`` value ``e_max`` on large ops. A
measured time ``t_meas`` of the same op therefore implies

    e_max' = e_max · (t_model − t_launch) / (t_meas − t_launch)

(the roofline's time scales as ``1/e_max`` on the leg that binds). Small ops are dominated by
the launch and the saturation curve, so the implied value of a class is the median over its
largest third of measurements (by FLOPs or bytes). Each op class is written to the key the
cost model reads for it (:meth:`~fxplan.cost_model.compute.efficiency.EfficiencyModel.curves`: the
class itself, else its family, else ``memory_bound`` for memory-bound classes), so the
values land where the pricing looks; classes that share a key are pooled.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Mapping

from fxplan.cost_model.compute.op_time import roofline_time_s
from fxplan.cost_model.compute.efficiency import family_of, load_efficiency
from fxplan.cost_model.compute.op_database import OpDatabase

__all__ = ["OP_CLASSES", "ImpliedEfficiency", "implied_efficiencies"]

#: The op class each measured op is priced as (:data:`fxplan.cost_model.compute.op_database.OPS`).
OP_CLASSES: dict[str, str] = {"linear": "matmul", "bmm": "matmul", "sdpa": "attention",
                              "add": "elementwise", "mul": "elementwise", "gelu": "elementwise",
                              "layer_norm": "norm", "softmax": "softmax"}
#: The cap of an implied efficiency (a measurement can beat a conservative peak slightly).
MAX_EFFICIENCY = 1.0


@dataclass(frozen=True)
class ImpliedEfficiency:
    """``key`` of ``compute_efficiency``: the spec's value, the implied one, from which ops."""

    key: str
    spec: float
    implied: float
    ops: tuple[str, ...]
    samples: int


def _spec_key(op_class: str, spec: Mapping[str, float]) -> str:
    """The ``compute_efficiency`` key the cost model reads for ``op_class`` (module docstring):
    the first present of the keys of the curve that bounds it
    (:meth:`~fxplan.cost_model.compute.efficiency.EfficiencyModel.spec_keys`), else the class's own
    name (compute-bound) or ``memory_bound``."""
    compute_keys, memory_keys = load_efficiency().spec_keys(op_class)
    keys = compute_keys or memory_keys
    default = compute_keys[0] if compute_keys else memory_keys[-1]
    return next((key for key in keys if key in spec), default)


def _current(device: Any, op_class: str) -> float:
    """The ``e_max`` the cost model uses now for ``op_class`` (spec value or curve default)."""
    model = load_efficiency()
    compute, memory = model.curves(device, op_class)
    bound = model.families[family_of(op_class, model)]["bound"]
    return (compute if bound == "compute" else memory).eff_max


def implied_efficiencies(db: OpDatabase, device: Any) -> list[ImpliedEfficiency]:
    """The efficiencies ``db`` implies for ``device`` (a ``DeviceGroup``), one per spec key."""
    spec: Mapping[str, float] = getattr(device, "compute_efficiency", {}) or {}
    launch = device.kernel_launch_us * 1e-6
    pooled: dict[str, list[float]] = {}
    ops: dict[str, set[str]] = {}
    current: dict[str, float] = {}
    for op, op_class in OP_CLASSES.items():
        records = [r for r in db.records if r.op == op]
        if not records:
            continue
        records.sort(key=lambda r: r.work)
        largest = records[len(records) - max(1, len(records) // 3):]
        key = _spec_key(op_class, spec)
        e_now = _current(device, op_class)
        for r in largest:
            model_s = roofline_time_s(op_class, r.flops, r.bytes, r.dtype, device) - launch
            measured_s = r.time_s - launch
            if model_s > 0 and measured_s > 0:
                pooled.setdefault(key, []).append(min(MAX_EFFICIENCY, e_now * model_s / measured_s))
                ops.setdefault(key, set()).add(op)
                current.setdefault(key, e_now)
    return [ImpliedEfficiency(key, float(spec.get(key, current[key])),
                              statistics.median(values), tuple(sorted(ops[key])), len(values))
            for key, values in sorted(pooled.items())]
