"""FP8 matrix products: which nodes run in FP8, their time, and the memory FP8 adds.

The recipe priced is the one the runtime runs, torchao's float8 training with dynamic
per-tensor scales (``convert_to_float8_training``, :mod:`fxplan.runtime.apply.fp8`); its assumptions:

* **What runs in FP8**: the linear layers, i.e. matrix products that own a weight
  (``op_class == "matmul"`` with parameters); attention cores, embeddings, norms and the
  optimizer stay in the training dtype.
* **Time** of a converted linear: the roofline of :mod:`cost_model.compute.op_time` against the
  device's ``fp8`` peak (``peak_tflops.fp8``), the matmul efficiency curve scaled by
  :data:`FP8_GEMM_EFFICIENCY` (assumption: FP8 GEMMs reach a smaller fraction of their peak
  than 16-bit ones), plus the casts, memory-bound at the device's bandwidth: each operand is
  read for its absolute maximum (2 B per element), read again and written in FP8 (2 + 1 B),
  i.e. :data:`CAST_BYTES` = 5 B per element of the input ``X`` and weight ``W`` in the forward,
  and of ``X``, ``W`` and the output gradient ``dY`` in the backward (torchao saves ``X`` and
  ``W`` in high precision and casts them again there)::

      t_fwd = gemm_fp8(F, B) / r + cast(5·(|X| + |W|))
      t_bwd = 2 · gemm_fp8(F, B) / r + cast(5·(|X| + |W| + |dY|))        r = FP8_GEMM_EFFICIENCY

  with ``|X| + |W| = bytes_read / 2`` and ``|dY| = bytes_written / 2`` (16-bit elements).
* **Memory**: master weights, gradients and optimizer states keep their dtypes (fp32 master
  and moments, 16-bit weights and gradients: :mod:`cost_model.memory.breakdown` unchanged), and the saved
  activations stay in 16 bits (torchao saves the high-precision ``X`` and ``W``; Transformer
  Engine's recipe, which saves ``X`` in FP8, is not priced). What FP8 adds is transient: the
  1-byte copies of one linear's ``X``, ``W`` and ``dY`` at a time, counted in the segment's
  working bytes.

MFU stays the model FLOPs against the 16-bit peak (the plan's dtype), so an FP8 plan's MFU may
exceed what its 16-bit twin could reach; the step time is what compares them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fxplan.core.config_error import CostModelError
from fxplan.cost_model.compute.op_time import node_time_s, op_time_s

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster

__all__ = ["CAST_BYTES", "FP8_GEMM_EFFICIENCY", "check_fp8", "converted", "fp8_node_time_s",
           "fp8_working_bytes"]

#: FP8 GEMM efficiency relative to the device's matmul efficiency. Assumption: not measured
#: here (no FP8 device); cuBLAS FP8 GEMMs on H100 are commonly quoted near 2/3 of the FP8 peak,
#: against ~3/4 for 16-bit GEMMs of the bf16 peak (the cluster specs' matmul efficiency).
FP8_GEMM_EFFICIENCY = 0.9

#: Bytes moved per operand element to cast it: amax read (2), read and write in FP8 (2 + 1).
CAST_BYTES = 5.0

_FP8 = "float8_e4m3fn"


def converted(info: Any) -> bool:
    """Whether the node is a linear layer's matrix product (runs in FP8 under ``fp8``)."""
    return info.op_class == "matmul" and bool(info.params)


def fp8_node_time_s(info: Any, device: Any, *, shard_factor: float, backward: bool) -> float:
    """Seconds of a converted node's forward or backward on one rank's share (module
    docstring)."""
    gemm = node_time_s(info, device, shard_factor=shard_factor, dtype=_FP8,
                       backward=backward) / FP8_GEMM_EFFICIENCY
    read, written = float(info.bytes_read or 0), float(info.bytes_written or 0)
    elements = (read + (written if backward else 0.0)) / 2.0 / shard_factor
    cast = op_time_s("elementwise", 0.0, CAST_BYTES * elements, _FP8, device)
    return gemm + cast


def fp8_working_bytes(info: Any, shard_factor: float) -> float:
    """The 1-byte copies of ``X``, ``W`` and ``dY`` of one converted node on one rank."""
    return (float(info.bytes_read or 0) + float(info.bytes_written or 0)) / 2.0 / shard_factor


def check_fp8(cluster: Cluster) -> None:
    """:class:`CostModelError` unless every device group lists an ``fp8`` peak."""
    for group in cluster.device_groups:
        if "fp8" not in group.peak_tflops:
            raise CostModelError(
                f"fp8 needs FP8 tensor cores: {group.model} lists no fp8 peak (it lists "
                f"{', '.join(group.peak_tflops)}); FP8 training runs on H100/H200-class devices")
