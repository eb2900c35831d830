"""Compute time of one op: a profiled op database where there is one, else a roofline.

Roofline (forward), for an op of class ``c`` doing ``F`` FLOPs and moving ``B`` bytes on a
device with peak ``P_dtype`` FLOP/s and memory bandwidth ``BW`` bytes/s:

    t = max( F / (P_dtype · e_c(F)),  B / (BW · e_m(B)) ) + t_launch

``e_c``/``e_m`` are the saturating efficiency curves and ``P_dtype`` the peak chosen by
:mod:`cost_model.compute.efficiency` (tf32 explicit through ``allow_tf32``); ``t_launch`` is the
device's ``kernel_launch_us``, paid once per kernel. ``view`` ops (and ops with neither FLOPs
nor bytes) run no kernel and cost 0.

Database: when ``database`` is an :class:`~cost_model.compute.op_database.OpDatabase` (or ``"auto"``
and one measured on ``device.model`` is found by
:func:`~cost_model.compute.op_database.find_database`), its estimate of the measured op (``op``, or
the op standing for the class, ``OP_CLASS_OPS``) replaces the roofline; measured times
already include launch overhead. Ops or dtypes it has not measured fall back to the roofline.

Backward (``BACKWARD``, per op class): the backward pass of an op is ``k`` kernels that
together do ``f·F`` FLOPs and move ``b·B`` bytes, each priced like a forward op of
``f·F/k`` FLOPs and ``b·B/k`` bytes:

    t_bwd = k · op_time(F·f/k, B·b/k)   (+ t_fwd when the op is recomputed)

The backward kernels are priced as the op's own class unless the rule names another
(``priced_as``), at the device's ``backward_efficiency`` where it gives one (else its
``compute_efficiency``; :mod:`cost_model.compute.efficiency`): dropout's backward is a multiply by the saved mask, an elementwise kernel,
not the random-number draw that makes its forward slow on CPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence, Union

from fxplan.cost_model.compute.efficiency import family_of, load_efficiency
from fxplan.cost_model.compute.op_database import OP_CLASS_OPS, OpDatabase, find_database

__all__ = ["BackwardRule", "BACKWARD", "op_time_s", "backward_time_s", "node_time_s", "roofline_time_s"]

DatabaseArg = Union[OpDatabase, None, Literal["auto"]]


@dataclass(frozen=True)
class BackwardRule:
    """Backward of an op class relative to its forward: FLOPs ×``flops``, bytes ×``bytes``,
    in ``kernels`` kernels; ``why`` says where the numbers come from; ``priced_as`` is the op
    class whose efficiency prices those kernels (``None``: the op's own)."""

    flops: float
    bytes: float
    kernels: int
    why: str
    priced_as: str | None = None


#: Backward pricing per op class (forward work × these factors).
BACKWARD: dict[str, BackwardRule] = {
    "matmul": BackwardRule(2.0, 2.0, 2, "dX = dY·Wᵀ and dW = Xᵀ·dY, each a GEMM of the forward's size"),
    "conv": BackwardRule(2.0, 2.0, 2, "data-gradient and weight-gradient convolutions"),
    "attention": BackwardRule(2.5, 2.0, 1, "fused (Flash) backward: 5 GEMMs vs 2 forward, "
                              "reads q,k,v,o,dO and writes dq,dk,dv (8 tensors vs 4)"),
    "elementwise": BackwardRule(2.0, 2.0, 1, "reads dY and the saved input(s), writes dX"),
    "norm": BackwardRule(2.0, 2.0, 2, "dX kernel and the dγ/dβ reduction"),
    "softmax": BackwardRule(1.5, 1.5, 1, "reads Y and dY, writes dX (3 tensors vs 2)"),
    "dropout": BackwardRule(0.5, 1.0, 1, "dX = dY · mask / (1−p): same traffic as forward",
                             priced_as="elementwise"),
    "embedding": BackwardRule(1.0, 2.0, 2, "zero the weight gradient, scatter-add dY rows into it"),
    "reduction": BackwardRule(1.0, 1.0, 1, "broadcast dY back to the input's shape"),
    "loss": BackwardRule(1.0, 4.0, 2, "cross_entropy is nll_loss(log_softmax(x)) in ATen: "
                         "nll_loss's backward writes a dense gradient of the log-probabilities, "
                         "log_softmax's reads it and the saved log-probabilities and writes dX "
                         "(4 passes over the logits vs the forward's 1 read)"),
    "pool": BackwardRule(1.0, 2.0, 1, "scatter dY to the pooled positions"),
    "other": BackwardRule(2.0, 2.0, 1, "assumed like an elementwise op"),
    "view": BackwardRule(0.0, 0.0, 0, "no kernel"),
}


def _auto_database(device_model: str) -> OpDatabase | None:
    """:func:`~cost_model.compute.op_database.find_database`, which caches on the search path's files
    and their mtimes (never "no database" for the life of the process)."""
    return find_database(device_model)


def _resolve(database: DatabaseArg, device: Any) -> OpDatabase | None:
    if database == "auto":
        return _auto_database(device.model)
    if database is None or database.matches(device.model):
        return database
    raise ValueError(f"op database measured on {database.device_model!r} used for a "
                     f"{device.model!r} device")


def roofline_time_s(op_class: str, flops: float, bytes_moved: float, dtype: Any, device: Any,
                    *, allow_tf32: bool | None = None, backward: bool = False) -> float:
    """Seconds of one kernel by the roofline formula of the module docstring (no database);
    ``backward=True``: a kernel of an op's backward, at the device's backward efficiencies."""
    if family_of(op_class) is None or (flops <= 0 and bytes_moved <= 0):
        return 0.0
    model = load_efficiency()
    compute_curve, memory_curve = model.curves(device, op_class, backward=backward)
    compute_s = 0.0
    if flops > 0:
        peak = model.peak_flops(device, op_class, dtype, allow_tf32)
        compute_s = flops / (peak * compute_curve(flops))
    memory_s = 0.0
    if bytes_moved > 0:
        memory_s = bytes_moved / (device.memory_bandwidth_gb_per_s * 1e9 * memory_curve(bytes_moved))
    return max(compute_s, memory_s) + device.kernel_launch_us * 1e-6


def op_time_s(op_class: str, flops: float, bytes_moved: float, dtype: Any, device: Any, *,
              op: str | None = None, shapes: Sequence[Sequence[int]] | None = None,
              database: DatabaseArg = "auto", allow_tf32: bool | None = None,
              backward: bool = False) -> float:
    """Forward seconds of one op on one ``DeviceGroup`` device (module docstring).

    ``op``/``shapes`` (the measured op's name and its input shapes, see
    :data:`cost_model.compute.op_database.OPS`) sharpen the database lookup; without them the op
    standing for ``op_class`` is interpolated in FLOPs or bytes. ``backward=True`` prices a
    kernel of a backward pass (the roofline at the device's backward efficiencies; a
    database, which times forward ops, prices it as a forward op).
    """
    if family_of(op_class) is None or (flops <= 0 and bytes_moved <= 0):
        return 0.0
    db = _resolve(database, device)
    name = op or OP_CLASS_OPS.get(op_class)
    if db is not None and name is not None:
        measured = db.estimate(name, dtype, shapes=shapes, flops=flops, bytes_moved=bytes_moved)
        if measured is not None:
            return measured
    return roofline_time_s(op_class, flops, bytes_moved, dtype, device, allow_tf32=allow_tf32,
                           backward=backward)


def backward_time_s(op_class: str, flops: float, bytes_moved: float, dtype: Any, device: Any, *,
                    recompute: bool = False, op: str | None = None,
                    shapes: Sequence[Sequence[int]] | None = None, database: DatabaseArg = "auto",
                    allow_tf32: bool | None = None) -> float:
    """Backward seconds of an op whose *forward* does ``flops``/``bytes_moved``:
    ``k · op_time(f·F/k, b·B/k)`` by :data:`BACKWARD`, plus the forward again if
    ``recompute``. ``shapes`` are used only when each backward kernel is forward-sized."""
    rule = BACKWARD[op_class]
    total = 0.0
    if rule.kernels:
        per_flops, per_bytes = flops * rule.flops / rule.kernels, bytes_moved * rule.bytes / rule.kernels
        same_size = rule.flops == rule.kernels and rule.bytes == rule.kernels
        kernel_class, kernel_op = (rule.priced_as, None) if rule.priced_as else (op_class, op)
        total = rule.kernels * op_time_s(kernel_class, per_flops, per_bytes, dtype, device,
                                         op=kernel_op, shapes=shapes if same_size else None,
                                         database=database, allow_tf32=allow_tf32,
                                         backward=True)
    if recompute:
        total += op_time_s(op_class, flops, bytes_moved, dtype, device, op=op, shapes=shapes,
                           database=database, allow_tf32=allow_tf32)
    return total


def _node_dtype(dtype: Any) -> Any:
    """A node's dtype for pricing: the first of a tuple output; fp32 for non-tensor values."""
    if isinstance(dtype, tuple):
        dtype = dtype[0] if dtype else None
    return "fp32" if dtype is None else dtype


def node_time_s(info: Any, device: Any, *, shard_factor: float = 1, dtype: Any = None,
                database: DatabaseArg = "auto", backward: bool = False, recompute: bool = False,
                allow_tf32: bool | None = None) -> float:
    """Seconds of a captured node (:class:`passes.capture.NodeInfo`) on one device whose share
    of the work is ``1/shard_factor``: FLOPs and bytes are divided by ``shard_factor``.

    ``dtype`` overrides the node's (e.g. bf16 under mixed precision). ``backward=True`` prices
    the node's backward (and its recomputed forward if ``recompute``) instead of its forward.
    """
    if shard_factor <= 0:
        raise ValueError(f"shard_factor must be > 0, got {shard_factor}")
    flops = float(info.flops or 0) / shard_factor
    bytes_moved = float((info.bytes_read or 0) + (info.bytes_written or 0)) / shard_factor
    use_dtype = _node_dtype(info.dtype) if dtype is None else dtype
    if backward:
        return backward_time_s(info.op_class, flops, bytes_moved, use_dtype, device,
                               recompute=recompute, database=database, allow_tf32=allow_tf32)
    return op_time_s(info.op_class, flops, bytes_moved, use_dtype, device, database=database,
                     allow_tf32=allow_tf32)
