"""The inter-op search: the fastest configuration that fits, and why it won.

**Problem.** Given a captured graph, a cluster of ``N`` devices with capacity ``C`` each and a
global batch ``B``, choose ``x = (tp, pp, dp, b, schedule, zero, recompute, sp, stages)`` with
``pp·dp·tp = N`` and ``B = dp·b·m`` to

    minimise  T(x)     (the step simulator, :func:`cost_model.estimate.estimate`)
    s.t.      M_s(x) + H ≤ C  for every pipeline rank s    (:mod:`cost_model.memory`; ``H``
                                  the headroom, :mod:`cost_model.memory_headroom`)

**Method**: branch and bound over an enumerated space; docs/planner.md ("The search") tells
each step and what it prunes, heterogeneous clusters included (:mod:`.stage_devices`).

1. Families ``(tp, pp, dp)`` (:mod:`.space`), invalid ones pruned with their reason.
2. Memory bound per (family, rung) (:mod:`.bounds`): ``k_z(dp)·Ψ/pp + reserved + runtime >
   C − H`` prunes the pair; each candidate starts at the lowest surviving rung (ZeRO stage,
   offload; :mod:`.offload`). Offload rungs only in a second pass when the first found
   nothing that fits, or from the start when the ``offload`` constraint excludes ``none``.
3. Candidates (:mod:`.space`) visited by the time bound ``m·W/pp`` until it reaches the
   ``K``-th best ``T̂`` or the time budget ends (once one fits).
4. Per candidate and rung: the partition DP under the memory cap (:mod:`.partition`), the
   per-rank memory by the estimate's own formula (:mod:`.stage_memory`), and the closed form
   ``T̂`` (:mod:`.surrogate`); the cheapest kept (ties → the lower rung). No "lowest ZeRO
   stage that fits" rule: a higher stage moves more bytes but may shrink the optimizer step,
   the gradient sync or the memory that forces recompute; only the model can weigh them.
5. Placements ``π``: one intra-op solve per distinct tp of the ``K`` best (:mod:`.placements`).
6. Finalists: ``min(T(x, π), T(x, μ))`` against the default Megatron layout ``μ``
   (:mod:`.pricing`); the fastest that fits wins, the next three are the runners-up.

Nothing is dropped silently: every pruned family or candidate group carries its reason with
the arithmetic (:mod:`.reasons`, :mod:`.unfit`), every fallback is logged and kept in the plan.
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import numpy as np

from fxplan.core.config import ParallelConfig, Schedule
from fxplan.cost_model.memory import MemoryBreakdown
from fxplan.cost_model.memory_headroom import DEFAULT_HEADROOM, MemoryHeadroom
from fxplan.core.plan import Plan
from fxplan.cost_model.expert_parallel import num_experts
from fxplan.inter_op.bounds import memory_lower_bound, memory_reason, time_lower_bound
from fxplan.inter_op.build_plan import build_plan
from fxplan.inter_op.context_bound import (Dropped, context_reasons, offered_cps, possible_cps,
                                            short_reason)
from fxplan.inter_op.constraints import (allowed, check_cp_constraint, check_ep_constraint,
                                          describe, ep_degrees, only, validate_constraints)
from fxplan.inter_op.infeasible import InfeasibleError, infeasible_message, no_plan_error
from fxplan.inter_op.offload import MemoryRungs, Rung, fp8_choices, host_fits
from fxplan.inter_op.partition import balanced_counts, partition_layers
from fxplan.inter_op.placements import IntraOpCache
from fxplan.inter_op.pricing import Priced, price_finalists
from fxplan.inter_op.profile import ModelProfile, SegmentProfile
from fxplan.inter_op.reasons import DIVIDE, TIME_BOUND, Reason
from fxplan.inter_op.progress import Budget, PhaseTimer, progress_bar
from fxplan.inter_op.space import Family, families, options
from fxplan.inter_op.stage_devices import (StageDevices, StageDeviceTable, rank_limits,
                                           rank_profiles, straddled_stage)
from fxplan.inter_op.stage_memory import (DeviceMemory, partition_inputs, stage_memory,
                                         stage_totals)
from fxplan.inter_op.surrogate import surrogate_step_s
from fxplan.inter_op.unfit import Unfit, overflow, record_unfit, unfit_reasons

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["DEFAULT_FINALISTS", "run_search"]

log = logging.getLogger("fxplan.planner")

#: ``K``: candidates priced by the step simulator.
DEFAULT_FINALISTS = 8

@dataclass
class _Scored:
    config: ParallelConfig
    surrogate_s: float


def _probe(family: Family) -> ParallelConfig:
    """A configuration of ``family`` to test the mesh constraints on."""
    return ParallelConfig(dp=family.dp, tp=family.tp, pp=family.pp)


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
        self.fallbacks: list[str] = []
        self.partitions: dict[tuple, Any] = {}
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
            if not allowed(_probe(fam), only(self.constraints, ("tp", "pp", "dp"))):
                continue
            straddled = (straddled_stage(self.cluster, fam.pp, fam.dp * fam.tp)
                         if len(self.cluster.device_groups) > 1 else None)
            if straddled is not None:
                s, a, b = straddled
                self.pruned.append(Reason(
                    f"{fam}: pipeline stage {s} ({fam.dp * fam.tp} ranks) spans device groups "
                    f"{a} and {b}; each stage runs on one device group", DIVIDE))
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
                self.pruned.append(memory_reason(fam, zero, need, lightest, mem,
                                                 self._lightest_at(fam, (zero, off)), off,
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
        prof, profs, devs = self._profiles(c)
        mems = self._memory(devs)
        if profs is None:
            inputs = partition_inputs(c, prof, mems)
            time = prof.layer_time
        else:   # each virtual stage j priced on its pipeline rank's group (stage_devices)
            inputs = partition_inputs(c, prof, mems, ends=(profs[0], profs[-1]))
            time = np.stack([profs[j % c.pp].layer_time for j in range(c.pp * c.virtual_stages)])
        key = (c.tp, c.sequence_parallel, c.recompute, c.microbatch_size, c.fp8, c.ep, c.cp,
               c.pp, c.virtual_stages, c.dp, inputs.cap.tobytes(), inputs.extra_time.tobytes(),
               inputs.fixed_bytes.tobytes(), inputs.inflight.tobytes(),
               inputs.layer_state[:1].tobytes())
        if key not in self.partitions:
            self.partitions[key] = partition_layers(time, inputs.layer_state,
                                                    inputs.layer_acts, inputs.extra_time,
                                                    inputs.fixed_bytes, inputs.inflight,
                                                    inputs.cap)
        part = self.partitions[key]
        # The DP's memory rows are conservative (stage_memory docstring); the per-rank check
        # decides, and the most even split is the second chance when the DP found none.
        tries = ([part.counts] if part is not None else []) + \
            [balanced_counts(prof.layers, c.pp * c.virtual_stages)]
        caps = rank_limits(mems)
        for counts in tries:
            placed = c.replace(stage_layers=counts)
            if (stage_totals(placed, prof, mems) <= caps).all() and \
                    host_fits(placed, prof, self.mem, self.cluster):
                return placed
        return None

    def rank(self, fams: dict[Family, int]) -> list[_Scored]:
        """Steps 3–4: the ``K`` best candidates by ``T̂``."""
        prof = self.profile
        queue: list[tuple[float, int, ParallelConfig]] = []
        groups = (None,) if len(self.cluster.device_groups) == 1 else self.cluster.device_groups
        for fam, (zmin, off) in fams.items():
            for c in self._options(fam):
                c = c.replace(zero_stage=zmin, offload=off)
                if allowed(c, {k: v for k, v in self.constraints.items() if k not in _RUNG_KEYS}):
                    lb = min(time_lower_bound(c, prof.of(c, g)) for g in groups)
                    queue.append((lb, len(queue), c))
        queue.sort()
        best: list[tuple[float, int, _Scored]] = []   # max-heap of the K best by T̂ (negated)
        with progress_bar(len(queue), "inter-op search", self.progress) as bar:
            for index, (lb, _, c) in enumerate(queue):
                if len(best) >= self.K and lb >= -best[0][0]:
                    self.pruned.append(Reason(
                        f"{len(queue) - index} candidates: compute lower bound m·W/pp ≥ "
                        f"{lb:.4g} s ≥ the {self.K}-th best estimate {-best[0][0]:.4g} s",
                        TIME_BOUND))
                    self.stopped = (f"the search stopped before them: their compute lower "
                                    f"bound reached the {self.K}-th best estimate")
                    break
                if best and self.budget.expired():
                    self._budget_fallback(index, len(queue))
                    self.stopped = "the time budget ran out before they were ranked"
                    break
                self.visited += 1
                bar.advance()
                scored = self._score(c)
                if scored is None:
                    continue
                item = (-scored.surrogate_s, index, scored)
                if len(best) < self.K:
                    heapq.heappush(best, item)
                elif item > best[0]:
                    heapq.heapreplace(best, item)
        return [s for _, _, s in sorted(best, key=lambda t: -t[0])]

    def possible_cps(self, dp: int) -> tuple[int, ...]:
        """:func:`fxplan.inter_op.context_bound.possible_cps` of a family with ``dp``
        data-parallel ranks; :attr:`short_cps` records the degrees left out as too short."""
        out, short = possible_cps(dp, self.seq, self.batch, self.constraints)
        self.short_cps.update(short)
        return out

    def _fits_plain(self, fam: Family, rung: Rung, cp: int) -> bool:
        """Whether ``fam`` at ``cp`` fits one sequence per microbatch without recompute
        (even stages, sequence parallelism where possible, the rung's ZeRO stage and offload:
        :mod:`fxplan.inter_op.context_bound`)."""
        m = self.batch // (fam.dp // cp)
        sp = fam.tp > 1 and (self.seq is None or self.seq % (fam.tp * cp) == 0)
        c = ParallelConfig(dp=fam.dp, tp=fam.tp, pp=fam.pp, microbatch_size=1,
                           num_microbatches=m,
                           schedule=Schedule("1f1b" if fam.pp == 1 or m >= fam.pp else "gpipe"),
                           zero_stage=rung[0], offload=rung[1], sequence_parallel=sp, cp=cp,
                           stage_layers=balanced_counts(self.profile.num_layers, fam.pp))
        prof, _, devs = self._profiles(c)
        mems = self._memory(devs)
        return bool((stage_totals(c, prof, mems) <= rank_limits(mems)).all())

    def _options(self, fam: Family) -> Iterator[ParallelConfig]:
        """The candidates of ``fam`` (:func:`fxplan.inter_op.space.options`, with the
        expert-parallel degrees the constraints allow and the context-parallel ones the family
        offers, :mod:`fxplan.inter_op.context_bound`), each with every FP8 choice the
        constraints allow (FP8 only when allowed: it changes the numerics)."""
        prof = self.profile
        cps = self.cps_of.get(fam) or self.possible_cps(fam.dp)
        for c in options(fam, batch=self.batch, layers=prof.num_layers, seq=prof.segments.seq,
                         eps=ep_degrees(fam.dp, self.experts, self.constraints), cps=cps):
            for fp8 in self.fp8_choices:
                yield c.replace(fp8=fp8) if fp8 else c

    def _score(self, c: ParallelConfig) -> _Scored | None:
        """The cheapest by ``T̂`` of ``c`` at each allowed ZeRO stage that fits (ties → the
        lower stage), or ``None`` (and the family's unfit record) when none fits."""
        family = Family.of(c)
        rungs = self.rungs.of(family.dp)
        rungs = rungs[rungs.index((c.zero_stage, c.offload)):]
        best: _Scored | None = None
        for zero, off in rungs:
            if best is not None and off != "none":
                break                     # offload only where no on-device rung fits
            placed = self._partition(c.replace(zero_stage=zero, offload=off))
            if placed is not None:
                prof, profs, _ = self._profiles(c)
                scored = _Scored(placed, surrogate_step_s(placed, prof, self.cluster, profs))
                if best is None or scored.surrogate_s < best.surrogate_s:
                    best = scored
        if best is not None:
            self.fitted.add(family)
            return best
        zero, off = rungs[-1] if rungs else (c.zero_stage, c.offload)
        heaviest = c.replace(zero_stage=zero, offload=off,
                             stage_layers=balanced_counts(self.profile.num_layers,
                                                          c.pp * c.virtual_stages))
        prof, _, devs = self._profiles(c)
        worst = max(stage_memory(heaviest, prof, self._memory(devs)), key=overflow)
        record_unfit(self.unfit, family, worst, heaviest)
        return None

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
        """The lightest candidate of ``fam`` the constraints allow (evenly split, the highest
        allowed ZeRO stage, the smallest allowed microbatch) and its heaviest rank's memory;
        ``None`` when the constraints allow none."""
        rungs = self.rungs.of(fam.dp)
        prof = self.profile
        found = [c for c in self._options(fam)
                 if rungs and allowed(c.replace(zero_stage=rungs[-1][0], offload=rungs[-1][1]),
                                      self.constraints)]
        if not found:
            return None
        mb = min(c.microbatch_size for c in found)
        best = None
        for c in found:
            if c.microbatch_size != mb:
                continue
            c = c.replace(zero_stage=rungs[-1][0], offload=rungs[-1][1],
                          stage_layers=balanced_counts(prof.num_layers, c.pp * c.virtual_stages))
            seg = prof.of(c)
            devs = self.devices.of(c.pp, c.dp * c.tp)
            worst = max(stage_memory(c, seg, self._memory(devs)), key=overflow)
            if best is None or overflow(worst) < overflow(best[1]):
                best = (c, worst)
        return best

    def _lightest_at(self, fam: Family, rung: Rung) -> ParallelConfig | None:
        """The variant of ``fam`` the memory bound at ``zero`` speaks of: the smallest
        microbatch, full recompute, sequence parallelism where offered, evenly split (the
        bound holds for every variant, this one is the lightest in activations)."""
        prof = self.profile
        found = list(self._options(fam))
        if not found:
            return None
        best = min(found, key=lambda c: (c.microbatch_size, c.recompute != "full",
                                         not c.sequence_parallel))
        return best.replace(zero_stage=rung[0], offload=rung[1], stage_layers=balanced_counts(
            prof.num_layers, best.pp * best.virtual_stages))

    def infeasible(self, fams: list[Family], model: str) -> InfeasibleError:
        """Nothing fits in memory: the lightest configuration the constraints allow, among
        the variants the search tried and the lightest of each family it never tried."""
        options_ = [(which.summary(), least) for _, least, which in self.unfit.values()]
        for fam in fams:
            found = self.lightest(fam) if fam not in self.unfit else None
            if found is not None:
                options_.append((found[0].summary(), found[1]))
        which, worst = min(options_, key=lambda o: o[1].total) if options_ else ("", None)
        text = infeasible_message(
            model, self.cluster.name, self.cluster.num_devices, self.batch, worst, which,
            self.cluster.devices_per_node(), constraints=describe(self.constraints))
        return InfeasibleError(text + self.rungs.host_note(self.graph.num_params, self.cluster))

    def failure(self, model: str) -> Exception:
        """Why no finalist came out (``run_search`` raises it): the constraints exclude every
        candidate, nothing fits in memory, or every finalist failed when priced."""
        prof = self.profile
        reasons: list[Reason] = []
        valid = families(self.cluster.num_devices, batch=self.batch, layers=prof.num_layers,
                         heads=prof.heads, tp_widths=prof.tp_widths(), pruned=reasons,
                         cps=self.possible_cps)
        where = (f"{model} on {self.cluster.name} ({self.cluster.num_devices} devices, batch "
                 f"{self.batch})")
        error = no_plan_error(
            where, self.cluster.num_devices, valid, reasons, self.mesh_allowed,
            describe(self.constraints),
            lambda: all(self.lightest(f) is None for f in self.mesh_allowed),
            self.failed_finalists)
        return error if error is not None else self.infeasible(self.mesh_allowed, model)


def run_search(graph: CapturedGraph, cluster: Cluster, *, batch: int, model: str,
               time_budget_s: float | None, progress: bool, constraints: Mapping[str, Any],
               finalists: int, timer: PhaseTimer,
               memory_headroom: MemoryHeadroom = DEFAULT_HEADROOM) -> Plan:
    """Steps 1–6 on a captured graph (the public wrapper is :func:`fxplan.inter_op.search`)."""
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
    best = done[0]
    if best.fallback:
        log.info(best.note)  # a layout decision, shown in the report with the fallbacks
    fallbacks = state.fallbacks + best.placements.fallbacks + ([best.note] if best.fallback else [])
    return build_plan(graph, cluster, model=model, batch=batch, best=best,
                      runners_up=done[1:4], pruned=state.pruned, fallbacks=fallbacks,
                      search_time_s=budget.elapsed(), timings=timer.rounded(),
                      visited=state.visited)
