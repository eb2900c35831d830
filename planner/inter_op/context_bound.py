"""Which context-parallel degrees the search offers a family: only as many as memory needs.

For a family ``(tp, pp, dp)`` the possible degrees are :func:`fxplan.inter_op.space.
context_degrees` (``cp | dp``, ``2·cp | s``, ``(dp/cp) | batch``) that the constraints allow.
Each rank of a CP group runs ``1/cp`` of every sequence, so at a fixed microbatch ``b`` a rank
computes the same tokens per step at every ``cp`` (``m = batch·cp/(dp·b)`` microbatches of
``b·s/cp`` tokens each); what ``cp`` buys is activation memory (÷ ``cp``) and what it costs is
the K/V exchange (:mod:`fxplan.cost_model.context_parallel`). Let ``cp*`` be the smallest
possible degree at which one sequence per microbatch fits **without recompute**
(:func:`fits`, the search's per-rank memory at ``b = 1``, ``recompute = none``, even stages,
the family's first ZeRO/offload rung). A larger ``cp`` then has nothing left to buy: it runs
the same tokens per rank with more K/V traffic, so

    offered = {cp possible : cp ≤ cp*}      (all possible ones when none fits)

and the larger ones are recorded as pruned (kind :data:`~fxplan.inter_op.reasons.CONTEXT`).
This is exact for ``pp = 1``; with ``pp > 1`` a larger ``cp`` would also cut each microbatch
finer and so shorten the pipeline bubble, which finer microbatches of one sequence cannot
do — a second-order gain the bound gives up (it keeps long-context searches as fast as those
without CP: at short sequences ``cp* = 1`` and nothing is added).
"""

from __future__ import annotations

from typing import Callable

from fxplan.inter_op.reasons import CONTEXT, Reason
from fxplan.inter_op.space import Family

__all__ = ["offered_cps"]


def offered_cps(family: Family, possible: tuple[int, ...],
                fits: Callable[[int], bool]) -> tuple[tuple[int, ...], Reason | None]:
    """``(offered degrees, the reason for the others or None)`` (module docstring);
    ``possible`` in increasing order, ``fits(cp)`` the no-recompute memory test."""
    star = next((cp for cp in possible if fits(cp)), None)
    if star is None:
        return possible, None
    offered = tuple(cp for cp in possible if cp <= star)
    dropped = possible[len(offered):]
    if not dropped:
        return offered, None
    return offered, Reason(
        f"{family}: cp={'|'.join(map(str, dropped))} not offered: at cp={star} one sequence "
        f"per microbatch already fits without recompute, and a larger cp runs the same tokens "
        f"per rank with more K/V traffic", CONTEXT, bound=True)
