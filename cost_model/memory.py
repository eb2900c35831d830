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
prefetched). **Reserved**: ``DeviceGroup.reserved_memory_gib`` (CUDA context, NCCL,
allocator slack). A stage fits when the sum is at most ``memory_gib``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["ADAM_FP32", "ADAM_MIXED", "GIB", "adam_for", "MemoryBreakdown", "ModelStates", "OptimizerSpec",
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
#: Adam training in fp32 (no master copy): 4-byte weights and gradients, 8 bytes of moments;
#: a step reads weight, gradient and both moments (16) and writes weight and moments (12).
ADAM_FP32 = OptimizerSpec("adam-fp32", param_bytes=4.0, grad_bytes=4.0, state_bytes=8.0,
                          step_bytes=28.0)


def adam_for(dtype_key: str) -> OptimizerSpec:
    """The Adam spec of a training precision: :data:`ADAM_FP32` for ``fp32``, else
    :data:`ADAM_MIXED` (16-bit weights and gradients with fp32 master weights)."""
    return ADAM_FP32 if dtype_key == "fp32" else ADAM_MIXED


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


@dataclass(frozen=True)
class MemoryBreakdown:
    """Peak bytes on one rank of a stage, by kind, and the device's capacity."""

    params: float
    grads: float
    optimizer: float
    activations: float
    recompute_working: float
    buffers: float
    reserved: float
    capacity: float

    @property
    def total(self) -> float:
        """Everything but the capacity."""
        return sum(getattr(self, f.name) for f in fields(self) if f.name != "capacity")

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    @property
    def total_gib(self) -> float:
        return self.total / GIB

    def to_gib(self) -> dict[str, float]:
        """Every field and the total in GiB (for reports and JSON)."""
        out = {f.name: getattr(self, f.name) / GIB for f in fields(self)}
        out["total"] = self.total_gib
        return out
