"""The training precision a cluster's devices support: one rule for the search, the CLI and
the cost model.

Per device group ``g`` and a graph captured in precision ``k`` (a ``peak_tflops`` key):

    group_precision(g, k) = k                 if g lists a peak for k
                          = the other 16-bit  if k ∈ {bf16, fp16} and g lists it (a V100 trains
                                              a bf16 model in fp16: same bytes, its own peak)
                          = None              otherwise (g cannot train k)

The cluster's precision (what a model is captured in) is the first of ``bf16, fp16, fp32``
that at least one group lists and every group can train (``group_precision`` not ``None``):
bf16 on A100/H100, fp16 on V100, fp32 on a CPU, and on ``hetero-v100-a100`` bf16 — the A100s
train in bf16, the V100s in fp16. Keys are those of ``peak_tflops`` (``bf16``);
:data:`TORCH_NAMES` maps them to torch dtype names (``bfloat16``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fxplan.cluster_specs.errors import ClusterSpecError

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs.cluster import Cluster
    from fxplan.cluster_specs.devices import DeviceGroup

__all__ = ["TORCH_NAMES", "check_precision", "group_precision", "group_precisions",
           "training_dtype", "training_precision"]

#: Training precisions by preference, as ``peak_tflops`` keys → torch dtype names.
TORCH_NAMES: dict[str, str] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

#: The 16-bit floating-point precision a group without ``key`` trains a ``key`` model in.
_SIXTEEN_BIT_TWIN: dict[str, str] = {"bf16": "fp16", "fp16": "bf16"}


def group_precision(group: DeviceGroup, key: str) -> str | None:
    """The precision ``group`` trains a model captured in ``key`` in (module docstring):
    ``key`` itself, its 16-bit twin, or ``None`` when the group can train neither."""
    peaks = group.peak_tflops
    if key in peaks:
        return key
    twin = _SIXTEEN_BIT_TWIN.get(key)
    return twin if twin in peaks else None


def group_precisions(cluster: Cluster, key: str) -> dict[str, str | None]:
    """``{group name: group_precision(group, key)}`` for every device group of ``cluster``."""
    return {group.name: group_precision(group, key) for group in cluster.device_groups}


def _trainable(cluster: Cluster, key: str) -> bool:
    """Some group lists ``key`` and every group can train it (module docstring)."""
    groups = cluster.device_groups
    return (any(key in g.peak_tflops for g in groups)
            and all(group_precision(g, key) is not None for g in groups))


def training_precision(cluster: Cluster) -> str:
    """``bf16``, ``fp16`` or ``fp32``: the first of them some group lists and every group can
    train (module docstring); ``fp32`` when none qualifies."""
    return next((key for key in TORCH_NAMES if _trainable(cluster, key)), "fp32")


def training_dtype(cluster: Cluster) -> str:
    """:func:`training_precision` as a torch dtype name (``bfloat16``, ``float16``,
    ``float32``)."""
    return TORCH_NAMES[training_precision(cluster)]


def check_precision(cluster: Cluster, key: str) -> None:
    """Raise :class:`ClusterSpecError` (a ``UserError``) unless some device group lists a peak
    for the precision ``key`` (``bf16``, ``fp16``, ``fp32``) and every group can train it
    (:func:`group_precision`), naming the dtypes the groups list."""
    if _trainable(cluster, key):
        return
    lacking = [g for g in cluster.device_groups if key not in g.peak_tflops]
    models = ", ".join(dict.fromkeys(g.model for g in lacking))
    listed = ", ".join(dict.fromkeys(k for g in lacking for k in g.peak_tflops
                                     if k in TORCH_NAMES)) or "none of " + ", ".join(TORCH_NAMES)
    raise ClusterSpecError(
        cluster.name, message=f"the devices ({models}) have no {key} peak, so the "
        f"cost model cannot price {key} training on them; their dtypes are {listed} "
        f"(default: {training_precision(cluster)})")
