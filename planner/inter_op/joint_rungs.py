"""Step 4 of the inter-op search (:mod:`fxplan.inter_op.driver`): a ZeRO stage and an offload
per pipeline rank chosen with the candidate's stage split.

The rungs a rank may take are the family's, the offload ones included in every pass where
offload can be priced, less those the runtime cannot run beside the candidate's schedule
(:meth:`JointRungs._runnable`, :meth:`JointRungs._mixable`). Where the exact joint split applies
(:mod:`fxplan.inter_op.joint_split`: one chunk per rank, identical layers,
one recompute policy on every layer) it chooses the split and every rank's rung together,
exactly for ``T̂``; elsewhere the per-rank choice (:mod:`fxplan.inter_op.stage_zero`, exact
for a split) runs on the union of the splits of the plan-wide rungs. A candidate that fits at
no plan-wide rung of the pass may still fit with a rung per rank (:meth:`JointRungs._mixed_only`).
Inside the ranking's loop the exact joint splits wait for its end (:class:`Deferred`,
:meth:`fxplan.inter_op.ranking.Ranking._run_deferred`): bounded by the ``K``-th best ``T̂`` of
the end, the lowest, their windows of layer counts are narrowest and most price nothing.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Sequence

from fxplan.core.config import ParallelConfig
from fxplan.core.zero_bubble_dp import after_step_refusal, reduces_after_step
from fxplan.inter_op.joint_split import joint_split, splits_jointly
from fxplan.inter_op.offload import MemoryRungs, Rung
from fxplan.inter_op.partition import balanced_counts
from fxplan.inter_op.profile import ModelProfile, SegmentProfile
from fxplan.inter_op.scored import ROUND_OFF, Scored
from fxplan.inter_op.space import Family
from fxplan.inter_op.stage_devices import StageDevices
from fxplan.inter_op.stage_memory import DeviceMemory
from fxplan.inter_op.stage_zero import mix_rungs, runnable_rungs
from fxplan.inter_op.surrogate import split_bound

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster

__all__ = ["JOINT_RUNGS", "Deferred", "JointRungs"]

#: Whether step 4 chooses the split and the per-rank rungs together (:meth:`JointRungs._joint`:
#: the exact joint split where it applies, else the candidate's split at every rung a rank may
#: take gets the per-rank choice too, and the offload rungs are offered per rank in every
#: pass); off, each rank's rung is chosen for the split of the cheapest plan-wide rung only,
#: among the rungs of the pass (kept for comparison in ``tests/inter_op/test_joint_rungs.py``).
JOINT_RUNGS = True


@dataclass
class Deferred:
    """An exact joint split left for after the ranking's loop (:meth:`fxplan.inter_op.ranking.
    Ranking.rank`, where the ``K``-th best ``T̂`` is lowest and bounds it tightest): the
    candidate as placed, the rungs its ranks may take, its score so far and its place in the
    visiting order (set by the loop)."""

    placed: ParallelConfig
    runs: tuple[Rung, ...]
    #: ``None``: a candidate that fits at no plan-wide rung (:meth:`JointRungs._mixed_only`)
    scored: Scored | None
    key: tuple[float, int] = (0.0, 0)
    #: records the candidate as fitting nowhere when its exact split finds nothing
    unfit: Callable[[], None] | None = None


class JointRungs:
    """The per-rank rungs of step 4, as methods of the search's state
    (:class:`fxplan.inter_op.search_state._Search`), whose attributes they read."""

    cluster: Cluster
    rungs: MemoryRungs
    profile: ModelProfile
    fitted: set[Family]
    per_stage: bool
    zero_per_rank: bool
    offload_per_rank: bool
    _estimates: dict[ParallelConfig, float]
    #: exact joint splits left for after the ranking's loop; ``None``: run them at once
    _deferred: list[Deferred] | None
    _profiles: Callable[[ParallelConfig], tuple[SegmentProfile, list[SegmentProfile] | None,
                                                StageDevices]]
    _memory: Callable[[StageDevices], DeviceMemory | tuple[DeviceMemory, ...]]
    _placements: Callable[[ParallelConfig], list[ParallelConfig]]

    @staticmethod
    def _runnable(c: ParallelConfig, rungs: list[Rung]) -> list[Rung]:
        """``rungs`` without those a zero-bubble pipeline beside dp cannot run at (FSDP2:
        :func:`fxplan.core.zero_bubble_dp.after_step_refusal`, asked here only); all of them
        otherwise."""
        if not reduces_after_step(c):
            return rungs
        return [(z, off) for z, off in rungs
                if after_step_refusal(c.replace(zero_stage=z, offload=off)) is None]

    def _mixable(self, c: ParallelConfig) -> list[Rung]:
        """The rungs a pipeline rank of ``c`` may take (:mod:`fxplan.inter_op.stage_zero`):
        the family's rungs, the offload ones included wherever offload can be priced and the
        constraints allow it (:meth:`~fxplan.inter_op.offload.MemoryRungs.per_rank`), that the
        runtime runs beside ``c``'s schedule; a ZeRO stage or an offload the constraints name
        stays ``c``'s on every rank."""
        ladder = self.rungs.per_rank(c.dp) if JOINT_RUNGS else self.rungs.of(c.dp)
        return [(z, off) for z, off in self._runnable(c, ladder)
                if (self.zero_per_rank or z == c.zero_stage)
                and (self.offload_per_rank or off == c.offload)]

    def _joint(self, c: ParallelConfig, best: Scored,
               tried: Mapping[Rung, ParallelConfig | None], kth: float = math.inf) -> Scored:
        """``best`` with a rung per pipeline rank (:mod:`fxplan.inter_op.stage_zero`, exact
        for a split): chosen for ``best``'s split and, with :data:`JOINT_RUNGS`, with the split
        — by the exact joint split where it applies to ``best`` (:mod:`fxplan.inter_op.
        joint_split`, below ``kth`` and the choice on ``best``'s split), else, and where ``c``
        may recompute only some layers of each stage, also on the split of ``c`` at every
        other rung a rank may take (``tried``: the splits of the plan-wide rungs already
        placed; a split that fits only where some rank takes a high ZeRO stage or offloads:
        :mod:`~fxplan.inter_op.stage_zero`, "With the split"); the cheapest by ``T̂`` is kept
        (ties → ``best``'s, then the lower rung's split). A split whose bound
        :func:`~fxplan.inter_op.surrogate.split_bound` exceeds ``kth`` (the ``K``-th best
        ``T̂`` so far) is not mixed: nothing on it enters the ``K`` best."""
        rungs = self._mixable(best.config)
        if c.pp == 1 or c.dp == 1 or len(rungs) < 2:   # nothing to choose per rank
            return best
        splits: Iterator[ParallelConfig] = iter([best.config])
        # the exact joint split where it applies (joint_split.py, "Scope"); the union of the
        # plan-wide rungs' splits where it does not, or where they may recompute only some
        # layers (per-stage recompute: splits the exact one, at one policy, does not hold)
        own, owns, own_devs = self._profiles(best.config)
        exact = JOINT_RUNGS and splits_jointly(best.config, own, owns)
        if JOINT_RUNGS and not (exact and (c.recompute == "none" or not self.per_stage)):
            splits = itertools.chain(splits, *(
                ([tried[r]] if tried[r] is not None else []) if r in tried else
                self._placements(c.replace(zero_stage=r[0], offload=r[1]))
                for r in self._split_rungs(c, rungs)))
        out, seen = best, set()
        for placed in splits:
            key = (placed.stage_layers, placed.recompute_layers)
            if key in seen:
                continue
            seen.add(key)
            # every rank at the split's own rung is one of the choices: no need to price it
            prof, profs, devs = self._profiles(placed)
            if split_bound(placed, prof, profs) > kth * (1.0 + ROUND_OFF):
                continue
            mixed = mix_rungs(placed, rungs, prof, profs, self._memory(devs), self.cluster,
                              out.surrogate_s)
            if mixed is not None:
                self._estimates[mixed[0]] = mixed[1]
                out = Scored(*mixed)
        if exact:
            runs = tuple(dict.fromkeys(runnable_rungs(best.config, rungs)))
            if self._deferred is not None:   # run after the ranking's loop (ranking.py)
                self._deferred.append(Deferred(best.config, runs, out))
            else:
                out = self._exact(best.config, runs,
                                  min(out.surrogate_s, kth * (1.0 + ROUND_OFF))) or out
        return out

    def _exact(self, placed: ParallelConfig, runs: Sequence[Rung],
               incumbent_s: float) -> Scored | None:
        """The exact joint split of ``placed`` over the rungs ``runs``
        (:func:`~fxplan.inter_op.joint_split.joint_split`) when its ``T̂`` is below
        ``incumbent_s``; ``None`` otherwise."""
        prof, profs, devs = self._profiles(placed)
        found = joint_split(placed, runs, prof, profs, self._memory(devs), self.cluster,
                            incumbent_s)
        if found is None:
            return None
        self._estimates[found[0]] = found[1]
        return Scored(*found)

    def _mixed_only(self, c: ParallelConfig, kth: float,
                    unfit: Callable[[], None]) -> Scored | None:
        """A candidate that fits at no plan-wide rung of the pass may fit with a rung per
        pipeline rank (one rank offloading, say): the exact joint split
        (:func:`~fxplan.inter_op.joint_split.joint_split`, where it applies) from the even
        split, below ``kth``, left for after the ranking's loop while it runs (a
        :class:`Deferred` without a score); ``None`` otherwise, and then ``unfit()`` records
        the candidate as fitting nowhere (at once, or when the deferred split finds nothing)."""
        rungs = self._mixable(c)
        if not JOINT_RUNGS or c.pp == 1 or c.dp == 1 or c.virtual_stages != 1 \
                or len(rungs) < 2 or self.profile.num_layers < c.pp \
                or (c.recompute != "none" and self.per_stage):
            unfit()
            return None
        placed = c.replace(stage_layers=balanced_counts(self.profile.num_layers, c.pp))
        prof, profs, _ = self._profiles(placed)
        if not splits_jointly(placed, prof, profs):
            unfit()
            return None
        runs = tuple(dict.fromkeys(runnable_rungs(placed, rungs)))
        if self._deferred is not None:
            self._deferred.append(Deferred(placed, runs, None, unfit=unfit))
            return None
        found = self._exact(placed, runs, kth * (1.0 + ROUND_OFF))
        if found is None:
            unfit()
            return None
        self.fitted.add(Family.of(c))
        return found

    def _split_rungs(self, c: ParallelConfig, rungs: list[Rung]) -> list[Rung]:
        """The rungs of ``rungs`` at which :meth:`_joint` places ``c`` on every rank: none
        below ``c``'s own (the first the memory bound of step 2 passes: below it no split fits
        every rank), and of the offload rungs only ZeRO-3's, those of least device memory
        (placing at each offload rung costs a partition each; measured on GPT-1T the lower
        ZeRO stages' offload splits rarely won)."""
        ladder = self.rungs.per_rank(c.dp)
        above = set(ladder[ladder.index((c.zero_stage, c.offload)):])
        return [(z, off) for z, off in rungs if (z, off) in above and (off == "none" or z == 3)]
