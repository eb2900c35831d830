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

**Activations** of stage ``s``: the peak over the schedule of ``Σ_c n_c(τ)·A_c``, where
``n_c(τ)`` counts the microbatches of chunk ``c`` forwarded but not yet backwarded at time
``τ`` (from the schedule's op order: 1F1B keeps ``min(p−s, m)``, GPipe ``m``, interleaved
``L·(1 + (p−1)/(p·v))`` layer-activations on stage 0) and ``A_c`` the chunk's saved bytes per
microbatch (:mod:`cost_model.activations`), plus the *working* bytes of one recomputed layer.

**Buffers**: pipeline send and receive buffers (two boundary activations), the all-gathered
input of a column-parallel linear under sequence parallelism, and under ZeRO-3 the
gathered weights and unsharded gradients of two layers (the one running and the one
prefetched). **Runtime** (GPU only, :mod:`cost_model.runtime_memory`): the CUDA context, the
NCCL buffers of the communicators the plan creates, and the caching allocator's
fragmentation of the transient bytes. **Reserved**: ``DeviceGroup.reserved_memory_gib``,
whatever else the device spec sets aside. A stage fits when the sum leaves the requested
headroom free (:mod:`cost_model.memory_headroom`): ``total + headroom ≤ memory_gib``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["ADAM_MIXED", "GIB", "MEMORY_LEGEND", "MEMORY_ROWS", "MemoryBreakdown", "ModelStates", "OptimizerSpec",
           "model_state_bytes"]

GIB = float(1 << 30)


@dataclass(frozen=True)
class OptimizerSpec:
    """Bytes per parameter the optimizer keeps, and what one step moves (memory-bound).

    ``step_bytes`` = read and write the fp32 master weight, momentum and variance (2·12),
    read the 16-bit gradient (2), write the 16-bit weight (2) = 28 for mixed-precision Adam.
    ``step_flops`` ≈ 12 per parameter (moments, bias correction, update); negligible.
    """

    name: str = "adam-mixed"
    param_bytes: float = 2.0
    grad_bytes: float = 2.0
    state_bytes: float = 12.0
    step_bytes: float = 28.0
    step_flops: float = 12.0


#: Adam with 16-bit weights and gradients and fp32 master weights and moments: 2 + 2 + 12.
ADAM_MIXED = OptimizerSpec()


@dataclass(frozen=True)
class ModelStates:
    """Bytes of weights, gradients and optimizer states on one rank."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def model_state_bytes(num_params: float, dp: int, zero_stage: int,
                      optimizer: OptimizerSpec = ADAM_MIXED) -> ModelStates:
    """ZeRO model states of ``num_params`` parameters (module docstring table)."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0–3, got {zero_stage}")
    psi, n = float(num_params), dp
    return ModelStates(
        params=optimizer.param_bytes * psi / (n if zero_stage >= 3 else 1),
        grads=optimizer.grad_bytes * psi / (n if zero_stage >= 2 else 1),
        optimizer=optimizer.state_bytes * psi / (n if zero_stage >= 1 else 1),
    )


#: The terms of :attr:`MemoryBreakdown.total`, in report order, with the column titles tables
#: use (:data:`MEMORY_LEGEND` spells the short ones out).
MEMORY_ROWS: dict[str, str] = {
    "params": "params", "grads": "grads", "optimizer": "optimizer",
    "activations": "activations", "recompute_working": "recompute", "buffers": "buffers",
    "cuda_context": "CUDA", "nccl": "NCCL", "fragmentation": "frag.",
    "reserved": "reserved",
}


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

    @property
    def total(self) -> float:
        """The sum of the :data:`MEMORY_ROWS` terms (capacity and headroom excluded)."""
        return sum(getattr(self, name) for name in MEMORY_ROWS)

    @property
    def free(self) -> float:
        """``capacity − total``: what the plan leaves free (negative when it overflows)."""
        return self.capacity - self.total

    @property
    def fits(self) -> bool:
        """``total + headroom ≤ capacity``."""
        return self.total + self.headroom <= self.capacity

    @property
    def total_gib(self) -> float:
        return self.total / GIB

    def to_gib(self) -> dict[str, float]:
        """Every field, the total and what is left free in GiB (for reports and JSON)."""
        out = {f.name: getattr(self, f.name) / GIB for f in fields(self)}
        out["total"] = self.total_gib
        out["free"] = self.free / GIB
        return out
