"""The FLOPs of a step and the devices' peak that a run's TFLOP/s and MFU are measured against."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.core.plan import Plan
    from fxplan.runtime.train.metrics import FlopCounts

__all__ = ["flop_counts"]


def flop_counts(plan: Plan, cluster: Cluster) -> tuple[FlopCounts | None, str | None]:
    """FLOPs of a step from the plan's estimate and the devices' peak, or ``None`` and why.
    The peak is the mean of every device's own (:func:`fxplan.cost_model.step.estimate.peak_flops`,
    each group in its own precision), so the measured MFU is defined as the predicted one."""
    from fxplan.cluster_specs import group_precisions, training_precision
    from fxplan.cost_model.step.estimate import peak_flops
    from fxplan.runtime.train.metrics import FlopCounts

    model, hardware = plan.estimate.get("model_flops"), plan.estimate.get("hardware_flops")
    if model is None or hardware is None:
        return None, "the plan has no FLOP estimate (model_flops): TFLOP/s and MFU not computed"
    precisions = group_precisions(cluster, training_precision(cluster))
    peak = peak_flops(cluster, {k: str(v) for k, v in precisions.items()}) / cluster.num_devices
    return FlopCounts(float(model), float(hardware), peak, plan.world_size), None
