"""A ZeRO stage per pipeline rank, chosen with the stage split.

A candidate placed at one ZeRO stage (its stage split and recomputed layers fixed, see
:mod:`fxplan.inter_op.stage_split`) may run each pipeline rank ``s`` at its own stage
``z_s ∈ Z``, ``Z`` the on-device stages the plan-wide ``zero`` may take for the family (its
memory rungs without offload, :func:`fxplan.inter_op.offload.memory_rungs`: 0–3 with
``dp > 1``, less those the runtime cannot run beside the candidate's schedule; no mixing
under offload, nor when the constraints name ``zero_stage``, the stages one plan-wide choice
may take, as an expert's grid does). A rank with fewer activations in flight (the later
ranks of 1F1B) or fewer layers can then afford a lower stage, with fewer collectives, than
the one the heaviest rank needs.

**Independence.** Rank ``s``'s memory ``M_s(z)`` (:mod:`fxplan.inter_op.stage_memory`: its
states and ZeRO-3 buffers) and its surrogate terms — ``w_s(z)``, its work per microbatch,
and ``e_s(z) = exposed_s + post_s + opt_s``, its seconds once per step
(:func:`fxplan.inter_op.surrogate.rank_terms`) — read only its own stage (the pipeline
messages and the tied weights' all-reduce do not read it); so each is priced once per
``z ∈ Z`` from the configuration with ``z`` on every rank and the same split.

**Tied weights.** The one coupling: a weight tied between the first and the last stage (the
embedding and the head) on two ranks is summed between them, and where one keeps its gradient
as FSDP2's dp shard (ZeRO-2/3, ZeRO-1 beside tp or ep) and the other whole, the sharded one
gathers it first (:func:`cost_model.step.stage_costs._tied_sync`), a term neither rank's own
configuration has. So both holders take stages of one gradient layout: the choice below runs
once per layout, with both holders limited to its stages, and the cheaper is kept (exact, as
the optimum has one of the two layouts). The runtime runs either; only the search keeps
them alike.

**The choice is exact for** ``T̂``. With ``b = (p−1)/v``,

    T̂(z) = b·max_s w_s(z_s) + max_s (m·w_s(z_s) + e_s(z_s))

is non-decreasing in every rank's ``w_s`` and ``e_s``, but one rank's cheaper ``m·w + e`` may
come with a larger ``w`` that raises the bubble term of all, so ranks cannot simply each take
their cheapest stage. Fix a cap ``W`` on ``max_s w_s``: then the ranks decouple, each taking
among its stages that fit (``M_s(z) ≤ C_s − r_s − H_s``) and have ``w_s(z) ≤ W`` the one that
minimises ``m·w_s + e_s``. Let ``z*`` be optimal and ``W* = max_s w_s(z*_s)``, one of the
finitely many values ``w_s(z)``; at ``W = W*`` the decoupled choice has ``max_s w_s ≤ W*`` and
a second term no larger than ``z*``'s (``z*`` is feasible there), hence ``T̂`` no larger.
Trying every ``W`` among the ``p·|Z|`` values finds the minimum exactly, in
``O(p²·|Z|²)``. Ties go to the lower stage; the mixed stages replace the candidate only
when their ``T̂`` is lower than its own (by more than round-off). The simulator re-prices
every finalist (:func:`cost_model.step.estimate.estimate`, which prices each rank under its
own stage).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from fxplan.core.config import ParallelConfig
from fxplan.cost_model.host.host_overhead import fsdp_params
from fxplan.inter_op.profile import SegmentProfile
from fxplan.inter_op.stage_devices import rank_limits
from fxplan.inter_op.stage_memory import DeviceMemory, stage_totals
from fxplan.inter_op.surrogate import bubble_weight, rank_terms

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster

__all__ = ["RankOptions", "choose_zero_stages", "mix_zero_stages", "rank_options",
           "tied_holders"]

#: Relative gain below which the mixed stages are a round-off tie, not cheaper: the plan
#: keeps one stage for all ranks.
_ROUND_OFF = 1e-9


class RankOptions:
    """Per pipeline rank and ZeRO stage (columns ``zeros``): ``w`` the work per microbatch,
    ``e`` the seconds once per step, ``fits`` whether the rank fits its memory."""

    def __init__(self, zeros: Sequence[int], w: np.ndarray, e: np.ndarray,
                 fits: np.ndarray) -> None:
        self.zeros, self.w, self.e, self.fits = tuple(zeros), w, e, fits

    def limited(self, ranks: Sequence[int], columns: np.ndarray) -> "RankOptions":
        """The same options with ``ranks`` allowed only the stages of ``columns`` (a mask
        over :attr:`zeros`)."""
        fits = self.fits.copy()
        fits[list(ranks)] &= columns
        return RankOptions(self.zeros, self.w, self.e, fits)


def rank_options(placed: ParallelConfig, zeros: Sequence[int], prof: SegmentProfile,
                 profs: list[SegmentProfile] | None,
                 mems: DeviceMemory | tuple[DeviceMemory, ...], cluster: Cluster) -> RankOptions:
    """Each rank's terms and fit at each stage of ``zeros`` (module docstring,
    "Independence"), from ``placed``'s split at each stage on every rank. ``prof``,
    ``profs``: ``placed``'s profiles; ``mems``: its ranks' memory."""
    w, e, fits = [], [], []
    limit = rank_limits(mems)
    for z in zeros:
        c = placed.replace(zero_stage=z, zero_stages=None)
        fit = np.broadcast_to(np.asarray(stage_totals(c, prof, mems) <= limit), (placed.pp,))
        # a stage no rank fits at is never chosen: its terms are not priced
        w_z, e_z = (rank_terms(c, prof, cluster, profs) if fit.any() else
                    (np.full(placed.pp, np.inf), np.full(placed.pp, np.inf)))
        w.append(w_z)
        e.append(e_z)
        fits.append(fit)
    return RankOptions(zeros, np.array(w).T, np.array(e).T, np.array(fits).T)


def choose_zero_stages(c: ParallelConfig,
                       options: RankOptions) -> tuple[tuple[int, ...], float] | None:
    """The stage of every rank minimising ``T̂`` (module docstring, "exact") and that
    ``T̂``, or ``None`` when some rank fits at no stage. ``c``: the candidate (its ``m``,
    ``p``, ``v``)."""
    m, b = c.num_microbatches, bubble_weight(c)
    w, e, fits = options.w, options.e, options.fits
    if not fits.any(axis=1).all():
        return None
    best: tuple[float, tuple[int, ...]] | None = None
    cost = m * w + e
    for cap in np.unique(w[fits]):
        allowed = fits & (w <= cap)
        if not allowed.any(axis=1).all():
            continue
        # argmin takes the first of equal costs: the lower stage (zeros ascending)
        pick = np.argmin(np.where(allowed, cost, np.inf), axis=1)
        rows = np.arange(len(pick))
        t = float(b * w[rows, pick].max() + cost[rows, pick].max())
        if best is None or t < best[0]:
            best = (t, tuple(options.zeros[k] for k in pick))
    if best is None:
        return None
    return best[1], best[0]


def tied_holders(c: ParallelConfig, prof: SegmentProfile) -> tuple[int, ...]:
    """The two pipeline ranks holding a weight tied between the first and the last stage
    (the embedding and the head), or ``()`` when there is none or one rank holds both."""
    first, last = 0, c.schedule.placement(c.pp * c.virtual_stages - 1, c.pp)[0]
    return (first, last) if prof.tied_params > 0 and first != last else ()


def mix_zero_stages(placed: ParallelConfig, zeros: Sequence[int], prof: SegmentProfile,
                    profs: list[SegmentProfile] | None,
                    mems: DeviceMemory | tuple[DeviceMemory, ...], cluster: Cluster,
                    estimate_s: float) -> tuple[ParallelConfig, float] | None:
    """``placed`` with a ZeRO stage per pipeline rank and its ``T̂``, when that ``T̂`` is below
    ``estimate_s`` (``placed``'s own); ``None`` otherwise, or when ``placed`` offloads, has one
    pipeline rank or ``zeros`` offers one stage. The stages chosen may all be equal: one
    stage for every rank, cheaper on this split than the stage the split was made for
    (another stage's own split may have been slower)."""
    zeros = sorted(set(zeros))
    if placed.pp == 1 or placed.dp == 1 or placed.offload != "none" or len(zeros) < 2:
        return None
    options = rank_options(placed, zeros, prof, profs, mems, cluster)
    holders = tied_holders(placed, prof)
    if holders:   # one gradient layout on both holders (module docstring, "Tied weights")
        layout = np.array([fsdp_params(placed.replace(zero_stage=z, zero_stages=None))
                           for z in zeros])
        found = [choose_zero_stages(placed, options.limited(holders, layout == kind))
                 for kind in (False, True)]
        chosen = min((f for f in found if f is not None), key=lambda f: f[1], default=None)
    else:
        chosen = choose_zero_stages(placed, options)
    if chosen is None:
        return None
    stages, t = chosen
    if not t < estimate_s * (1.0 - _ROUND_OFF):
        return None
    # the same T̂ as surrogate_step_s prices the mixed configuration (its per-rank terms);
    # equal stages collapse to the plain zero (ParallelConfig)
    return placed.replace(zero_stage=max(stages), zero_stages=stages), t
