"""Memory per rank: model states under ZeRO, activations in flight, buffers, reserve.

**Model states** (Rajbhandari et al., 2020). ``Ψ`` parameters on a rank (after tensor and
pipeline splitting), ``N`` data-parallel ranks, an optimizer keeping ``k_p`` bytes of
weights, ``k_g`` of gradients and ``k_o`` of states per parameter — Adam in mixed precision:
``k_p = 2`` (16-bit weights), ``k_g = 2`` (16-bit gradients), ``k_o = 12`` (fp32 master
weights, momentum, variance)::

    ZeRO-0   (k_p + k_g + k_o)·Ψ          = 16Ψ
    ZeRO-1   (k_p + k_g)·Ψ + k_o·Ψ/N      = 4Ψ + 12Ψ/N
    ZeRO-2   k_p·Ψ + (k_g + k_o)·Ψ/N      = 2Ψ + 14Ψ/N
    ZeRO-3   (k_p + k_g + k_o)·Ψ/N        = 16Ψ/N

That is Megatron-LM's and DeepSpeed's layout (:data:`ADAM_MIXED`). fxplan's runtime keeps the
parameters themselves as the fp32 masters and computes in 16 bits under autocast (FSDP2 gathers
them in the compute dtype): :data:`ADAM_AMP`, ``k_p = 4``, ``k_g = 4`` (fp32 gradients, reduced
in fp32), ``k_o = 8`` (two fp32 moments), ``k_c = 2`` the gathered copy. DDP runs ZeRO-0 and
ZeRO-1 (``ZeroRedundancyOptimizer`` over the fp32 parameters) with the formulas above; where
FSDP2 shards the parameters without resharding them after the forward (ZeRO-2, and ZeRO-1 with
DTensor parameters, ``tp > 1`` or ``ep > 1``, which the runtime runs as ZeRO-2) each rank keeps
its fp32 shard and the whole model gathered in the compute dtype from the first forward to the
last backward::

    ZeRO-2 (params are the masters)   k_p·Ψ/N + k_c·Ψ + (k_g + k_o)·Ψ/N   = 2Ψ + 16Ψ/N

and ZeRO-3 the ``(k_p + k_g + k_o)·Ψ/N`` above (its gathered layers are buffers). Where
FSDP2's reduction waits for the last of ``m > 1`` microbatches (ZeRO-1 with DTensor
parameters, and every FSDP2 stage under torch's multi-stage schedules, whose ``REDUCE_GRAD``
pass follows the last backward; ``accumulates``) the gradients stay unsharded, accumulated in
fp32, and ZeRO-3 keeps its blocks gathered until that pass::

    deferred reduction                k_p·Ψ/N + k_c·Ψ + k_g·Ψ + k_o·Ψ/N   = 6Ψ + 12Ψ/N

At ``dp = 1`` nothing is sharded and every stage keeps ``k_p + k_g + k_o``. :func:`adam_for`
picks the layout a plan is priced in (``state_layout``): ``runtime`` (the default, what
fxplan's runtime holds and moves) or ``megatron`` (the published tables' systems).

**Offload** (:mod:`cost_model.memory.offload`): ``offload=optimizer`` keeps the weights and gradients
on the device as above and the ``k_o`` optimizer bytes on the host, with an fp32 copy of the
gradients there (``k_h = k_o + 4 = 16`` host bytes per parameter the rank updates, ``Ψ/N`` under
ZeRO ≥ 1, else ``Ψ``); ``offload=optimizer+params`` (ZeRO-3 only) keeps no model states on the
device between layers (the gathered layers are buffers) and ``k_h·Ψ/N`` on the host (fp32
shard, fp32 gradient, two fp32 moments: FSDP2's CPU offload)::

    offload=optimizer         k_p·Ψ/(N if z=3) + k_g·Ψ/(N if z≥2)   device;  16·Ψ/(N if z≥1) host
    offload=optimizer+params  0                                    device;  16·Ψ/N          host

**Activations** of stage ``s``: the peak over the schedule of ``Σ_c n_c(τ)·A_c``, where
``n_c(τ)`` counts the microbatches of chunk ``c`` forwarded but not yet backwarded at time
``τ`` (from the schedule's op order: 1F1B keeps ``min(p−s, m)``, GPipe ``m``, interleaved
``L·(1 + (p−1)/(p·v))`` layer-activations on stage 0) and ``A_c`` the chunk's saved bytes per
microbatch (:mod:`cost_model.memory.activations`), plus the *working* bytes of one recomputed layer.

**Buffers**: pipeline send and receive buffers (two boundary activations), the all-gathered
input of a column-parallel linear under sequence parallelism, and under ZeRO-3 the
gathered weights and unsharded gradients of two layers (the one running and the one
prefetched). **Runtime** (GPU only, :mod:`cost_model.memory.runtime`): the CUDA context, the
NCCL buffers of the communicators the plan creates, and the caching allocator's
fragmentation of the transient bytes. **Reserved**: ``DeviceGroup.reserved_memory_gib``,
whatever else the device spec sets aside. A stage fits when the sum leaves the requested
headroom free (:mod:`cost_model.memory.headroom`): ``total + headroom ≤ memory_gib``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter

import numpy as np

from fxplan.core.config import fsdp_shards

__all__ = ["ADAM_AMP", "ADAM_FP32", "ADAM_MIXED", "STATE_LAYOUTS", "GIB", "MEMORY_LEGEND",
           "MEMORY_ROWS", "MemoryBreakdown", "state_layout_text",
           "MemoryRows", "ModelStates", "OptimizerSpec", "adam_for", "model_state_bytes"]

GIB = float(1 << 30)


@dataclass(frozen=True)
class OptimizerSpec:
    """Bytes per parameter the optimizer keeps, and what one step moves (memory-bound).

    ``step_bytes`` = read and write the fp32 master weight, momentum and variance (2·12),
    read the 16-bit gradient (2), write the 16-bit weight (2) = 28 for mixed-precision Adam.
    ``step_flops`` ≈ 12 per parameter (moments, bias correction, update); negligible.
    ``host_bytes``: what an offloaded parameter's optimizer keeps in host memory (fp32 master
    weight, momentum, variance and the fp32 gradient it reads: 16).
    ``gather_bytes`` (``k_c``): what a ZeRO-2/3 all-gather moves per parameter and a gathered
    copy holds, the compute dtype. ``masters_are_params``: the parameters are the fp32 masters
    (torch autocast, FSDP2's ``param_dtype``), so a ZeRO-2 shard is ``k_p/N`` beside a gathered
    ``k_c`` copy (module docstring); ``False``: 16-bit parameters beside masters in the
    optimizer state.
    """

    name: str = "adam-mixed"
    param_bytes: float = 2.0
    grad_bytes: float = 2.0
    state_bytes: float = 12.0
    step_bytes: float = 28.0
    step_flops: float = 12.0
    host_bytes: float = 16.0
    gather_bytes: float = 2.0
    masters_are_params: bool = False


#: Adam with 16-bit weights and gradients and fp32 master weights and moments: 2 + 2 + 12.
ADAM_MIXED = OptimizerSpec()
#: Adam training in fp32 (no master copy): 4-byte weights and gradients, 8 bytes of moments;
#: a step reads weight, gradient and both moments (16) and writes weight and moments (12).
ADAM_FP32 = OptimizerSpec("adam-fp32", param_bytes=4.0, grad_bytes=4.0, state_bytes=8.0,
                          step_bytes=28.0, gather_bytes=4.0, masters_are_params=True)
#: Adam as fxplan's runtime keeps it in mixed precision: fp32 parameters (the masters) and
#: gradients, two fp32 moments, the compute dtype gathered (FSDP2) and cast (autocast) on the
#: fly, every gradient reduced in fp32; a step reads weight, gradient and moments and writes
#: weight and moments (28 B).
ADAM_AMP = OptimizerSpec("adam-amp", param_bytes=4.0, grad_bytes=4.0, state_bytes=8.0,
                         step_bytes=28.0, gather_bytes=2.0, masters_are_params=True)

#: The layouts of model states a plan may be priced in (:func:`adam_for`).
STATE_LAYOUTS = ("runtime", "megatron")


#: What the reports (the first text) and the export's notes (the second, brief) say of each
#: layout of the model states.
_LAYOUT_TEXTS = {
    "megatron": ("model states in Megatron-LM's layout: 16-bit weights and gradients beside "
                 "fp32 masters and moments, 2 + 2 + 12 B per parameter before ZeRO",
                 "model states in Megatron-LM's layout: 16-bit weights and gradients, fp32 "
                 "masters"),
    "runtime": ("model states as fxplan's runtime keeps them: fp32 parameters (the masters), "
                "fp32 gradients and moments, 4 + 4 + 8 B per parameter before ZeRO, reduced "
                "in fp32",
                "model states as FSDP2 keeps them: fp32 parameters and gradients"),
}


def state_layout_text(state_layout: str | None, brief: bool = False) -> str:
    """What a report says of the layout its model states were priced in (``None``: the
    runtime's, the default); ``brief``: the few words an export's note gives it."""
    return _LAYOUT_TEXTS[state_layout or "runtime"][int(brief)]


def adam_for(dtype_key: str, state_layout: str = "runtime") -> OptimizerSpec:
    """The Adam spec of a training precision in ``state_layout``: :data:`ADAM_FP32` for
    ``fp32`` (both layouts), else :data:`ADAM_AMP` (``runtime``: what fxplan's runtime keeps)
    or :data:`ADAM_MIXED` (``megatron``: 16-bit weights and gradients with fp32 master
    weights in the optimizer, as Megatron-LM and DeepSpeed keep them)."""
    if state_layout not in STATE_LAYOUTS:
        raise ValueError(f"state_layout must be one of {', '.join(STATE_LAYOUTS)}, "
                         f"got {state_layout!r}")
    if dtype_key == "fp32":
        return ADAM_FP32
    return ADAM_AMP if state_layout == "runtime" else ADAM_MIXED


@dataclass(frozen=True)
class ModelStates:
    """Bytes of weights, gradients and optimizer states on one rank's device, and of the
    states offloaded to its host (``host``, not part of :attr:`total`)."""

    params: float
    grads: float
    optimizer: float
    host: float = 0.0

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def model_state_bytes(num_params: float | np.ndarray, dp: int, zero_stage: int,
                      optimizer: OptimizerSpec = ADAM_MIXED,
                      offload: str = "none", *, dtensor: bool = False,
                      accumulates: bool = False) -> ModelStates:
    """ZeRO model states of ``num_params`` parameters, with ``offload`` moving some of them
    to the host (module docstring tables). ``num_params`` may be an array (one count per
    rank, all under the same ZeRO stage and offload): every field is then that array's
    elementwise result, each entry the float the scalar call gives. ``dtensor``: the
    parameters are DTensors (``tp > 1`` or ``ep > 1``), under which a layout whose parameters
    are the masters runs ZeRO-1 as ZeRO-2 (FSDP2). ``accumulates``: FSDP2's reduction waits
    for the last microbatch (:attr:`~fxplan.core.config.ParallelConfig.defers_sharded_reduction`),
    so in such a layout the rank keeps ``k_g·Ψ`` of unsharded gradients and, at ZeRO-3, the
    ``k_c·Ψ`` gathered copy beside its shard (module docstring)."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0–3, got {zero_stage}")
    psi = num_params.astype(float) if isinstance(num_params, np.ndarray) else float(num_params)
    n = dp
    updated = psi / (n if zero_stage >= 1 else 1)   # the parameters this rank's optimizer steps
    if offload == "optimizer+params":
        return ModelStates(0.0, 0.0, 0.0, host=optimizer.host_bytes * updated)
    # FSDP2 keeps an fp32 shard and the gathered compute copy (masters are the parameters)
    fsdp = optimizer.masters_are_params and fsdp_shards(n, zero_stage, dtensor)
    deferred = fsdp and accumulates   # gradient sync off until the last microbatch
    if fsdp and (zero_stage < 3 or deferred):
        params = optimizer.param_bytes * psi / n + optimizer.gather_bytes * psi
    else:
        params = optimizer.param_bytes * psi / (n if zero_stage >= 3 else 1)
    sharded_grads = (zero_stage >= 2 or fsdp) and not deferred
    states = ModelStates(
        params=params,
        grads=optimizer.grad_bytes * psi / (n if sharded_grads else 1),
        optimizer=optimizer.state_bytes * updated,
    )
    if offload == "optimizer":
        return ModelStates(states.params, states.grads, 0.0, host=optimizer.host_bytes * updated)
    if offload != "none":
        raise ValueError(f"offload must be none, optimizer or optimizer+params, got {offload!r}")
    return states


#: The terms of :attr:`MemoryBreakdown.total`, in report order, with the column titles tables
#: use (:data:`MEMORY_LEGEND` spells the short ones out).
MEMORY_ROWS: dict[str, str] = {
    "params": "params", "grads": "grads", "optimizer": "optimizer",
    "activations": "activations", "recompute_working": "recompute", "buffers": "buffers",
    "cuda_context": "CUDA", "nccl": "NCCL", "fragmentation": "frag.",
    "reserved": "reserved",
}


#: The :data:`MEMORY_ROWS` terms of a :class:`MemoryBreakdown` as a tuple, in their order.
_ROW_VALUES = attrgetter(*MEMORY_ROWS)


#: What the short column titles of :data:`MEMORY_ROWS` stand for (a table's caption).
MEMORY_LEGEND = ("CUDA: CUDA context; NCCL: NCCL communicator buffers; frag.: caching-allocator "
                 "fragmentation; reserved: set aside by the device spec")


@dataclass(frozen=True)
class MemoryBreakdown:
    """Peak bytes on one rank of a stage, by kind, the device's capacity and the headroom the
    plan must leave free (not part of ``total``)."""

    params: float
    grads: float
    optimizer: float
    activations: float
    recompute_working: float
    buffers: float
    reserved: float
    capacity: float
    cuda_context: float = 0.0
    nccl: float = 0.0
    fragmentation: float = 0.0
    headroom: float = 0.0
    #: bytes this rank keeps in its node's host memory (offload; not device memory)
    host: float = 0.0
    #: the node's host memory and what all its ranks keep there (0: nothing offloaded)
    host_capacity: float = 0.0
    host_node_total: float = 0.0

    @property
    def total(self) -> float:
        """Device bytes: the sum of the :data:`MEMORY_ROWS` terms (capacity, headroom and the
        host fields excluded)."""
        return sum(_ROW_VALUES(self))

    @property
    def free(self) -> float:
        """``capacity − total``: what the plan leaves free (negative when it overflows)."""
        return self.capacity - self.total

    @property
    def fits(self) -> bool:
        """``total + headroom ≤ capacity``, and the node's host memory within its capacity
        when anything is offloaded."""
        return self.total + self.headroom <= self.capacity and self.host_fits

    @property
    def host_fits(self) -> bool:
        return self.host_node_total <= self.host_capacity or self.host_node_total == 0.0

    @property
    def total_gib(self) -> float:
        return self.total / GIB

    def to_gib(self) -> dict[str, float]:
        """Every field (the host ones only when something is offloaded), the total and what
        is left free in GiB (for reports and JSON)."""
        out = {f.name: getattr(self, f.name) / GIB for f in fields(self)
               if f.name not in _HOST_FIELDS or self.host_node_total}
        out["total"] = self.total_gib
        out["free"] = self.free / GIB
        return out


#: :class:`MemoryBreakdown` fields about the node's host memory (offload), not device bytes.
_HOST_FIELDS = ("host", "host_capacity", "host_node_total")


@dataclass(frozen=True, eq=False)
class MemoryRows:
    """The :class:`MemoryBreakdown` of every rank of a plan as one array per field
    (``rows[name][s]``: field ``name`` of rank ``s``; the node fields of the host check are
    left out, 0), so a search can read the totals without building a breakdown per rank."""

    rows: dict[str, np.ndarray]

    @property
    def total(self) -> np.ndarray:
        """Each rank's :attr:`MemoryBreakdown.total`: the :data:`MEMORY_ROWS` terms summed in
        the same order, so each entry is the float the breakdown's own total gives."""
        return sum(self.rows[name] for name in MEMORY_ROWS)

    def breakdowns(self) -> list[MemoryBreakdown]:
        """One :class:`MemoryBreakdown` per rank."""
        columns = {name: np.asarray(values, dtype=float).tolist()
                   for name, values in self.rows.items()}
        return [MemoryBreakdown(**row) for row in
                (dict(zip(columns, values)) for values in zip(*columns.values()))]
