"""The stage split a candidate runs with: the partition DP's answer, checked rank by rank.

For a candidate ``c`` at a memory rung the layers go to its ``pp·v`` stages by the min–max DP
of :mod:`fxplan.inter_op.partition`, fed by :func:`fxplan.inter_op.stage_memory.
partition_inputs` (one time row per virtual stage ``j``, priced on pipeline rank
``j mod pp``'s device group on a heterogeneous cluster). The DP's memory rows are
conservative (the :mod:`~fxplan.inter_op.stage_memory` docstring), so the split is kept only
when every pipeline rank fits by the estimate's own formula, ``M_s + H_s ≤ C_s``
(:func:`~fxplan.inter_op.stage_memory.stage_totals` against
:func:`~fxplan.inter_op.stage_devices.rank_limits`), and the host holds what is offloaded
(:func:`~fxplan.inter_op.offload.host_fits`); the most even split is the second chance when
the DP found none or its split fails the check. No split passing: the candidate does not fit
at that rung.

:class:`StageSplits` keeps the DP's answer per key: the profile's dimensions (tp, sp,
recompute, microbatch, fp8, ep, cp), the mesh (pp, v, dp) and the DP's capacities, extra
times, fixed bytes, in-flight counts and first layer's state bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fxplan.core.config import ParallelConfig
from fxplan.inter_op.offload import host_fits
from fxplan.inter_op.partition import Partition, balanced_counts, partition_layers
from fxplan.inter_op.profile import SegmentProfile
from fxplan.inter_op.stage_devices import rank_limits
from fxplan.inter_op.stage_memory import DeviceMemory, partition_inputs, stage_totals

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster

__all__ = ["StageSplits"]


class StageSplits:
    """The split that fits of each candidate (module docstring), the DP memoized per input."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._dp: dict[tuple, Partition | None] = {}

    def fit(self, c: ParallelConfig, prof: SegmentProfile, profs: list[SegmentProfile] | None,
            mems: DeviceMemory | tuple[DeviceMemory, ...],
            host: DeviceMemory) -> ParallelConfig | None:
        """``c`` with the stage split that fits, or ``None``. ``prof``, ``profs``: ``c``'s
        profiles (:func:`fxplan.inter_op.stage_devices.rank_profiles`; ``profs`` one per
        pipeline rank, ``None`` on one kind of device); ``mems``: one kind of device's memory,
        or one per pipeline rank; ``host``: the memory :func:`host_fits` checks against."""
        if profs is None:
            inputs = partition_inputs(c, prof, mems)
            time = prof.layer_time
        else:   # each virtual stage j priced on its pipeline rank's group (stage_devices)
            inputs = partition_inputs(c, prof, mems, ends=(profs[0], profs[-1]))
            time = np.stack([profs[c.schedule.placement(j, c.pp)[0]].layer_time
                             for j in range(c.pp * c.virtual_stages)])
        key = (c.tp, c.sequence_parallel, c.recompute, c.microbatch_size, c.fp8, c.ep, c.cp,
               c.pp, c.virtual_stages, c.dp, inputs.cap.tobytes(), inputs.extra_time.tobytes(),
               inputs.fixed_bytes.tobytes(), inputs.inflight.tobytes(),
               inputs.layer_state[:1].tobytes())
        if key not in self._dp:
            self._dp[key] = partition_layers(time, inputs.layer_state, inputs.layer_acts,
                                             inputs.extra_time, inputs.fixed_bytes,
                                             inputs.inflight, inputs.cap)
        part = self._dp[key]
        tries = ([part.counts] if part is not None else []) + \
            [balanced_counts(prof.layers, c.pp * c.virtual_stages)]
        caps = rank_limits(mems)
        for counts in tries:
            placed = c.replace(stage_layers=counts)
            if (stage_totals(placed, prof, mems) <= caps).all() and \
                    host_fits(placed, prof, host, self.cluster):
                return placed
        return None
