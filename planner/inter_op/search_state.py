"""The state of one inter-op search and its steps 1–2, 4 (placing and scoring a candidate) and
5–6 (:mod:`fxplan.inter_op.driver` tells the problem and the steps): the families and their
first memory rung, each candidate's stage split and ``T̂``, the finalists priced, and why
nothing fits when nothing does. Ranking (steps 3–4) is :class:`~fxplan.inter_op.ranking.
Ranking`'s; the rungs per pipeline rank, :class:`~fxplan.inter_op.joint_rungs.JointRungs`'.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from fxplan.core.config import ParallelConfig
from fxplan.cost_model.memory.breakdown import MemoryBreakdown
from fxplan.cost_model.memory.headroom import DEFAULT_HEADROOM, MemoryHeadroom
from fxplan.cost_model.parallel.expert_parallel import num_experts
from fxplan.cost_model.step.estimate import training_adam
from fxplan.inter_op.bounds import memory_lower_bound, memory_reason
from fxplan.inter_op.context_bound import (Dropped, context_reasons, offered_cps, plain_config,
                                            possible_cps, short_reason)
from fxplan.inter_op.constraints import (allowed, check_cp_constraint, check_ep_constraint,
                                          describe, ep_degrees, only, validate_constraints)
from fxplan.inter_op.infeasible import InfeasibleError, infeasible_message, no_plan_error
from fxplan.inter_op.joint_rungs import Deferred, JointRungs
from fxplan.inter_op.lightest import evenly_at, lightest_allowed, lightest_at
from fxplan.inter_op.offload import MemoryRungs, Rung, fp8_choices
from fxplan.inter_op.placements import IntraOpCache
from fxplan.inter_op.pricing import Priced, price_finalists
from fxplan.inter_op.profile import ModelProfile, SegmentProfile
from fxplan.inter_op.progress import Budget, PhaseTimer
from fxplan.inter_op.ranking import Ranking
from fxplan.inter_op.reasons import Reason
from fxplan.inter_op.scored import Scored
from fxplan.inter_op.space import Family, families, options
from fxplan.inter_op.stage_devices import (StageDevices, StageDeviceTable, rank_limits,
                                           rank_profiles, straddle_reason)
from fxplan.inter_op.stage_memory import DeviceMemory, stage_memory, stage_totals
from fxplan.inter_op.stage_split import StageSplits
from fxplan.inter_op.surrogate import surrogate_step_s
from fxplan.inter_op.unfit import Unfit, overflow, record_unfit, unfit_reasons

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["_Search"]

log = logging.getLogger("fxplan.planner")


class _Search(Ranking, JointRungs):
    """State of one search (see the module docstring for the steps)."""

    def __init__(self, graph: CapturedGraph, cluster: Cluster, batch: int,
                 constraints: Mapping[str, Any], finalists: int, timer: PhaseTimer,
                 budget: Budget, progress: bool,
                 headroom: MemoryHeadroom = DEFAULT_HEADROOM,
                 state_layout: str = "runtime") -> None:
        self.graph, self.cluster, self.batch = graph, cluster, batch
        self.headroom = headroom
        self.state_layout = state_layout
        self.constraints = validate_constraints(constraints, cluster.num_devices)
        self.K = finalists
        self.timer, self.budget, self.progress = timer, budget, progress
        self.profile = ModelProfile(graph, cluster, training_adam(graph, state_layout))
        self.experts = num_experts(graph)   # E of a mixture of experts (ep is searched), or None
        check_ep_constraint(self.constraints, self.experts)
        self.seq = self.profile.segments.seq
        check_cp_constraint(self.constraints, self.seq)
        self.cps_of: dict[Family, tuple[int, ...]] = {}   # the cp each family offers
        self.short_cps: set[int] = set()      # cp > 1 left out for too few tokens per rank
        self.mem = DeviceMemory.of(cluster.device(0), headroom)
        self.pruned: list[Reason] = []
        # the configurations rank returned already: a later round (step 7) ranks the others
        self.ranked_before: set[ParallelConfig] = set()
        self.fallbacks: list[str] = []
        self.splits = StageSplits(cluster)    # the partition DP's answers, memoized
        self.devices = StageDeviceTable(cluster, headroom)
        # the variants that fit at no allowed rung (unfit.py); families with a fitting variant
        self.unfit: Unfit = {}
        self.fitted: set[Family] = set()
        self.mesh_allowed: list[Family] = []    # valid families the tp/pp/dp constraints allow
        self.failed_finalists: list[Reason] = []
        self.visited = 0
        # why the ranking stopped before the end of its queue ("" when it reached the end)
        self.stopped = ""
        self.intra_op = IntraOpCache(graph, cluster, budget)
        self.fp8_choices = fp8_choices(self.constraints, cluster)
        # Offload rungs join the search in a second pass when nothing fits without them
        # (run_search), or from the start when the constraints leave no other choice.
        self.rungs = MemoryRungs(self.constraints, cluster)
        # the recomputed layers chosen per stage (stage_split.fit_recompute) unless the
        # constraints fix the policy of every layer
        self.per_stage = "recompute" not in self.constraints and self.profile.num_layers > 0
        self.tied_ends = self.profile.tied_ends
        # a ZeRO stage and an offload per pipeline rank (stage_zero.py) unless the constraints
        # name the ZeRO stages or the offloads a plan may take (one for all ranks, as an
        # expert's grid does)
        self.zero_per_rank = "zero_stage" not in self.constraints
        self.offload_per_rank = "offload" not in self.constraints
        self._estimates: dict[ParallelConfig, float] = {}   # T̂ of placed candidates
        self._deferred: list[Deferred] | None = None   # set by rank() for its loop

    def offload_pass(self) -> bool:
        """Start the second pass, with the offload rungs, when the first found nothing that
        fits and offload can be priced here; the first pass's records are dropped (the second
        prices every candidate again and records its own). ``False`` when there is none."""
        if not self.rungs.start_offload():
            return False
        self.pruned, self.mesh_allowed, self.failed_finalists = [], [], []
        self.unfit, self.fitted, self.stopped = {}, set(), ""
        text = ("nothing fits in device memory without offload: the search ran again with "
                "the optimizer states (and parameter shards) offloaded to host memory")
        log.info(text)
        self.fallbacks.append(text)
        return True

    # -- steps 1–2 ------------------------------------------------------------------------
    def families(self) -> dict[Family, Rung]:
        """Valid families and their first memory rung (ZeRO stage, offload) passing the memory
        bound."""
        prof = self.profile
        fams = families(self.cluster.num_devices, batch=self.batch, layers=prof.num_layers,
                        heads=prof.heads, tp_widths=prof.tp_widths(), pruned=self.pruned,
                        cps=self.possible_cps)
        out: dict[Family, Rung] = {}
        dropped: list[Dropped] = []
        for fam in fams:
            probe = ParallelConfig(dp=fam.dp, tp=fam.tp, pp=fam.pp)   # for the mesh constraints
            if not allowed(probe, only(self.constraints, ("tp", "pp", "dp"))):
                continue
            straddled = straddle_reason(self.cluster, fam)
            if straddled is not None:
                self.pruned.append(straddled)
                continue
            self.mesh_allowed.append(fam)
            lightest = prof.get(fam.tp, True, "full", 1,
                                ep=max(ep_degrees(fam.dp, self.experts, self.constraints)))
            devs = self.devices.of(fam.pp, fam.dp * fam.tp)
            mem = devs.mean_memory()
            for zero, off in self.rungs.of(fam.dp):
                need = memory_lower_bound(fam, zero, lightest, mem, off)
                if need <= mem.limit:
                    out[fam] = (zero, off)
                    self.cps_of[fam], left = offered_cps(
                        fam, self.possible_cps(fam.dp),
                        lambda cp, fam=fam, rung=(zero, off): self._fits_plain(fam, rung, cp))
                    if left is not None:
                        dropped.append(left)
                    break
                self.pruned.append(memory_reason(
                    fam, zero, need, lightest, mem,
                    lightest_at(self._options(fam), (zero, off), prof.num_layers), off,
                    mean=not devs.uniform))
        self.pruned += context_reasons(dropped)
        if self.short_cps and self.seq:
            self.pruned.append(short_reason(self.seq, tuple(sorted(self.short_cps))))
        return out

    def _profiles(self, c: ParallelConfig) -> tuple[SegmentProfile, list[SegmentProfile] | None,
                                                    StageDevices]:
        """``c``'s profiles (:func:`fxplan.inter_op.stage_devices.rank_profiles`) and the
        ranks' devices."""
        devs = self.devices.of(c.pp, c.dp * c.tp)
        return (*rank_profiles(self.profile, c, devs), devs)

    def _memory(self, devs: StageDevices) -> DeviceMemory | tuple[DeviceMemory, ...]:
        """The memory of one kind of device, or one per pipeline rank of ``devs``."""
        return self.mem if devs.uniform else devs.memory

    # -- step 4 ---------------------------------------------------------------------------
    def _partition(self, c: ParallelConfig) -> ParallelConfig | None:
        """``c`` with the stage split that fits (:mod:`fxplan.inter_op.stage_split`), the
        cheapest by ``T̂`` of :meth:`_placements` (the split's DP balances the slowest stage,
        not the step), or ``None``."""
        return min(self._placements(c), key=self._estimate, default=None)

    def _placements(self, c: ParallelConfig) -> list[ParallelConfig]:
        """``c``'s placed variants that fit: its split, and where its recompute policy may
        run on only some layers the split with the recomputed layers of each stage and the
        split without recompute (:meth:`~fxplan.inter_op.stage_split.StageSplits.
        fit_recompute`)."""
        prof, profs, devs = self._profiles(c)
        if not self.per_stage or c.recompute == "none":
            placed = self.splits.fit(c, prof, profs, self._memory(devs), self.mem)
            return [] if placed is None else [placed]
        base = c.replace(recompute="none")
        none, nones, _ = self._profiles(base)
        return self.splits.fit_recompute(c, prof, profs, none, nones, self._memory(devs),
                                         self.mem, self.profile.of, base)

    def _estimate(self, placed: ParallelConfig) -> float:
        """``T̂`` of a placed candidate (:func:`fxplan.inter_op.surrogate.surrogate_step_s`),
        each layer priced under its own recompute policy (memoized: step 4 prices the
        variants of a candidate, then scores the one it keeps)."""
        hit = self._estimates.get(placed)
        if hit is None:
            prof, profs, _ = self._profiles(placed)
            hit = self._estimates[placed] = surrogate_step_s(placed, prof, self.cluster, profs)
        return hit

    def possible_cps(self, dp: int) -> tuple[int, ...]:
        """:func:`fxplan.inter_op.context_bound.possible_cps` of a family with ``dp``
        data-parallel ranks; :attr:`short_cps` records the degrees left out as too short."""
        out, short = possible_cps(dp, self.seq, self.batch, self.constraints)
        self.short_cps.update(short)
        return out

    def _fits_plain(self, fam: Family, rung: Rung, cp: int) -> bool:
        """Whether ``fam`` at ``cp`` fits one sequence per microbatch without recompute at
        ``rung`` (:func:`fxplan.inter_op.context_bound.plain_config`)."""
        c = plain_config(fam, rung, cp, self.batch, self.seq, self.profile.num_layers)
        prof, _, devs = self._profiles(c)
        mems = self._memory(devs)
        return bool((stage_totals(c, prof, mems) <= rank_limits(mems)).all())

    def _options(self, fam: Family, rung: Rung = (0, "none")) -> Iterator[ParallelConfig]:
        """The candidates of ``fam`` at ``rung`` (:func:`fxplan.inter_op.space.options`, with
        the expert-parallel degrees the constraints allow and the context-parallel ones the
        family offers, :mod:`fxplan.inter_op.context_bound`), each with every FP8 choice the
        constraints allow (FP8 only when allowed: it changes the numerics)."""
        prof = self.profile
        cps = self.cps_of.get(fam) or self.possible_cps(fam.dp)
        for c in options(fam, batch=self.batch, layers=prof.num_layers, seq=prof.segments.seq,
                         eps=ep_degrees(fam.dp, self.experts, self.constraints), cps=cps,
                         per_stage_recompute=self.per_stage, tied_ends=self.tied_ends,
                         zero_stage=rung[0], offload=rung[1]):
            for fp8 in self.fp8_choices:
                yield c.replace(fp8=fp8) if fp8 else c

    def _score(self, c: ParallelConfig, kth: float = math.inf) -> Scored | None:
        """The cheapest by ``T̂`` of ``c`` at each allowed ZeRO stage that fits (ties → the
        lower stage), then with a rung per pipeline rank chosen with the split (:meth:`_joint`;
        ``kth``: the ``K``-th best ``T̂`` so far), or ``None`` (and the family's unfit record)
        when none fits."""
        family = Family.of(c)
        rungs = self._runnable(c, self.rungs.of(family.dp))
        rungs = rungs[rungs.index((c.zero_stage, c.offload)):]
        best: Scored | None = None
        tried: dict[Rung, ParallelConfig | None] = {}   # each plan-wide rung's split
        for zero, off in rungs:
            if best is not None and off != "none":
                break                     # offload plan-wide only where no on-device rung fits
            placed = tried[(zero, off)] = self._partition(
                c if (zero, off) == (c.zero_stage, c.offload) else
                c.replace(zero_stage=zero, offload=off))
            if placed is not None:
                scored = Scored(placed, self._estimate(placed))
                if best is None or scored.surrogate_s < best.surrogate_s:
                    best = scored
        if best is not None:
            self.fitted.add(family)
            return self._joint(c, best, tried, kth)
        heaviest = evenly_at(c, rungs[-1] if rungs else (c.zero_stage, c.offload),
                             self.profile.num_layers)
        return self._mixed_only(c, kth, lambda: record_unfit(self.unfit, family,
                                                             self._worst(heaviest), heaviest))

    # -- steps 5–6 -----------------------------------------------------------------------
    def solve_placements(self, ranked: list[Scored]) -> None:
        """Step 6a: one intra-op solve per distinct tp degree of the finalists, each limited to
        what is left of the time budget (a solve it leaves no time falls back to the default
        layout, recorded by :meth:`IntraOpCache.placements`)."""
        for tp in dict.fromkeys(s.config.tp for s in ranked):
            self.intra_op.solve(tp)

    def finalists(self, ranked: list[Scored]) -> list[Priced]:
        """Steps 5–6b: the finalists priced with their placements, the fitting ones fastest
        first (:func:`fxplan.inter_op.pricing.price_finalists`); the failed and the merged
        become pruning reasons."""
        done = price_finalists(self.graph, self.cluster, [s.config for s in ranked], self.batch,
                               self.intra_op, self.budget,
                               sequence_parallel=self.constraints.get("sequence_parallel"),
                               tp_named="tp" in self.constraints,
                               memory_headroom=self.headroom,
                               state_layout=self.state_layout)
        self.failed_finalists = done.failed
        self.fallbacks += done.fallbacks
        self.pruned += done.merged + done.failed
        return done.priced

    def unfit_reasons(self) -> None:
        """One reason per family with ranked variants that fit at no allowed ZeRO stage
        (:func:`fxplan.inter_op.unfit.unfit_reasons`)."""
        self.pruned += unfit_reasons(self.unfit, self.fitted, self.lightest, self.stopped)

    def lightest(self, fam: Family) -> tuple[ParallelConfig, MemoryBreakdown] | None:
        """The lightest candidate of ``fam`` the constraints allow and its heaviest rank's
        memory (:func:`fxplan.inter_op.lightest.lightest_allowed`); ``None`` when none."""
        rungs = self.rungs.of(fam.dp)
        top = rungs[-1] if rungs else None
        # a zero-bubble variant beside dp does not run at the top rung (zero_bubble_dp)
        variants = (c for c in self._options(fam) if top is None or self._runnable(c, [top]))
        return lightest_allowed(variants, top, self.profile.num_layers, self.constraints,
                                self._worst)

    def _worst(self, c: ParallelConfig) -> MemoryBreakdown:
        """The memory of ``c``'s pipeline rank that overflows most, each on its own device."""
        devs = self.devices.of(c.pp, c.dp * c.tp)
        return max(stage_memory(c, self.profile.of(c), self._memory(devs)), key=overflow)

    def failure(self, model: str) -> Exception:
        """Why no finalist came out (``run_search`` raises it): the constraints exclude every
        candidate or every finalist failed when priced (:func:`.infeasible.no_plan_error`), or
        nothing fits in memory: then the lightest configuration the constraints allow is
        quoted, among the variants the search tried and the lightest of each family it never
        tried."""
        prof, cluster = self.profile, self.cluster
        reasons: list[Reason] = []
        valid = families(cluster.num_devices, batch=self.batch, layers=prof.num_layers,
                         heads=prof.heads, tp_widths=prof.tp_widths(), pruned=reasons,
                         cps=self.possible_cps)
        where = f"{model} on {cluster.name} ({cluster.num_devices} devices, batch {self.batch})"
        error = no_plan_error(
            where, cluster.num_devices, valid, reasons, self.mesh_allowed,
            describe(self.constraints),
            lambda: all(self.lightest(f) is None for f in self.mesh_allowed),
            self.failed_finalists, tied_ends=self.tied_ends)
        if error is not None:
            return error
        tried = [(which, least) for _, least, which in self.unfit.values()]
        untried = [self.lightest(f) for f in self.mesh_allowed if f not in self.unfit]
        which, worst = min(tried + [f for f in untried if f is not None],
                           key=lambda o: o[1].total, default=(None, None))
        text = infeasible_message(
            model, cluster.name, cluster.num_devices, self.batch, worst,
            which.summary() if which is not None else "", cluster.devices_per_node(),
            constraints=describe(self.constraints))
        return InfeasibleError(text + self.rungs.host_note(self.graph.num_params, cluster))
