"""Steps 3–4 of the inter-op search (:mod:`fxplan.inter_op.driver`): the candidates visited in
increasing order of their lower bound on ``T̂``, each scored, until the bound passes the
``K``-th best ``T̂`` (or the time budget ends); the ``K`` best are the finalists.
"""

from __future__ import annotations

import heapq
import logging
import math
from typing import TYPE_CHECKING, Any, Callable, Iterator

from fxplan.core.config import ParallelConfig
from fxplan.inter_op.bounds import pipeline_lower_bound, time_lower_bound
from fxplan.inter_op.constraints import allowed
from fxplan.inter_op.joint_rungs import Deferred
from fxplan.inter_op.offload import Rung
from fxplan.inter_op.profile import ModelProfile
from fxplan.inter_op.progress import Budget, progress_bar
from fxplan.inter_op.reasons import TIME_BOUND, Reason
from fxplan.inter_op.scored import ROUND_OFF, Scored
from fxplan.inter_op.space import Family

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster

__all__ = ["Ranking"]

log = logging.getLogger("fxplan.planner")

#: Constraints the memory rungs apply (:mod:`fxplan.inter_op.offload`), not the candidates.
_RUNG_KEYS = ("zero_stage", "offload")


class Ranking:
    """Steps 3–4 as methods of the search's state (:class:`fxplan.inter_op.search_state.
    _Search`), whose attributes they read and whose ranking records they fill."""

    cluster: Cluster
    profile: ModelProfile
    constraints: dict[str, Any]
    per_stage: bool
    K: int
    budget: Budget
    progress: bool
    visited: int
    stopped: str
    pruned: list[Reason]
    fallbacks: list[str]
    ranked_before: set[ParallelConfig]
    _options: Callable[..., Iterator[ParallelConfig]]
    _runnable: Callable[[ParallelConfig, list[Rung]], list[Rung]]
    _score: Callable[[ParallelConfig, float], "Scored | None"]
    _exact: Callable[..., "Scored | None"]
    _deferred: list[Deferred] | None
    fitted: set[Family]

    def rank(self, fams: dict[Family, int]) -> list[Scored]:
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
        best: list[tuple[float, tuple[float, int], Scored]] = []
        # two policies chosen per stage may both find that no layer needs recompute: one
        # configuration, ranked once
        scored_configs: set[ParallelConfig] = set()
        skipped, computed = 0, []   # pruned by the pipeline bound; the compute bounds pruned
        self._deferred = []
        with progress_bar(len(queue), "inter-op search", self.progress) as bar:
            for position, (lb, seq, c, piped) in enumerate(queue):
                if len(best) >= self.K:
                    kth = -best[0][0]
                    if max(lb, piped) > kth * (1.0 + ROUND_OFF):
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
                    if piped > kth * (1.0 + ROUND_OFF):
                        skipped += 1
                        bar.advance()
                        continue
                if best and self.budget.expired():
                    self._budget_fallback(position, len(queue))
                    self.stopped = "the time budget ran out before they were ranked"
                    break
                self.visited += 1
                bar.advance()
                waiting = len(self._deferred)
                scored = self._score(c, -best[0][0] if len(best) >= self.K else math.inf)
                for entry in self._deferred[waiting:]:
                    entry.key = (lb, seq)
                if scored is None or scored.config in scored_configs \
                        or scored.config in self.ranked_before:
                    if scored is not None:   # a duplicate: its exact split is the other's
                        del self._deferred[waiting:]
                    continue
                scored_configs.add(scored.config)
                item = (-scored.surrogate_s, (lb, seq), scored)
                if len(best) < self.K:
                    heapq.heappush(best, item)
                elif item > best[0]:
                    heapq.heapreplace(best, item)
        self._run_deferred(best, scored_configs)
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

    def _run_deferred(self, best: list[tuple[float, tuple[float, int], Scored]],
                      scored_configs: set[ParallelConfig]) -> None:
        """The exact joint splits the loop left (:class:`~fxplan.inter_op.joint_rungs.
        Deferred`), in visiting order, each bounded by its candidate's score and the ``K``-th
        best ``T̂`` as it stands (lower than at the candidate's turn: fewer counts to price);
        one that beats them replaces its candidate's entry among the ``K`` best, or enters
        them. Every candidate whose exact answer enters the ``K`` best does: its score is
        below the ``K``-th best of the end, which the loop's bounds never passed."""
        deferred, self._deferred = self._deferred or [], None
        for entry in deferred:
            kth = -best[0][0] if len(best) >= self.K else math.inf
            bound = kth if entry.scored is None else min(entry.scored.surrogate_s, kth)
            found = None if self.budget.expired() else \
                self._exact(entry.placed, entry.runs, bound * (1.0 + ROUND_OFF))
            if found is None and entry.unfit is not None:
                entry.unfit()
            if found is None or found.config in scored_configs \
                    or found.config in self.ranked_before:
                continue
            if entry.scored is None:
                self.fitted.add(Family.of(found.config))
            scored_configs.add(found.config)
            item = (-found.surrogate_s, entry.key, found)
            at = next((i for i, held in enumerate(best) if held[2] is entry.scored), None)
            if at is not None:
                best[at] = item
                heapq.heapify(best)
            elif len(best) < self.K:
                heapq.heappush(best, item)
            elif item > best[0]:
                heapq.heapreplace(best, item)

    def next_round(self, fams: dict[Family, int]) -> list[Scored]:
        """Step 7's next round: the ``K`` best candidates by ``T̂`` not ranked before (every
        finalist of the last round was refused by the runtime); the time bound's reasons are
        those of this ranking."""
        self.pruned = [r for r in self.pruned if r.kind != TIME_BOUND]
        return self.rank(fams)

    def _budget_fallback(self, index: int, total: int) -> None:
        text = (f"time budget {self.budget.seconds:g} s reached after {index} of {total} "
                "candidates; the best found so far is kept (not proven best)")
        log.warning(text)
        self.fallbacks.append(text)
