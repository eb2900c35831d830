"""A configuration's stages as the step prices them: the ranks of each stage's first replica
(:func:`stage_ranks`) and everything the simulator and the memory model read
(:class:`StagePlan`, built by :func:`cost_model.step.stage_costs.build_stages`).

The mesh is ``pp × dp × tp`` in row-major order (:class:`cost_model.comm.mesh.LogicalMesh`
with axes ``("pp", "dp", "tp")``): rank ``= i_pp·dp·tp + i_dp·tp + i_tp``, so tp takes
consecutive ranks (inside a node where it fits), dp strides by ``tp`` and pipeline stages by
``dp·tp``. Stage ``s`` is priced on its first data-parallel replica.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fxplan.core.config import ParallelConfig
from fxplan.cost_model.step.layer_costs import SegmentCost
from fxplan.cost_model.step.simulator import StageCosts

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import DeviceGroup

__all__ = ["StagePlan", "stage_ranks"]


def stage_ranks(config: ParallelConfig, stage: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(tp group, dp group)`` of the first replica of ``stage`` (module docstring)."""
    first = stage * config.dp * config.tp
    return (tuple(range(first, first + config.tp)),
            tuple(first + j * config.tp for j in range(config.dp)))


@dataclass(frozen=True, eq=False)
class StagePlan:
    """Everything the simulator and the memory model need for one configuration."""

    costs: StageCosts
    chunks: tuple[tuple[tuple[SegmentCost, ...], ...], ...]   # [s][c] → segments in order
    params: tuple[dict[str, float], ...]                       # [s] canonical name → local numel
    devices: tuple[DeviceGroup, ...]
    expert_params: tuple[float, ...] = ()                      # [s] local expert numel (ep > 1)
