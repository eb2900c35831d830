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

**Recompute per stage** (:meth:`StageSplits.fit_recompute`): for a candidate whose policy
``ρ`` may run on only some layers, the split and each stage's count ``q_j`` of recomputed
layers come from :func:`~fxplan.inter_op.partition.partition_recompute` fed by the inputs of
both ``none`` and ``ρ``; the candidate becomes ``recompute_layers = (q_j)``, checked rank by
rank with each layer's own profile (:func:`~fxplan.inter_op.profile.mixed_profile`). The
DP minimises the slowest virtual stage, not the step, so the split without recompute (the
``none`` candidate's own, when it fits) is offered beside it and the search keeps the
cheaper by its closed form; when neither fits, the split with ``ρ`` on every layer is the
last chance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from fxplan.core.config import ParallelConfig
from fxplan.inter_op.offload import host_fits
from fxplan.inter_op.partition import (Partition, balanced_counts, partition_layers,
                                       partition_recompute)
from fxplan.inter_op.profile import SegmentProfile
from fxplan.inter_op.stage_devices import rank_limits
from fxplan.inter_op.stage_memory import (DeviceMemory, PartitionInputs, partition_inputs,
                                          stage_totals)

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster

__all__ = ["StageSplits"]


class StageSplits:
    """The split that fits of each candidate (module docstring), the DP memoized per input."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._dp: dict[tuple, Partition | None] = {}
        self._plain: dict[tuple, ParallelConfig | None] = {}   # fit() without recompute
        # _inputs per (candidate, its profiles, memory): fit_recompute reads those of the
        # candidate without recompute, then fit() the same for that candidate's own split
        self._inputs: dict[tuple, tuple[tuple, PartitionInputs, np.ndarray]] = {}

    def fit(self, c: ParallelConfig, prof: SegmentProfile, profs: list[SegmentProfile] | None,
            mems: DeviceMemory | tuple[DeviceMemory, ...],
            host: DeviceMemory) -> ParallelConfig | None:
        """``c`` with the stage split that fits, or ``None``. ``prof``, ``profs``: ``c``'s
        profiles (:func:`fxplan.inter_op.stage_devices.rank_profiles`; ``profs`` one per
        pipeline rank, ``None`` on one kind of device); ``mems``: one kind of device's memory,
        or one per pipeline rank; ``host``: the memory :func:`host_fits` checks against."""
        inputs, time = self._inputs_of(c, prof, profs, mems)
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
        for counts in tries:
            placed = c.replace(stage_layers=counts)
            if self._fits(placed, prof, mems, host):
                return placed
        return None

    def _inputs_of(self, c: ParallelConfig, prof: SegmentProfile,
                   profs: list[SegmentProfile] | None,
                   mems: DeviceMemory | tuple[DeviceMemory, ...]
                   ) -> tuple[PartitionInputs, np.ndarray]:
        """:func:`_inputs`, memoized per candidate, profiles (by identity; the entry keeps
        them alive, so an id names one profile) and memory."""
        key = (c, id(prof), None if profs is None else tuple(map(id, profs)), mems)
        hit = self._inputs.get(key)
        if hit is None:
            hit = self._inputs[key] = ((prof, profs), *_inputs(c, prof, profs, mems))
        return hit[1], hit[2]

    def _fits(self, placed: ParallelConfig, prof: SegmentProfile,
              mems: DeviceMemory | tuple[DeviceMemory, ...], host: DeviceMemory) -> bool:
        """Every pipeline rank of ``placed`` fits by the estimate's formula and the host holds
        what it offloads (module docstring)."""
        return bool((stage_totals(placed, prof, mems) <= rank_limits(mems)).all()) and \
            host_fits(placed, prof, host, self.cluster)

    def fit_recompute(self, c: ParallelConfig, prof: SegmentProfile,
                      profs: list[SegmentProfile] | None, none: SegmentProfile,
                      nones: list[SegmentProfile] | None,
                      mems: DeviceMemory | tuple[DeviceMemory, ...], host: DeviceMemory,
                      profile_of: Callable[[ParallelConfig], SegmentProfile],
                      base: ParallelConfig | None = None) -> list[ParallelConfig]:
        """The placed variants of ``c`` (policy ``ρ = c.recompute``) that fit (module
        docstring, "Recompute per stage"): the split with the recomputed layers of each stage
        and the split without recompute, or else the split with ``ρ`` on every layer; ``[]``
        when none fits. ``prof``, ``profs``: ``c``'s profiles; ``none``, ``nones``: those of
        ``c`` without recompute; ``profile_of``: the profile of a placed configuration (each
        layer's own policy); ``base``: ``c`` without recompute, where the caller made it."""
        base = base or c.replace(recompute="none")
        inputs_r, time_r = self._inputs_of(c, prof, profs, mems)
        inputs, time = self._inputs_of(base, none, nones, mems)
        key = ("recompute", c.tp, c.sequence_parallel, c.recompute, c.microbatch_size, c.fp8,
               c.ep, c.cp, c.pp, c.virtual_stages, c.dp, inputs.cap.tobytes(),
               inputs.extra_time.tobytes(), inputs.fixed_bytes.tobytes(),
               inputs_r.fixed_bytes.tobytes(), inputs.inflight.tobytes(),
               inputs.layer_state[:1].tobytes())
        if key not in self._dp:
            self._dp[key] = partition_recompute(
                time, time_r, inputs.layer_state, inputs.layer_acts, inputs_r.layer_acts,
                inputs.extra_time, inputs.fixed_bytes, inputs_r.fixed_bytes, inputs.inflight,
                inputs.cap)
        part = self._dp[key]
        out: list[ParallelConfig] = []
        if part is not None and part.recomputed is not None and any(part.recomputed):
            placed = c.replace(stage_layers=part.counts, recompute_layers=part.recomputed)
            if self._fits(placed, profile_of(placed), mems, host):
                out.append(placed)
        # the none candidate's own split (once for the two policies of a candidate)
        if (base, mems) not in self._plain:
            self._plain[(base, mems)] = self.fit(base, none, nones, mems, host)
        plain = self._plain[(base, mems)]
        out += [plain] if plain is not None else []
        if not out:
            whole = self.fit(c, prof, profs, mems, host)
            out += [whole] if whole is not None else []
        return out


def _inputs(c: ParallelConfig, prof: SegmentProfile, profs: list[SegmentProfile] | None,
            mems: DeviceMemory | tuple[DeviceMemory, ...]) -> tuple[PartitionInputs, np.ndarray]:
    """The partition's inputs of ``c`` (:func:`~fxplan.inter_op.stage_memory.partition_inputs`)
    and its layer times: one row, or one per virtual stage on its pipeline rank's group."""
    if profs is None:
        return partition_inputs(c, prof, mems), prof.layer_time
    # each virtual stage j priced on its pipeline rank's group (stage_devices)
    return (partition_inputs(c, prof, mems, ends=(profs[0], profs[-1])),
            np.stack([profs[c.schedule.placement(j, c.pp)[0]].layer_time
                      for j in range(c.pp * c.virtual_stages)]))
