"""A ZeRO stage and an offload per pipeline rank, chosen with the stage split.

A candidate placed at one memory rung (its stage split and recomputed layers fixed, see
:mod:`fxplan.inter_op.stage_split`) may run each pipeline rank ``s`` at its own rung
``r_s = (z_s, o_s) ∈ R``, a ZeRO stage and an offload policy (``zero_stages``,
``offload_stages``). ``R`` is the rungs the plan-wide choice may take for the family
(:func:`fxplan.inter_op.offload.memory_rungs`: the on-device stages 0–3 with ``dp > 1``, and in
the search's offload pass — or in every pass, with the split chosen jointly below — the offload
rungs too), less those the runtime cannot run beside the
candidate's schedule and the offload rungs the runtime cannot run on a rank
(:func:`runnable_rungs`: FSDP2's CPU offload needs the rank's stage sharded by FSDP2). A
constraint naming ``zero_stage`` or ``offload`` keeps that one plan-wide: ``R`` holds only the
candidate's own stage or offload (both named: no choice per rank, as an expert's grid does).
A rank with fewer activations in flight (the later ranks of 1F1B) or fewer layers can then
afford a lower rung — fewer collectives, no host copies — than the one the heaviest rank needs.

**Independence.** Rank ``s``'s device memory ``M_s(r)`` (:mod:`fxplan.inter_op.stage_memory`:
its states, less what it offloads, and its ZeRO-3 buffers) and its surrogate terms — ``w_s(r)``,
its work per microbatch (with ``offload=optimizer+params``'s copies of each shard), and
``e_s(r) = exposed_s + post_s + opt_s``, its seconds once per step (its offload row included:
:meth:`fxplan.inter_op.surrogate.RungTerms.terms`) — read only its own rung (the pipeline messages
and the tied weights' all-reduce do not read it); so each is priced once per ``r ∈ R`` from
the configuration with ``r`` on every rank and the same split.

**Host memory** is the one sum over ranks: a node's host bytes are those of every rank on it
(:func:`cost_model.memory.offload.with_host_check`). A rank may take an offload rung when its
nodes hold the host bytes with that rung on *every* rank. That is sufficient for any mix: with
``dp > 1`` every offload rung keeps the same ``16·Ψ_s/dp`` bytes on the host
(:func:`cost_model.memory.breakdown.model_state_bytes`) and an on-device rung none, so a mix's
node total is at most the all-offload one. It is exact unless host memory binds, where a mix
of offloading and on-device ranks might fit a node that every rank offloading does not.

**Tied weights.** The one coupling of times: a weight tied between the first and the last
stage (the embedding and the head) on two ranks is summed between them, and where one keeps
its gradient as FSDP2's dp shard (ZeRO-2/3, ZeRO-1 beside tp or ep) and the other whole, the
sharded one gathers it first (:func:`cost_model.step.cross_stage.tied_sync`), a term neither
rank's own configuration has; and the runtime keeps the copies of a tied weight equal only
where both holders offload alike (:func:`fxplan.runtime.apply.tied.offload_refusal`). So both
holders take rungs of one kind — gradient layout and whether they offload: the choice below
runs once per kind, with both holders limited to its rungs, and the cheapest is kept (exact, as
the optimum has one of the kinds).

**The choice is exact for** ``T̂``. With ``b = (p−1)/v`` and ``δ_s`` the slack of rank ``s``
in the pipeline's drain (:func:`fxplan.inter_op.surrogate.drain_slack`, the split's: no rung
moves it),

    T̂(r) = (m + b)·max_s w_s(r_s) + max_s (e_s(r_s) − δ_s)

is non-decreasing in every rank's ``w_s`` and ``e_s``, but one rank's cheaper ``e`` may come
with a larger ``w`` that raises the first term for all, so ranks cannot simply each take
their cheapest rung. Fix a cap ``W`` on ``max_s w_s``: then the ranks decouple, each taking
among its rungs that fit (``M_s(r) ≤ C_s − r_s − H_s``, and the host check above) and have
``w_s(r) ≤ W`` the one that minimises ``e_s``. Let ``r*`` be optimal and
``W* = max_s w_s(r*_s)``, one of the finitely many values ``w_s(r)``; at ``W = W*`` the
decoupled choice has ``max_s w_s ≤ W*`` and a second term no larger than ``r*``'s (``r*`` is
feasible there), hence ``T̂`` no larger. Trying every ``W`` among the ``p·|R|`` values finds
the minimum exactly, in ``O(p²·|R|²)``. The mixed rungs replace the candidate only when
their ``T̂`` is lower than its own (by more than round-off). The simulator re-prices every
finalist (:func:`cost_model.step.estimate.estimate`, which prices each rank under its own
stage and offload).

**Ties.** Many choices share the least ``T̂``: with the slowest rank's ``w`` and the largest
``e_s − δ_s`` fixed, every other rank may take any rung of no more work and no more cost.
``T̂`` prices the pipeline's fill and drain as ``(p−1)/v`` times the slowest rank's work, but
in the step simulator the first microbatch's forward and the last one's backward pass every
rank in turn, each at its own ``w_s``: of two choices with equal ``T̂`` the one with less work
``Σ_s w_s`` is the faster (Llama 8 × 4096 on a DGX A100 at pp = 4, dp = 2, 69.3 GiB held
back, in the runtime's layout: rank 0 at ZeRO-3 or at ZeRO-1 with its optimizer offloaded,
both 5.1293 s by ``T̂``, hidden behind rank 2's host step; the simulator finds the second,
0.010 s less work in all, faster by 0.15 %). So each rank takes, among the rungs whose cost is
within the second term, the least work (:func:`least_work_rungs`; then the least cost, then
the earlier rung of the ladder: the lower stage, then no offload), and a round-off tie in
``T̂`` between caps goes to the choice with less work in all (:func:`before`).

**Offload that cannot win.** An offload rung ``(z, o)`` has the ``w_s`` of its on-device twin
``(z, none)`` (``optimizer``) or a larger one (``optimizer+params`` adds its copies to
``z_j``), and the same ``exposed_s + post_s``; only ``opt_s`` differs
(:class:`~fxplan.inter_op.surrogate.RungTerms`). Where the twin fits on every rank and the
offload rung's ``opt_s`` is no lower than the twin's on every rank, putting the twin in place
of that rung in any choice keeps it fitting (the twin fits everywhere; the host holds less)
and does not raise ``T̂``; ``ParallelConfig.shards_params_with_fsdp`` reads no offload, so
the twin keeps the rank's gradient layout. The rung is left out (:func:`rank_options` prices
neither its memory nor its terms) without changing the minimum, and ties go to the twin anyway
(earlier in the ladder). With tied holders a choice must keep both holders offloading alike,
so the offload rungs are left out only when every one of them is dominated (then every
offloading rank of a choice takes its twin, both holders included).

**With the split** (:data:`fxplan.inter_op.joint_rungs.JOINT_RUNGS`). The exact choice above is
for one split. The split comes from the partition DP at one rung on every rank
(:mod:`fxplan.inter_op.partition`), which balances the slowest stage under that rung's memory:
a split that fits only where some ranks take a high ZeRO stage or offload and others do not is
not among the plan-wide rungs' splits. Where it applies (one chunk per rank, identical layers,
one recompute policy on every layer), :mod:`fxplan.inter_op.joint_split`
chooses the split and the rungs together, exactly for ``T̂``: a DP over stages with
the rung in each stage's choice, for each cap on ``max_s w_s`` as above. Elsewhere the search
places the candidate at every rung of ``R`` (:meth:`fxplan.inter_op.joint_rungs.JointRungs.
_joint`), runs the exact choice on each distinct split and keeps the cheapest by ``T̂`` — exact
over the union of those splits, a heuristic over all splits.
``tests/inter_op/test_joint_rungs.py`` compares both with every split × every rung per rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from fxplan.core.config import ParallelConfig
from fxplan.core.config_fields import OFFLOAD_POLICIES
from fxplan.cost_model.host.host_overhead import offload_runs
from fxplan.inter_op.offload import Rung, host_fit_ranks
from fxplan.inter_op.profile import SegmentProfile
from fxplan.inter_op.scored import ROUND_OFF
from fxplan.inter_op.stage_devices import rank_limits
from fxplan.inter_op.stage_memory import DeviceMemory, rung_rows
from fxplan.inter_op.surrogate import RungTerms, bubble_weight, drain_slack

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster

__all__ = ["RankOptions", "before", "choose_rungs", "least_work_rungs", "mix_rungs",
           "rank_options", "runnable_rungs", "tied_holders", "with_rungs"]


class RankOptions:
    """Per pipeline rank and rung (columns ``rungs``, in the ladder's order): ``w`` the work
    per microbatch, ``e`` the seconds once per step, ``fits`` whether the rank fits its
    memory; per rank ``drain``, its step ``β_s`` of the pipeline's drain (no rung's)."""

    def __init__(self, rungs: Sequence[Rung], w: np.ndarray, e: np.ndarray,
                 fits: np.ndarray, drain: np.ndarray) -> None:
        self.rungs, self.w, self.e, self.fits, self.drain = tuple(rungs), w, e, fits, drain

    def limited(self, ranks: Sequence[int], columns: np.ndarray) -> "RankOptions":
        """The same options with ``ranks`` allowed only the rungs of ``columns`` (a mask
        over :attr:`rungs`)."""
        fits = self.fits.copy()
        fits[list(ranks)] &= columns
        return RankOptions(self.rungs, self.w, self.e, fits, self.drain)


def runnable_rungs(placed: ParallelConfig, rungs: Sequence[Rung]) -> list[Rung]:
    """``rungs`` less the offload rungs the runtime cannot run on a rank
    (:func:`~fxplan.cost_model.host.host_overhead.offload_runs`, the rule the runtime's
    :func:`fxplan.runtime.apply.offload.check_runnable` applies to each rank):
    ``optimizer+params`` only where FSDP2 shards the rank's parameters, ``optimizer`` at every
    ZeRO stage."""
    return [(z, o) for z, o in rungs if offload_runs(placed.uniform(z, o))]


def rank_options(placed: ParallelConfig, rungs: Sequence[Rung], prof: SegmentProfile,
                 profs: list[SegmentProfile] | None,
                 mems: DeviceMemory | tuple[DeviceMemory, ...], cluster: Cluster) -> RankOptions:
    """Each rank's terms and fit at each of ``rungs`` (module docstring, "Independence",
    "Host memory"), from ``placed``'s split at each rung on every rank; an offload rung its
    on-device twin dominates on every rank is left out (marked fitting nowhere, its memory and
    terms not priced: module docstring, "Offload that cannot win"). ``prof``, ``profs``:
    ``placed``'s profiles; ``mems``: its ranks' memory."""
    limit = rank_limits(mems)
    pricer = RungTerms(placed, prof, cluster, profs)
    nowhere = np.zeros(placed.pp, dtype=bool)
    fits: dict[Rung, np.ndarray] = {}
    on = [r for r in rungs if r[1] == "none"]
    for r, rows in zip(on, rung_rows(placed, on, prof, mems)):
        fits[r] = np.broadcast_to(np.asarray(rows.total <= limit), (placed.pp,))
    offload = [(z, o) for z, o in rungs if o != "none"]
    dominated = [(z, o) for z, o in offload if (z, "none") in fits and fits[(z, "none")].all()
                 and (pricer.optimizer_s(z, o) >= pricer.optimizer_s(z, "none")).all()]
    if tied_holders(placed, prof) and len(dominated) < len(offload):
        dominated = []      # all or none where the tied holders take one kind
    for r in dominated:
        fits[r] = nowhere
    off = [r for r in offload if r not in dominated]
    for (z, o), rows in zip(off, rung_rows(placed, off, prof, mems)):
        # and each rank's nodes hold every rank's host bytes at this rung
        fits[(z, o)] = np.asarray(rows.total <= limit) & host_fit_ranks(
            placed.uniform(z, o), rows.rows["host"], cluster)
    # a rung no rank fits at is never chosen: its terms are not priced
    never = (np.full(placed.pp, np.inf),) * 2
    w, e = zip(*(pricer.terms(*r) if fits[r].any() else never for r in rungs))
    return RankOptions(rungs, np.array(w).T, np.array(e).T,
                       np.array([fits[r] for r in rungs]).T, pricer.drain())


def choose_rungs(c: ParallelConfig, options: RankOptions) -> tuple[tuple, float] | None:
    """The rung of every rank minimising ``T̂`` (module docstring, "exact") and that ``T̂``,
    or ``None`` when some rank fits at no rung. ``c``: the candidate (its ``m``, ``p``,
    ``v``)."""
    scale = c.num_microbatches + bubble_weight(c)
    w, e, fits = options.w, options.e, options.fits
    if not fits.any(axis=1).all():
        return None
    best: tuple[float, float, np.ndarray] | None = None
    cost = e - drain_slack(c, options.drain)[:, None]
    rows = np.arange(len(w))
    for cap in np.unique(w[fits]):
        allowed = fits & (w <= cap)
        if not allowed.any(axis=1).all():
            continue
        # argmin takes the first of equal costs: the earlier rung of the ladder
        pick = np.argmin(np.where(allowed, cost, np.inf), axis=1)
        pick = least_work_rungs(w, cost, allowed, float(cost[rows, pick].max()))
        t = float(scale * w[rows, pick].max() + cost[rows, pick].max())
        if best is None or before(t, float(w[rows, pick].sum()), best[0], best[1]):
            best = (t, float(w[rows, pick].sum()), pick)
    if best is None:
        return None
    return tuple(options.rungs[k] for k in best[2]), best[0]


def least_work_rungs(w: np.ndarray, cost: np.ndarray, allowed: np.ndarray,
                     top: float) -> np.ndarray:
    """Per rank (a row of ``w``, ``cost``, ``allowed``; a column per rung), among its allowed
    rungs whose ``cost = e_s − δ_s`` is at most ``top`` — the second term of ``T̂``, which
    none of them raises — the one with the least work per microbatch ``w_s`` (then the least
    cost, then the earlier rung). ``T̂`` takes only ``max_s w_s`` from the work, but the step
    simulator's fill and drain pass every rank's (module docstring, "Ties"). Each row holds a
    rung of cost ``≤ top`` where ``top`` is the largest of the rows' least costs."""
    ok = allowed & (cost <= top)
    work = np.where(ok, w, np.inf)
    lightest = ok & (work == work.min(axis=1, keepdims=True))
    return np.argmin(np.where(lightest, cost, np.inf), axis=1)


def before(t: float, work: float, best_t: float, best_work: float) -> bool:
    """Whether a choice with ``T̂ = t`` and ``Σ_s w_s = work`` goes before the best so far:
    a lower ``T̂`` past round-off, or a round-off tie with less work in all (module
    docstring, "Ties")."""
    return t < best_t * (1.0 - ROUND_OFF) or (t <= best_t * (1.0 + ROUND_OFF)
                                              and work < best_work)


def tied_holders(c: ParallelConfig, prof: SegmentProfile) -> tuple[int, ...]:
    """The two pipeline ranks holding a weight tied between the first and the last stage
    (the embedding and the head), or ``()`` when there is none or one rank holds both."""
    first, last = 0, c.schedule.placement(c.pp * c.virtual_stages - 1, c.pp)[0]
    return (first, last) if prof.tied_params > 0 and first != last else ()


def mix_rungs(placed: ParallelConfig, rungs: Sequence[Rung], prof: SegmentProfile,
              profs: list[SegmentProfile] | None,
              mems: DeviceMemory | tuple[DeviceMemory, ...], cluster: Cluster,
              estimate_s: float) -> tuple[ParallelConfig, float] | None:
    """``placed`` with a ZeRO stage and an offload per pipeline rank and its ``T̂``, when that
    ``T̂`` is below ``estimate_s`` (``placed``'s own); ``None`` otherwise, or when ``placed``
    has one pipeline rank or one dp replica, or ``rungs`` (after :func:`runnable_rungs`)
    offers one rung. The rungs chosen may all be equal: one rung for every rank, cheaper on
    this split than the rung the split was made for (another rung's own split may have been
    slower)."""
    rungs = list(dict.fromkeys(runnable_rungs(placed, rungs)))
    if placed.pp == 1 or placed.dp == 1 or len(rungs) < 2:
        return None
    options = rank_options(placed, rungs, prof, profs, mems, cluster)
    holders = tied_holders(placed, prof)
    if holders:   # one kind of rung on both holders (module docstring, "Tied weights")
        kind = [(placed.uniform(z, o).shards_params_with_fsdp, o != "none") for z, o in rungs]
        found = [choose_rungs(placed, options.limited(holders, np.array([k == one for k in kind])))
                 for one in dict.fromkeys(kind)]
        chosen = min((f for f in found if f is not None), key=lambda f: f[1], default=None)
    else:
        chosen = choose_rungs(placed, options)
    if chosen is None:
        return None
    picked, t = chosen
    if not t < estimate_s * (1.0 - ROUND_OFF):   # a tie keeps one rung for all ranks
        return None
    # the same T̂ as surrogate_step_s prices the mixed configuration (its per-rank terms)
    return with_rungs(placed, picked), t


def with_rungs(placed: ParallelConfig, picked: Sequence[Rung]) -> ParallelConfig:
    """``placed`` with rung ``picked[s]`` on pipeline rank ``s`` (``zero_stages``,
    ``offload_stages``; equal entries collapse to the plain ZeRO stage and offload,
    :class:`~fxplan.core.config.ParallelConfig`)."""
    zeros = tuple(z for z, _ in picked)
    offloads = tuple(o for _, o in picked)
    return placed.replace(zero_stage=max(zeros), zero_stages=zeros,
                          offload=max(offloads, key=OFFLOAD_POLICIES.index),
                          offload_stages=offloads)
