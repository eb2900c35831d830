"""Which device group each pipeline rank runs on: heterogeneous clusters in the search.

The mesh is ``pp × dp × tp`` row-major over the cluster's ranks
(:mod:`cost_model.step.stage_costs`), so pipeline rank ``s`` holds ranks
``[s·dp·tp, (s+1)·dp·tp)``. Device groups are contiguous rank ranges
(:mod:`cluster_specs.devices`), so the stage lies in one group exactly when its first and last
ranks do; on a cluster of several groups a family whose stages straddle a group boundary is
pruned (each stage on one device group: a stage that spans a V100 and an A100 node would run
at the V100's pace with the V100's memory, and the cost model prices a stage on one device).
Likewise a family whose tensor-parallel groups would cross a domain of a domain-scope level
(a GB200 NVL72 rack; :func:`cost_model.comm.mesh.domain_straddle`) is pruned: tensor parallelism
stays inside the NVLink domain, data and pipeline parallelism go across.

Per pipeline rank ``s`` the search then uses the group's own numbers:

* time: the segment profile priced on that group's device (:class:`fxplan.inter_op.profile.
  ModelProfile` keyed by group), so layer ``i`` costs ``t_{s,i}`` on stage ``s``;
* memory: the group's capacity ``C_s`` and reserve ``r_s`` (:class:`DeviceMemory`).

The stage partition (:mod:`fxplan.inter_op.partition`) then minimises
``max_j (e_j + Σ_{i ∈ j} t_{s_j,i})`` under ``M_j ≤ C_{s_j}``: a slow or small group gets
fewer layers. The family's memory bound (:mod:`fxplan.inter_op.bounds`) becomes
``k_z·Ψ/pp ≤ mean_s (C_s − r_s)`` (the states must fit in the pipeline's total free memory),
which is ``k_z·Ψ/pp + r ≤ C`` on one kind of device.

The search looks the groups up once per ``(pp, dp·tp)`` (:class:`StageDeviceTable`), prices a
candidate with one profile per pipeline rank only where the ranks differ
(:func:`rank_profiles`), and compares each rank's total with its own limit ``C_s − r_s − H_s``
(:func:`rank_limits`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fxplan.core.config import ParallelConfig
from fxplan.cost_model.memory.headroom import DEFAULT_HEADROOM, MemoryHeadroom
from fxplan.cost_model.comm.mesh import domain_straddle
from fxplan.inter_op.profile import ModelProfile, SegmentProfile
from fxplan.inter_op.reasons import DIVIDE, Reason
from fxplan.inter_op.space import Family
from fxplan.inter_op.stage_memory import DeviceMemory

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster, DeviceGroup

__all__ = ["StageDeviceTable", "StageDevices", "rank_limits", "rank_profiles", "stage_devices",
           "straddle_reason", "straddled_stage"]


@dataclass(frozen=True)
class StageDevices:
    """The device group of each pipeline rank, and its memory."""

    groups: tuple[DeviceGroup, ...]
    headroom: MemoryHeadroom = DEFAULT_HEADROOM

    @property
    def uniform(self) -> bool:
        """All pipeline ranks on one device group (every homogeneous cluster)."""
        return len({g.name for g in self.groups}) == 1

    @property
    def memory(self) -> tuple[DeviceMemory, ...]:
        return tuple(DeviceMemory.of(g, self.headroom) for g in self.groups)

    def mean_memory(self) -> DeviceMemory:
        """``(mean_s C_s, mean_s r_s, mean_s H_s)``: the bound's capacity (module docstring)."""
        mems = self.memory
        return DeviceMemory(sum(m.capacity for m in mems) / len(mems),
                            sum(m.reserved for m in mems) / len(mems),
                            sum(m.headroom for m in mems) / len(mems), mems[0].kind)


def straddled_stage(cluster: Cluster, pp: int, per_stage: int) -> tuple[int, str, str] | None:
    """The first pipeline rank whose ``per_stage = dp·tp`` ranks span two device groups, with
    the names of the groups of its first and last rank; ``None`` when every stage lies in one."""
    for s in range(pp):
        first, last = cluster.device(s * per_stage), cluster.device((s + 1) * per_stage - 1)
        if first.name != last.name:
            return s, first.name, last.name
    return None


def straddle_reason(cluster: Cluster, family: Family) -> Reason | None:
    """Why ``family`` is pruned on ``cluster`` when one of its pipeline stages spans two device
    groups (:func:`straddled_stage`), or when one of its tensor-parallel groups crosses a
    domain (module docstring); ``None`` when neither happens."""
    crossed = domain_straddle(cluster, family.tp)
    if crossed is not None:
        level, block = crossed
        size = level.domain_nodes * cluster.devices_per_node()
        return Reason(f"{family}: tensor-parallel group {block} (ranks {block * family.tp}–"
                      f"{(block + 1) * family.tp - 1}) crosses a {level.name} domain of "
                      f"{level.domain_nodes} nodes ({size} devices); tensor parallelism stays "
                      "inside a domain", DIVIDE)
    per_stage = family.dp * family.tp
    straddled = (straddled_stage(cluster, family.pp, per_stage)
                 if len(cluster.device_groups) > 1 else None)
    if straddled is None:
        return None
    s, a, b = straddled
    return Reason(f"{family}: pipeline stage {s} ({per_stage} ranks) spans device groups {a} "
                  f"and {b}; each stage runs on one device group", DIVIDE)


def stage_devices(cluster: Cluster, pp: int, per_stage: int,
                  headroom: MemoryHeadroom = DEFAULT_HEADROOM) -> StageDevices:
    """The group of each pipeline rank (its first rank's; :func:`straddled_stage` says whether
    that is the whole stage's)."""
    return StageDevices(tuple(cluster.device(s * per_stage) for s in range(pp)), headroom)


class StageDeviceTable:
    """:func:`stage_devices` of one cluster, computed once per ``(pp, per_stage)``."""

    def __init__(self, cluster: Cluster, headroom: MemoryHeadroom = DEFAULT_HEADROOM) -> None:
        self.cluster, self.headroom = cluster, headroom
        self._table: dict[tuple[int, int], StageDevices] = {}

    def of(self, pp: int, per_stage: int) -> StageDevices:
        key = (pp, per_stage)
        if key not in self._table:
            self._table[key] = stage_devices(self.cluster, pp, per_stage, self.headroom)
        return self._table[key]


def rank_profiles(profile: ModelProfile, c: ParallelConfig, devs: StageDevices
                  ) -> tuple[SegmentProfile, list[SegmentProfile] | None]:
    """``c``'s profile on rank 0's device, and one per pipeline rank where the ranks are on
    different device groups (``None`` on one kind of device)."""
    prof = profile.of(c)
    if devs.uniform:
        return prof, None
    return prof, [profile.of(c, g) for g in devs.groups]


def rank_limits(mems: DeviceMemory | tuple[DeviceMemory, ...]) -> float | np.ndarray:
    """The memory limit ``C − r − H`` of one kind of device, or one per pipeline rank."""
    return mems.limit if isinstance(mems, DeviceMemory) else np.array([m.limit for m in mems])
