"""The inter-op search: the fastest configuration that fits, and why it won.

**Problem.** Given a captured graph, a cluster of ``N`` devices with capacity ``C`` each and a
global batch ``B``, choose ``x = (tp, pp, dp, b, schedule, zero, recompute, sp, stages)`` with
``pp·dp·tp = N`` and ``B = dp·b·m`` to

    minimise  T(x)     (the step simulator, :func:`cost_model.estimate.estimate`)
    s.t.      M_s(x) ≤ C  for every pipeline rank s        (:mod:`cost_model.memory`)

**Method** (branch and bound over an enumerated space):

1. *Families* ``(tp, pp, dp)`` (:func:`fxplan.inter_op.space.families`), invalid ones pruned
   with their reason.
2. *Memory bound per (family, zero)* (:func:`fxplan.inter_op.bounds.memory_lower_bound`):
   ``k_z(dp)·Ψ/pp + reserved > C`` prunes the pair before any microbatch variant is tried;
   the lowest surviving ZeRO stage ``z_min`` is where each candidate starts.
3. *Candidates* inside the families (:func:`fxplan.inter_op.space.options`), sorted by the
   time bound ``m·W/pp`` (:func:`fxplan.inter_op.bounds.time_lower_bound`).
4. For each in order, until its bound reaches the ``K``-th best estimate (then nothing later
   can enter the top ``K``) or the time budget ends (once at least one candidate fits): for
   ``z = z_min … 3`` (those the constraints allow) partition the layers by the DP of
   :mod:`fxplan.inter_op.partition` under the memory cap, check the per-rank memory with the
   estimate's own formula (:mod:`fxplan.inter_op.stage_memory`) and rank the first stage
   that fits by the closed form ``T̂`` (:mod:`fxplan.inter_op.surrogate`). Higher ZeRO stages
   are not tried once one fits: at equal everything else they move at least as many bytes.
5. *Placements*: the intra-op solver places the graph (repeated blocks sharing variables) on
   the ``(1, tp)`` slice of the stage mesh once per distinct tp degree of the ``K`` best by
   ``T̂`` (:mod:`fxplan.inter_op.placements`).
6. *Finalists*: each is priced by the step simulator with the placements it would carry,
   ``T(x, π)``, against the default Megatron layout ``T(x, μ)``, keeping the cheaper
   (:mod:`fxplan.inter_op.pricing`); the fastest that fits wins, the next three are the
   runners-up. So the plan's step time is the price of the placements the plan carries.
   A ``sequence_parallel`` constraint binds the placements too: solver placements whose
   sequence parallelism it does not allow are replaced by the default Megatron layout with
   the candidate's (allowed) ``sp``, recorded in ``Plan.fallbacks``.

**Heterogeneous clusters** (several device groups, :mod:`fxplan.inter_op.stage_devices`): a
family whose pipeline stages straddle two groups is pruned (each stage on one device group);
every pipeline rank's layers are priced on its own group's device and checked against its own
capacity, so the partition of step 4 gives a slow or small group fewer layers, and the bounds
of steps 2–3 use the pipeline's mean free memory and the fastest group's work.

Nothing is dropped silently: every pruned family or candidate group carries its reason with
the arithmetic, and fallbacks (time budget, intra-op solver) are logged and kept in the plan.
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from fxplan.core.config import CostModelError, ParallelConfig
from fxplan.cost_model.memory import GIB, MemoryBreakdown
from fxplan.core.plan import Plan
from fxplan.inter_op.bounds import memory_lower_bound, memory_reason, time_lower_bound
from fxplan.inter_op.build_plan import build_plan
from fxplan.inter_op.constraints import (ConstraintError, allowed, describe,
                                          validate_constraints)
from fxplan.inter_op.infeasible import InfeasibleError, infeasible_message
from fxplan.inter_op.partition import balanced_counts, partition_layers
from fxplan.inter_op.placements import IntraOpCache
from fxplan.inter_op.pricing import Priced, price_finalist
from fxplan.inter_op.profile import ModelProfile, SegmentProfile
from fxplan.inter_op.reasons import DIVIDE, DUPLICATE, MEMORY, REFUSED, TIME_BOUND, Reason
from fxplan.inter_op.progress import Budget, PhaseTimer, progress_bar
from fxplan.inter_op.space import MAX_MICROBATCH, Family, families, options
from fxplan.inter_op.stage_devices import StageDevices, stage_devices, straddled_stage
from fxplan.inter_op.stage_memory import (DeviceMemory, partition_inputs,
                                         stage_memory, stage_totals)
from fxplan.inter_op.surrogate import surrogate_step_s

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


def _overflow(m: MemoryBreakdown) -> float:
    """Bytes over the rank's own capacity (negative: room left); on one kind of device the
    order of the totals."""
    return m.total - m.capacity


def _zeros(family: Family) -> tuple[int, ...]:
    return (0, 1, 2, 3) if family.dp > 1 else (0,)


def _probe(family: Family, zero_stage: int = 0) -> ParallelConfig:
    """A configuration of ``family`` to test the mesh and ZeRO constraints on."""
    return ParallelConfig(dp=family.dp, tp=family.tp, pp=family.pp, zero_stage=zero_stage)


class _Search:
    """State of one search (see the module docstring for the steps)."""

    def __init__(self, graph: CapturedGraph, cluster: Cluster, batch: int,
                 constraints: Mapping[str, Any], finalists: int, timer: PhaseTimer,
                 budget: Budget, progress: bool) -> None:
        self.graph, self.cluster, self.batch = graph, cluster, batch
        self.constraints = validate_constraints(constraints, cluster.num_devices)
        self.K = finalists
        self.timer, self.budget, self.progress = timer, budget, progress
        self.profile = ModelProfile(graph, cluster)
        self.mem = DeviceMemory.of(cluster.device(0))
        self.pruned: list[Reason] = []
        self.fallbacks: list[str] = []
        self.partitions: dict[tuple, Any] = {}
        self.devices: dict[tuple[int, int], StageDevices] = {}
        # family → (variants that fit at no allowed ZeRO stage, the lightest of them as
        # (heaviest rank's breakdown, its config)); families with at least one fitting variant
        self.unfit: dict[Family, tuple[int, MemoryBreakdown, ParallelConfig]] = {}
        self.fitted: set[Family] = set()
        self.mesh_allowed: list[Family] = []    # valid families the tp/pp/dp constraints allow
        self.failed_finalists: list[Reason] = []
        self.visited = 0
        # why the ranking stopped before the end of its queue ("" when it reached the end)
        self.stopped = ""
        self.intra_op = IntraOpCache(graph, cluster, budget)

    # -- steps 1–2 ------------------------------------------------------------------------
    def families(self) -> dict[Family, int]:
        """Valid families and their lowest ZeRO stage passing the memory bound."""
        prof = self.profile
        fams = families(self.cluster.num_devices, batch=self.batch, layers=prof.num_layers,
                        heads=prof.heads, tp_widths=prof.tp_widths(), pruned=self.pruned)
        out: dict[Family, int] = {}
        for fam in fams:
            if not allowed(_probe(fam), {k: v for k, v in self.constraints.items()
                                   if k in ("tp", "pp", "dp")}):
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
            lightest = prof.get(fam.tp, True, "full", 1)
            devs = self._stage_devices(fam.pp, fam.dp * fam.tp)
            mem = devs.mean_memory()
            for zero in self._zeros(fam):
                need = memory_lower_bound(fam, zero, lightest, mem)
                if need <= mem.capacity:
                    out[fam] = zero
                    break
                self.pruned.append(memory_reason(fam, zero, need, lightest, mem,
                                                 self._lightest_at(fam, zero),
                                                 mean=not devs.uniform))
        return out

    def _stage_devices(self, pp: int, per_stage: int) -> StageDevices:
        key = (pp, per_stage)
        if key not in self.devices:
            self.devices[key] = stage_devices(self.cluster, pp, per_stage)
        return self.devices[key]

    def _profiles(self, c: ParallelConfig) -> tuple[SegmentProfile, list[SegmentProfile] | None,
                                                    StageDevices]:
        """``c``'s profile on rank 0's device, one per pipeline rank where the ranks are on
        different device groups (``None`` on one kind of device), and the ranks' devices."""
        devs = self._stage_devices(c.pp, c.dp * c.tp)
        key = (c.tp, c.sequence_parallel, c.recompute, c.microbatch_size)
        prof = self.profile.get(*key)
        if devs.uniform:
            return prof, None, devs
        return prof, [self.profile.get(*key, device=g) for g in devs.groups], devs

    # -- step 4 ---------------------------------------------------------------------------
    def _partition(self, c: ParallelConfig) -> ParallelConfig | None:
        prof, profs, devs = self._profiles(c)
        mems = devs.memory if profs is not None else self.mem
        if profs is None:
            inputs = partition_inputs(c, prof, mems)
            time = prof.layer_time
        else:   # each virtual stage j priced on its pipeline rank's group (stage_devices)
            inputs = partition_inputs(c, prof, mems, ends=(profs[0], profs[-1]))
            time = np.stack([profs[j % c.pp].layer_time for j in range(c.pp * c.virtual_stages)])
        key = (c.tp, c.sequence_parallel, c.recompute, c.microbatch_size, c.pp, c.virtual_stages,
               c.dp, inputs.cap.tobytes(), inputs.extra_time.tobytes(),
               inputs.fixed_bytes.tobytes(), inputs.inflight.tobytes(),
               inputs.layer_state[:1].tobytes())
        if key not in self.partitions:
            self.partitions[key] = partition_layers(time, inputs.layer_state,
                                                    prof.acts, inputs.extra_time,
                                                    inputs.fixed_bytes, inputs.inflight,
                                                    inputs.cap)
        part = self.partitions[key]
        # The DP's memory rows are conservative (stage_memory docstring); the per-rank check
        # decides, and the most even split is the second chance when the DP found none.
        tries = ([part.counts] if part is not None else []) + \
            [balanced_counts(prof.layers, c.pp * c.virtual_stages)]
        caps = (mems.capacity if isinstance(mems, DeviceMemory)
                else np.array([m.capacity for m in mems]))
        for counts in tries:
            placed = c.replace(stage_layers=counts)
            if (stage_totals(placed, prof, mems) <= caps).all():
                return placed
        return None

    def rank(self, fams: dict[Family, int]) -> list[_Scored]:
        """Steps 3–4: the ``K`` best candidates by ``T̂``."""
        prof = self.profile
        queue: list[tuple[float, int, ParallelConfig]] = []
        groups = (None,) if len(self.cluster.device_groups) == 1 else self.cluster.device_groups
        for fam, zmin in fams.items():
            for c in options(fam, batch=self.batch, layers=prof.num_layers,
                             seq=prof.segments.seq):
                c = c.replace(zero_stage=zmin)
                if allowed(c, {k: v for k, v in self.constraints.items() if k != "zero_stage"}):
                    lb = min(time_lower_bound(c, prof.get(c.tp, c.sequence_parallel,
                                                          c.recompute, c.microbatch_size,
                                                          device=g))
                             for g in groups)
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

    def _zeros(self, fam: Family) -> list[int]:
        """The ZeRO stages of ``fam`` the constraints allow, lowest first."""
        want = self.constraints.get("zero_stage")
        return [z for z in _zeros(fam)
                if want is None or allowed(_probe(fam, z), {"zero_stage": want})]

    def _score(self, c: ParallelConfig) -> _Scored | None:
        family = Family.of(c)
        zeros = [z for z in self._zeros(family) if z >= c.zero_stage]
        for zero in zeros:
            placed = self._partition(c.replace(zero_stage=zero))
            if placed is not None:
                prof, profs, _ = self._profiles(c)
                self.fitted.add(family)
                return _Scored(placed, surrogate_step_s(placed, prof, self.cluster, profs))
        heaviest = c.replace(zero_stage=zeros[-1] if zeros else c.zero_stage,
                             stage_layers=balanced_counts(self.profile.num_layers,
                                                          c.pp * c.virtual_stages))
        prof, profs, devs = self._profiles(c)
        worst = max(stage_memory(heaviest, prof, self.mem if profs is None else devs.memory),
                    key=_overflow)
        count, least, which = self.unfit.get(family, (0, None, heaviest))
        if least is None or _overflow(worst) < _overflow(least):
            least, which = worst, heaviest
        self.unfit[family] = (count + 1, least, which)
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
        """Steps 5–6b: price each finalist with its placements (:mod:`fxplan.inter_op.pricing`);
        the fitting ones, fastest first, one per distinct plan."""
        out: list[Priced] = []
        seen: dict[ParallelConfig, tuple[int, str]] = {}
        for index, scored in enumerate(ranked):
            c = scored.config
            if out and self.budget.expired():
                text = (f"time budget {self.budget.seconds:g} s reached after pricing {index} of "
                        f"{len(ranked)} finalists; the best priced so far is kept")
                log.warning(text)
                self.fallbacks.append(text)
                break
            try:
                priced = price_finalist(
                    self.graph, self.cluster, c, self.batch, self.intra_op,
                    sequence_parallel=self.constraints.get("sequence_parallel"))
            except CostModelError as err:
                self.failed_finalists.append(Reason(
                    f"{c.summary()}: the cost model refused it: {err}", REFUSED))
                continue
            if not priced.est.fits:
                over = max(priced.est.memory, key=_overflow)   # against its own device's
                worst, capacity = over.total, over.capacity
                self.failed_finalists.append(Reason(
                    f"{priced.config.summary()}: simulated peak {worst / GIB:.1f} GiB > "
                    f"{capacity / GIB:.0f} GiB", MEMORY, needed_gib=worst / GIB,
                    capacity_gib=capacity / GIB, config=priced.config.to_string(),
                    layout=priced.layout))
                continue
            # One entry per configuration: two candidates can price to the same configuration
            # (one with the solver's placements, one with the default layout); the faster stays.
            key = priced.config
            if key in seen:
                index_, first = seen[key]
                kept, dropped = ((priced, out[index_]) if priced.est.step_time_s
                                 < out[index_].est.step_time_s else (out[index_], priced))
                out[index_] = kept
                layouts = (f"; the {kept.layout} layout is kept ({kept.est.step_time_s:.4g} s "
                           f"≤ {dropped.est.step_time_s:.4g} s with the {dropped.layout} layout)"
                           if kept.layout != dropped.layout else "")
                self.pruned.append(Reason(
                    f"{c.summary()}: priced with its placements it is "
                    f"{priced.config.summary()}, already a finalist (as {first}){layouts}",
                    DUPLICATE))
                continue
            seen[key] = (len(out), c.summary())
            out.append(priced)
        self.pruned.extend(self.failed_finalists)
        out.sort(key=lambda p: p.est.step_time_s)
        return out

    def unfit_reasons(self) -> None:
        """One reason per family with ranked variants that fit at no allowed ZeRO stage.

        * some variant of the family fit: "N … did not fit; the lightest of them …";
        * none of the ranked ones fit and neither does the family's lightest variant
          (:meth:`lightest`, which the ranking may never have reached): "none of N … fits;
          the family's lightest … needs X GiB" (a claim about the whole family);
        * none of the ranked ones fit but the family's lightest does: the lighter variants
          were not ranked (the compute lower bound or the time budget stopped the search
          before them), and the reason says so with the lightest's memory: the family is not
          "too big", it was slower than the plans found.
        """
        for fam, (count, least, which) in sorted(self.unfit.items()):
            cap = least.capacity / GIB   # the device of the rank that overflows most
            variant = dict(kind=MEMORY, capacity_gib=cap, needed_gib=least.total / GIB,
                           config=which.to_string())
            needs = f"needs {least.total / GIB:.1f} GiB > {cap:.0f} GiB"
            found = None if fam in self.fitted else self.lightest(fam)
            if fam in self.fitted:
                self.pruned.append(Reason(
                    f"{fam}: {count} microbatch/recompute/schedule variants did not fit at any "
                    f"allowed ZeRO stage; the lightest of them ({which.summary()}, even "
                    f"split) {needs}", **variant))
            elif found is None or found[1].total > found[1].capacity:
                c, m = found if found is not None else (which, least)
                self.pruned.append(Reason(
                    f"{fam}: none of {count} microbatch/recompute/schedule variants fits at any "
                    f"allowed ZeRO stage; the family's lightest ({c.summary()}, even split) "
                    f"needs {m.total / GIB:.1f} GiB > {cap:.0f} GiB", MEMORY, capacity_gib=cap,
                    needed_gib=m.total / GIB, config=c.to_string(), family_wide=True))
            else:
                stopped = self.stopped or "they were not ranked"
                self.pruned.append(Reason(
                    f"{fam}: the {count} microbatch/recompute/schedule variants ranked did not "
                    f"fit at any allowed ZeRO stage (the lightest of them, {which.summary()} "
                    f"with an even split, {needs}); lighter variants fit ({found[0].summary()} "
                    f"needs {found[1].total / GIB:.1f} GiB) but {stopped}", **variant))

    def lightest(self, fam: Family) -> tuple[ParallelConfig, MemoryBreakdown] | None:
        """The lightest candidate of ``fam`` the constraints allow (evenly split, the highest
        allowed ZeRO stage, the smallest allowed microbatch) and its heaviest rank's memory;
        ``None`` when the constraints allow none."""
        zeros = self._zeros(fam)
        prof = self.profile
        found = [c for c in options(fam, batch=self.batch, layers=prof.num_layers,
                                    seq=prof.segments.seq)
                 if zeros and allowed(c.replace(zero_stage=zeros[-1]), self.constraints)]
        if not found:
            return None
        mb = min(c.microbatch_size for c in found)
        best = None
        for c in found:
            if c.microbatch_size != mb:
                continue
            c = c.replace(zero_stage=zeros[-1],
                          stage_layers=balanced_counts(prof.num_layers, c.pp * c.virtual_stages))
            seg = prof.get(c.tp, c.sequence_parallel, c.recompute, mb)
            devs = self._stage_devices(c.pp, c.dp * c.tp)
            worst = max(stage_memory(c, seg, self.mem if devs.uniform else devs.memory),
                        key=_overflow)
            if best is None or _overflow(worst) < _overflow(best[1]):
                best = (c, worst)
        return best

    def _lightest_at(self, fam: Family, zero: int) -> ParallelConfig | None:
        """The variant of ``fam`` the memory bound at ``zero`` speaks of: the smallest
        microbatch, full recompute, sequence parallelism where offered, evenly split (the
        bound holds for every variant, this one is the lightest in activations)."""
        prof = self.profile
        found = list(options(fam, batch=self.batch, layers=prof.num_layers,
                             seq=prof.segments.seq))
        if not found:
            return None
        best = min(found, key=lambda c: (c.microbatch_size, c.recompute != "full",
                                         not c.sequence_parallel))
        return best.replace(zero_stage=zero, stage_layers=balanced_counts(
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
        return InfeasibleError(infeasible_message(
            model, self.cluster.name, self.cluster.num_devices, self.batch, worst, which,
            self.cluster.devices_per_node(), constraints=describe(self.constraints)))

    def failure(self, model: str) -> Exception:
        """Why no finalist came out (``run_search`` raises it): the constraints exclude every
        candidate, nothing fits in memory, or every finalist failed when priced."""
        prof = self.profile
        reasons: list[Reason] = []
        valid = families(self.cluster.num_devices, batch=self.batch, layers=prof.num_layers,
                         heads=prof.heads, tp_widths=prof.tp_widths(), pruned=reasons)
        where = (f"{model} on {self.cluster.name} ({self.cluster.num_devices} devices, batch "
                 f"{self.batch})")
        if not valid:
            shown = "; ".join(map(str, reasons[:4])) + (f"; … {len(reasons) - 4} more"
                                              if len(reasons) > 4 else "")
            return InfeasibleError(f"{where}: no valid mesh factorisation pp·dp·tp = "
                                   f"{self.cluster.num_devices}: {shown}")
        if valid and not self.mesh_allowed:
            return ConstraintError(
                f"{where}: the constraints {describe(self.constraints)} exclude every mesh "
                "family; the valid (tp, pp, dp) are "
                + ", ".join(f"({f.tp}, {f.pp}, {f.dp})" for f in valid))
        if self.mesh_allowed and all(self.lightest(f) is None for f in self.mesh_allowed):
            return ConstraintError(
                f"{where}: the constraints {describe(self.constraints)} exclude every candidate "
                "of the allowed mesh families (microbatch sizes divide batch/dp up to "
                f"{MAX_MICROBATCH}; 1f1b needs m ≥ pp, interleaved:v needs m mod pp = 0 and "
                "pp·v ≤ layers; sequence parallelism needs tp > 1)")
        if self.failed_finalists:
            return InfeasibleError(
                f"{where}: every finalist failed when priced by the step simulator: "
                + "; ".join(self.failed_finalists))
        return self.infeasible(self.mesh_allowed, model)


def run_search(graph: CapturedGraph, cluster: Cluster, *, batch: int, model: str,
               time_budget_s: float | None, progress: bool, constraints: Mapping[str, Any],
               finalists: int, timer: PhaseTimer) -> Plan:
    """Steps 1–6 on a captured graph (the public wrapper is :func:`fxplan.inter_op.search`)."""
    budget = Budget(time_budget_s)
    state = _Search(graph, cluster, batch, constraints, finalists, timer, budget, progress)
    with timer("inter-op"):
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
