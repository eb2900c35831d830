"""The training precision a cluster's devices support: one rule for the search, the CLI and
the cost model.

    bf16 where the device lists a bf16 peak, else fp16 where it lists fp16 (V100),
    else fp32 (a CPU)

read off the first rank's device (:meth:`Cluster.device`), the precision mixed-precision
training would use there. Keys are those of ``peak_tflops`` (``bf16``); :data:`TORCH_NAMES`
maps them to torch dtype names (``bfloat16``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fxplan.cluster_specs.errors import ClusterSpecError

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs.cluster import Cluster

__all__ = ["TORCH_NAMES", "check_precision", "training_dtype", "training_precision"]

#: Training precisions by preference, as ``peak_tflops`` keys → torch dtype names.
TORCH_NAMES: dict[str, str] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def training_precision(cluster: Cluster) -> str:
    """``bf16``, ``fp16`` or ``fp32``: the first of them the device has a peak for (module
    docstring); ``fp32`` when it lists none of them."""
    peaks = cluster.device(0).peak_tflops
    return next((key for key in TORCH_NAMES if key in peaks), "fp32")


def training_dtype(cluster: Cluster) -> str:
    """:func:`training_precision` as a torch dtype name (``bfloat16``, ``float16``,
    ``float32``)."""
    return TORCH_NAMES[training_precision(cluster)]


def check_precision(cluster: Cluster, key: str) -> None:
    """Raise :class:`ClusterSpecError` (a ``UserError``) when ``cluster``'s devices list no
    peak for the precision ``key`` (``bf16``, ``fp16``, ``fp32``), naming the ones they list."""
    device = cluster.device(0)
    if key not in device.peak_tflops:
        listed = ", ".join(k for k in device.peak_tflops if k in TORCH_NAMES) or "none of " + \
            ", ".join(TORCH_NAMES)
        raise ClusterSpecError(
            cluster.name, message=f"the devices ({device.model}) have no {key} peak, so the "
            f"cost model cannot price {key} training on them; their dtypes are {listed} "
            f"(default: {training_precision(cluster)})")
