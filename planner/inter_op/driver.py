"""The inter-op search: the fastest configuration that fits, and why it won.

**Problem.** Given a captured graph, a cluster of ``N`` devices with capacity ``C`` each and a
global batch ``B``, choose ``x = (tp, pp, dp, b, schedule, zero, recompute, sp, stages)`` with
``pp·dp·tp = N`` and ``B = dp·b·m`` to

    minimise  T(x)     (the step simulator, :func:`cost_model.step.estimate.estimate`)
    s.t.      M_s(x) + H ≤ C  for every pipeline rank s    (:mod:`cost_model.memory.breakdown`; ``H``
                                  the headroom, :mod:`cost_model.memory.headroom`)

**Method**: branch and bound over an enumerated space (docs/planner.md, "The search", tells
each step in words). On several device groups (:mod:`.stage_devices`) each pipeline rank is
priced and checked on its own group; the bounds take the mean free memory, the fastest work.

1. Families ``(tp, pp, dp)`` (:mod:`.space`), invalid ones pruned with their reason.
2. Memory bound per (family, rung) (:mod:`.bounds`): ``k_z(dp)·Ψ/pp + reserved + runtime >
   C − H`` prunes the pair; each candidate starts at the lowest surviving rung (ZeRO stage,
   offload; :mod:`.offload`). Offload rungs plan-wide only in a second pass when the first
   found nothing that fits, or from the start when the ``offload`` constraint excludes
   ``none``; per pipeline rank also in the first pass with :data:`JOINT_RUNGS` (step 4).
3. Candidates (:mod:`.space`) visited in increasing order of their lower bound on ``T̂``
   — on one kind of device the pipeline bound ``(m + (p−1)/v)·W/pp``
   (:func:`.bounds.pipeline_lower_bound`), else the time bound ``m·W/pp`` — until it
   exceeds the ``K``-th best ``T̂`` or the time budget ends (once one fits); a candidate
   whose time bound reaches the ``K``-th best ``T̂`` is skipped unpriced. Visiting by the
   tighter bound finds the good candidates first, so the ``K``-th best falls sooner and
   fewer are priced; the ``K`` best are those of any visiting order (ties in ``T̂`` go to
   the earlier in the order of ``m·W/pp``).
4. Per candidate and rung: the partition DP under the memory cap (:mod:`.partition`), the
   per-rank memory by the estimate's own formula (:mod:`.stage_memory`), and the closed form
   ``T̂`` (:mod:`.surrogate`); the cheapest kept (ties → the lower rung). Unless the
   constraints name ``recompute``, a candidate's policy runs on as few layers of each stage
   as memory needs, chosen with the split (:meth:`.stage_split.StageSplits.fit_recompute`;
   its bounds are then those without recompute, the least it may cost). Each pipeline rank
   may then take its own ZeRO stage and offload for the kept split, among the rungs of the
   pass (:mod:`.stage_zero`, exact for ``T̂`` on a split); a constraint naming ``zero_stage``
   or ``offload`` keeps that one plan-wide. With :data:`JOINT_RUNGS` the split is chosen with
   those rungs: the candidate is placed at every rung a rank may take, the offload rungs
   included in every pass, and the per-rank choice runs on each distinct split
   (:mod:`.stage_zero`, "With the split"); a split whose bound
   :func:`.surrogate.split_bound` exceeds the ``K``-th best ``T̂`` is not mixed.
   No "lowest ZeRO stage that fits" rule: a higher stage moves more bytes but may shrink the optimizer step,
   the gradient sync or the memory that forces recompute; only the model can weigh them.
5. Placements ``π``: one intra-op solve per distinct tp of the ``K`` best (:mod:`.placements`).
6. Finalists: ``min(T(x, π), T(x, μ))`` against the default Megatron layout ``μ``
   (:mod:`.pricing`); the fastest that fits wins, the next three are the runners-up.

Nothing is dropped silently: every pruned family or candidate group carries its reason with
the arithmetic (:mod:`.reasons`, :mod:`.unfit`), every fallback is logged and kept in the plan.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from fxplan.core.config import ParallelConfig
from fxplan.cost_model.memory.breakdown import MemoryBreakdown
from fxplan.cost_model.memory.headroom import DEFAULT_HEADROOM, MemoryHeadroom
from fxplan.core.plan import Plan
from fxplan.cost_model.parallel.expert_parallel import num_experts
from fxplan.inter_op.bounds import (memory_lower_bound, memory_reason, pipeline_lower_bound,
                                    time_lower_bound)
from fxplan.inter_op.build_plan import build_plan
from fxplan.inter_op.context_bound import (Dropped, context_reasons, offered_cps, plain_config,
                                            possible_cps, short_reason)
from fxplan.inter_op.constraints import (allowed, check_cp_constraint, check_ep_constraint,
                                          describe, ep_degrees, only, validate_constraints)
from fxplan.inter_op.infeasible import (InfeasibleError, NoRunnablePlan, infeasible_message,
                                        no_plan_error)
from fxplan.inter_op.lightest import evenly_at, lightest_allowed, lightest_at
from fxplan.inter_op.offload import MemoryRungs, Rung, fp8_choices
from fxplan.inter_op.placements import IntraOpCache
from fxplan.inter_op.pricing import Priced, price_finalists
from fxplan.inter_op.profile import ModelProfile, SegmentProfile
from fxplan.inter_op.reasons import RUNTIME, TIME_BOUND, Reason
from fxplan.inter_op.progress import Budget, PhaseTimer, progress_bar
from fxplan.inter_op.space import Family, families, options
from fxplan.inter_op.stage_devices import (StageDevices, StageDeviceTable, rank_limits,
                                           rank_profiles, straddle_reason)
from fxplan.inter_op.stage_memory import DeviceMemory, stage_memory, stage_totals
from fxplan.inter_op.stage_split import StageSplits
from fxplan.inter_op.stage_zero import mix_rungs
from fxplan.core.zero_bubble_dp import after_step_refusal, reduces_after_step
from fxplan.inter_op.surrogate import split_bound, surrogate_step_s
from fxplan.inter_op.unfit import Unfit, overflow, record_unfit, unfit_reasons

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["DEFAULT_FINALISTS", "Runnable", "run_search"]

log = logging.getLogger("fxplan.planner")

#: ``K``: candidates priced by the step simulator.
DEFAULT_FINALISTS = 8
#: Rounds of ``K`` finalists put to the runtime's check (step 7): when it refuses every one of
#: a round, the next ``K`` candidates by ``T̂`` are priced and checked, up to this many rounds.
RUNTIME_ROUNDS = 4

@dataclass
class _Scored:
    config: ParallelConfig
    surrogate_s: float


#: Relative margin of the pipeline bound against the ``K``-th best ``T̂``: the two sum the same
#: seconds in different orders.
_ROUND_OFF = 1e-9

#: Whether step 4 chooses the split and the per-rank rungs together (:meth:`_Search._joint`:
#: the candidate's split at every rung a rank may take gets the per-rank choice too, and the
#: offload rungs are offered per rank in every pass); off, each rank's rung is chosen for the
#: split of the cheapest plan-wide rung only, among the rungs of the pass (kept for comparison
#: in ``tests/inter_op/test_joint_rungs.py``).
JOINT_RUNGS = True

#: Constraints the memory rungs apply (:mod:`fxplan.inter_op.offload`), not the candidates.
_RUNG_KEYS = ("zero_stage", "offload")


class _Search:
    """State of one search (see the module docstring for the steps)."""

    def __init__(self, graph: CapturedGraph, cluster: Cluster, batch: int,
                 constraints: Mapping[str, Any], finalists: int, timer: PhaseTimer,
                 budget: Budget, progress: bool,
                 headroom: MemoryHeadroom = DEFAULT_HEADROOM) -> None:
        self.graph, self.cluster, self.batch = graph, cluster, batch
        self.headroom = headroom
        self.constraints = validate_constraints(constraints, cluster.num_devices)
        self.K = finalists
        self.timer, self.budget, self.progress = timer, budget, progress
        self.profile = ModelProfile(graph, cluster)
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

    def rank(self, fams: dict[Family, int]) -> list[_Scored]:
        """Steps 3–4: the ``K`` best candidates by ``T̂``."""
        prof = self.profile
        queue: list[tuple[float, int, ParallelConfig, float]] = []
        uniform = len(self.cluster.device_groups) == 1
        groups = (None,) if uniform else self.cluster.device_groups
        # the constraints other than the memory rung's (zero stage, offload): the same for all
        unsettled = {k: v for k, v in self.constraints.items() if k not in _RUNG_KEYS}
        # the bounds' work: without recompute where a candidate may recompute fewer layers
        # than all (step 4), else the candidate's own policy
        floor = "none" if self.per_stage else None
        for fam, rung in fams.items():
            for c in self._options(fam, rung):
                # zero-bubble beside dp at a rung the runtime cannot run (nor any above it)
                if allowed(c, unsettled) and self._runnable(c, [(c.zero_stage, c.offload)]):
                    lb = min(time_lower_bound(c, prof.of(c, g, floor)) for g in groups)
                    # the pipeline bound (bounds.py) holds on one kind of device only
                    piped = pipeline_lower_bound(c, prof.of(c, None, floor)) if uniform else 0.0
                    queue.append((lb, len(queue), c, piped))
        # visited by the tighter of the two bounds (the pipeline bound, where it holds), ties
        # by the compute bound, then as generated: the K-th best estimate falls sooner, and
        # more are skipped
        queue.sort(key=lambda item: (max(item[0], item[3]), item[0], item[1]))
        # max-heap of the K best by T̂ (negated); ties in T̂ go to the lower compute bound
        best: list[tuple[float, tuple[float, int], _Scored]] = []
        # two policies chosen per stage may both find that no layer needs recompute: one
        # configuration, ranked once
        scored_configs: set[ParallelConfig] = set()
        skipped, computed = 0, []   # pruned by the pipeline bound; the compute bounds pruned
        with progress_bar(len(queue), "inter-op search", self.progress) as bar:
            for position, (lb, seq, c, piped) in enumerate(queue):
                if len(best) >= self.K:
                    kth = -best[0][0]
                    if max(lb, piped) > kth * (1.0 + _ROUND_OFF):
                        # every later bound is at least this one: all of them are pruned
                        rest = queue[position:]
                        computed += [q[0] for q in rest if q[0] >= kth]
                        skipped += sum(1 for q in rest if q[0] < kth)
                        break
                    if lb >= kth:
                        computed.append(lb)
                        bar.advance()
                        continue
                    # strictly above, past round-off: a tie could still enter the top K
                    if piped > kth * (1.0 + _ROUND_OFF):
                        skipped += 1
                        bar.advance()
                        continue
                if best and self.budget.expired():
                    self._budget_fallback(position, len(queue))
                    self.stopped = "the time budget ran out before they were ranked"
                    break
                self.visited += 1
                bar.advance()
                scored = self._score(c, -best[0][0] if len(best) >= self.K else math.inf)
                if scored is None or scored.config in scored_configs \
                        or scored.config in self.ranked_before:
                    continue
                scored_configs.add(scored.config)
                item = (-scored.surrogate_s, (lb, seq), scored)
                if len(best) < self.K:
                    heapq.heappush(best, item)
                elif item > best[0]:
                    heapq.heapreplace(best, item)
        if computed:
            self.pruned.append(Reason(
                f"{len(computed)} candidates: compute lower bound m·W/pp ≥ "
                f"{min(computed):.4g} s ≥ the {self.K}-th best estimate {-best[0][0]:.4g} s",
                TIME_BOUND))
            self.stopped = self.stopped or (f"the search stopped before them: their compute "
                                            f"lower bound reached the {self.K}-th best estimate")
        if skipped:
            self.pruned.append(Reason(
                f"{skipped} candidates: pipeline lower bound (m + (pp−1)/v)·W/pp above the "
                f"{self.K}-th best estimate at their turn", TIME_BOUND))
            self.stopped = self.stopped or (
                "their pipeline lower bound exceeded the best estimates found")
        ranked = [s for _, _, s in sorted(best, key=lambda t: -t[0])]
        self.ranked_before.update(s.config for s in ranked)
        return ranked

    def next_round(self, fams: dict[Family, int]) -> list[_Scored]:
        """Step 7's next round: the ``K`` best candidates by ``T̂`` not ranked before (every
        finalist of the last round was refused by the runtime); the time bound's reasons are
        those of this ranking."""
        self.pruned = [r for r in self.pruned if r.kind != TIME_BOUND]
        return self.rank(fams)

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

    def _score(self, c: ParallelConfig, kth: float = math.inf) -> _Scored | None:
        """The cheapest by ``T̂`` of ``c`` at each allowed ZeRO stage that fits (ties → the
        lower stage), then with a rung per pipeline rank chosen with the split (:meth:`_joint`;
        ``kth``: the ``K``-th best ``T̂`` so far), or ``None`` (and the family's unfit record)
        when none fits."""
        family = Family.of(c)
        rungs = self._runnable(c, self.rungs.of(family.dp))
        rungs = rungs[rungs.index((c.zero_stage, c.offload)):]
        best: _Scored | None = None
        tried: dict[Rung, ParallelConfig | None] = {}   # each plan-wide rung's split
        for zero, off in rungs:
            if best is not None and off != "none":
                break                     # offload plan-wide only where no on-device rung fits
            placed = tried[(zero, off)] = self._partition(
                c if (zero, off) == (c.zero_stage, c.offload) else
                c.replace(zero_stage=zero, offload=off))
            if placed is not None:
                scored = _Scored(placed, self._estimate(placed))
                if best is None or scored.surrogate_s < best.surrogate_s:
                    best = scored
        if best is not None:
            self.fitted.add(family)
            return self._joint(c, best, tried, kth)
        heaviest = evenly_at(c, rungs[-1] if rungs else (c.zero_stage, c.offload),
                             self.profile.num_layers)
        record_unfit(self.unfit, family, self._worst(heaviest), heaviest)
        return None

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

    def _joint(self, c: ParallelConfig, best: _Scored,
               tried: Mapping[Rung, ParallelConfig | None], kth: float = math.inf) -> _Scored:
        """``best`` with a rung per pipeline rank (:mod:`fxplan.inter_op.stage_zero`, exact
        for a split): chosen for ``best``'s split and, with :data:`JOINT_RUNGS`, also for the
        split of ``c`` at every other rung a rank may take (``tried``: the splits of the
        plan-wide rungs already placed; a split that fits only where some rank takes a high
        ZeRO stage or offloads: :mod:`~fxplan.inter_op.stage_zero`, "With the split"); the
        cheapest by ``T̂`` is kept (ties → ``best``'s, then the lower rung's split). A split
        whose bound :func:`~fxplan.inter_op.surrogate.split_bound` exceeds ``kth`` (the
        ``K``-th best ``T̂`` so far) is not mixed: nothing on it enters the ``K`` best."""
        rungs = self._mixable(best.config)
        if c.pp == 1 or c.dp == 1 or len(rungs) < 2:   # nothing to choose per rank
            return best
        splits: Iterator[ParallelConfig] = iter([best.config])
        if JOINT_RUNGS:
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
            if split_bound(placed, prof, profs) > kth * (1.0 + _ROUND_OFF):
                continue
            mixed = mix_rungs(placed, rungs, prof, profs, self._memory(devs), self.cluster,
                              out.surrogate_s)
            if mixed is not None:
                self._estimates[mixed[0]] = mixed[1]
                out = _Scored(*mixed)
        return out

    def _split_rungs(self, c: ParallelConfig, rungs: list[Rung]) -> list[Rung]:
        """The rungs of ``rungs`` at which :meth:`_joint` places ``c`` on every rank: none
        below ``c``'s own (the first the memory bound of step 2 passes: below it no split fits
        every rank), and of the offload rungs only ZeRO-3's, those of least device memory
        (placing at each offload rung costs a partition each; measured on GPT-1T the lower
        ZeRO stages' offload splits rarely won)."""
        ladder = self.rungs.per_rank(c.dp)
        above = set(ladder[ladder.index((c.zero_stage, c.offload)):])
        return [(z, off) for z, off in rungs if (z, off) in above and (off == "none" or z == 3)]

    def _budget_fallback(self, index: int, total: int) -> None:
        text = (f"time budget {self.budget.seconds:g} s reached after {index} of {total} "
                "candidates; the best found so far is kept (not proven best)")
        log.warning(text)
        self.fallbacks.append(text)

    # -- steps 5–6 -----------------------------------------------------------------------
    def solve_placements(self, ranked: list[_Scored]) -> None:
        """Step 6a: one intra-op solve per distinct tp degree of the finalists, each limited to
        what is left of the time budget (a solve it leaves no time falls back to the default
        layout, recorded by :meth:`IntraOpCache.placements`)."""
        for tp in dict.fromkeys(s.config.tp for s in ranked):
            self.intra_op.solve(tp)

    def finalists(self, ranked: list[_Scored]) -> list[Priced]:
        """Steps 5–6b: the finalists priced with their placements, the fitting ones fastest
        first (:func:`fxplan.inter_op.pricing.price_finalists`); the failed and the merged
        become pruning reasons."""
        done = price_finalists(self.graph, self.cluster, [s.config for s in ranked], self.batch,
                               self.intra_op, self.budget,
                               sequence_parallel=self.constraints.get("sequence_parallel"),
                               tp_named="tp" in self.constraints,
                               memory_headroom=self.headroom)
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


def free_degrees(c: ParallelConfig, constraints: Mapping[str, Any]) -> list[str]:
    """The line that reports the degrees a constrained search chose freely (``--constrain
    tp=2`` on 4 devices may bring in ``pp=2``): empty when nothing is constrained or every
    unnamed degree stayed at 1."""
    if not constraints:
        return []
    free = [f"{name}={value}" for name, value in (("tp", c.tp), ("pp", c.pp), ("dp", c.dp))
            if name not in constraints and value > 1]
    if not free:
        return []
    return [f"{c.summary()}: {', '.join(free)} chosen by the search (the constraints "
            f"{', '.join(sorted(constraints))} leave {'it' if len(free) == 1 else 'them'} "
            "free; constrain to fix)"]


#: Asked of each priced finalist, best first, before it is offered: why the runtime cannot
#: apply the plan to the model (a sentence), or ``None`` when it can.
Runnable = Callable[[Plan], "str | None"]


def run_search(graph: CapturedGraph, cluster: Cluster, *, batch: int, model: str,
               time_budget_s: float | None, progress: bool, constraints: Mapping[str, Any],
               finalists: int, timer: PhaseTimer,
               memory_headroom: MemoryHeadroom = DEFAULT_HEADROOM,
               runnable: Runnable | None = None) -> Plan:
    """Steps 1–6 on a captured graph (the public wrapper is :func:`fxplan.inter_op.search`).
    ``runnable``: step 7, the runtime's check of each finalist, best first; the first it
    accepts is the plan, the ones it refuses are pruned with its reason (kind
    :data:`~fxplan.inter_op.reasons.RUNTIME`). When it refuses every finalist, the next ``K``
    candidates by ``T̂`` (those not ranked before) are priced and checked, for up to
    :data:`RUNTIME_ROUNDS` rounds in all — the fastest plans may all share what the runtime
    cannot run (pp > 1 for a model whose forward cannot be cut) while slower ones run —; when
    it refuses all of them the search fails saying why."""
    budget = Budget(time_budget_s)
    state = _Search(graph, cluster, batch, constraints, finalists, timer, budget, progress,
                    memory_headroom)
    with timer("inter-op"):
        fams = state.families()
        ranked = state.rank(fams)
        if not ranked and state.offload_pass():
            fams = state.families()
            ranked = state.rank(fams)
        state.unfit_reasons()
    with timer("intra-op"):
        state.solve_placements(ranked)
    with timer("simulate"):
        done = state.finalists(ranked)
    if not done:
        raise state.failure(model)

    def plan_of(k: int, pruned: list[Reason]) -> Plan:
        best = done[k]
        if best.fallback:
            log.info(best.note)  # a layout decision, shown in the report with the fallbacks
        fallbacks = [*state.fallbacks, *best.placements.fallbacks,
                     *([best.note] if best.fallback else []), *free_degrees(best.config, constraints)]
        return build_plan(graph, cluster, model=model, batch=batch, best=best,
                          runners_up=done[k + 1:k + 4], pruned=pruned, fallbacks=fallbacks,
                          search_time_s=budget.elapsed(), timings=timer.rounded(),
                          visited=state.visited)

    refused: list[Reason] = []
    checked: set[ParallelConfig] = set()   # a later round's candidate may price as an earlier
    for round_ in range(RUNTIME_ROUNDS):
        for k, candidate in enumerate(done):
            if candidate.config in checked:
                continue
            checked.add(candidate.config)
            plan = plan_of(k, [*state.pruned, *refused])
            if runnable is None:
                return plan
            with timer("runtime check"):
                why = runnable(plan)
            if why is None:
                return plan
            refused.append(Reason(f"{candidate.config.summary()}: {why}", RUNTIME,
                                  config=candidate.config.to_string()))
        if round_ + 1 == RUNTIME_ROUNDS or budget.expired():
            break
        with timer("inter-op"):
            ranked = state.next_round(fams)
        if not ranked:
            break
        with timer("intra-op"):
            state.solve_placements(ranked)
        with timer("simulate"):
            done = state.finalists(ranked)
    raise NoRunnablePlan(model, refused)

