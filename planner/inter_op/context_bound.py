"""Which context-parallel degrees the search offers a family: only as many as memory needs.

For a family ``(tp, pp, dp)`` the possible degrees are :func:`fxplan.inter_op.space.
context_degrees` (``cp | dp``, ``2·cp | s``, ``(dp/cp) | batch``) that the constraints allow.
Each rank of a CP group runs ``1/cp`` of every sequence, so at a fixed microbatch ``b`` a rank
computes the same tokens per step at every ``cp`` (``m = batch·cp/(dp·b)`` microbatches of
``b·s/cp`` tokens each); what ``cp`` buys is activation memory (÷ ``cp``) and what it costs is
the K/V exchange (:mod:`fxplan.cost_model.parallel.context_parallel`). Let ``cp*`` be the smallest
possible degree at which one sequence per microbatch fits **without recompute**
(the search's per-rank memory at ``b = 1``, ``recompute = none``, even stages,
the family's first ZeRO/offload rung: :func:`plain_config`). A larger ``cp`` then has nothing left to buy: it runs
the same tokens per rank with more K/V traffic, so

    offered = {cp possible : cp ≤ cp*}      (all possible ones when none fits)

and the larger ones are recorded as pruned (kind :data:`~fxplan.inter_op.reasons.CONTEXT`).
Second, a floor on the work per rank: the search offers ``cp`` only where each rank keeps at
least :data:`MIN_TOKENS_PER_RANK` tokens of every sequence (``s/cp ≥ 4096``, two chunks of
2048). The ÷``cp`` pricing assumes the kernels run as efficiently on ``s/cp`` tokens as on
``s``, and the all-gathered K/V (``O(s)`` bytes per layer) is amortised only by attention
work of ``O(s²/cp)``; both hold for chunks of thousands of tokens (where Megatron-Core and
torchtitan use CP: 8k–16k tokens per rank at 128k), not for a 2k-token sequence cut into
slivers. So a model at ``s < 8192`` is searched without CP (as fast as before CP existed);
a ``cp`` constraint that excludes ``cp = 1`` lifts this floor (the user asked for it).

The memory bound is exact for ``pp = 1``; with ``pp > 1`` a larger ``cp`` would also cut each microbatch
finer and so shorten the pipeline bubble, which finer microbatches of one sequence cannot
do — a second-order gain the bound gives up (it keeps long-context searches as fast as those
without CP: at short sequences ``cp* = 1`` and nothing is added).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from fxplan.core.config import ParallelConfig
from fxplan.core.schedule import Schedule
from fxplan.inter_op.constraints import allowed, only
from fxplan.inter_op.partition import balanced_counts
from fxplan.inter_op.reasons import CONTEXT, Reason
from fxplan.inter_op.space import Family, context_degrees

__all__ = ["Dropped", "MIN_TOKENS_PER_RANK", "context_reasons", "offered_cps", "plain_config",
           "possible_cps", "short_reason"]

#: The fewest tokens of each sequence a context-parallel rank keeps (module docstring).
MIN_TOKENS_PER_RANK = 4096

#: ``(family, the degrees not offered, cp*)``.
Dropped = tuple[Family, tuple[int, ...], int]

#: Families named in a reason (the rest are counted).
SHOW_FAMILIES = 3


def possible_cps(dp: int, seq: int | None, batch: int,
                 constraints: Mapping[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(possible degrees, the short ones left out)``: the context-parallel degrees a family
    with ``dp`` data-parallel ranks can run (:func:`fxplan.inter_op.space.context_degrees`) that
    the ``cp`` constraint allows and, unless it asks for ``cp > 1``, that leave each rank at
    least :data:`MIN_TOKENS_PER_RANK` tokens (``s/cp ≥ 4096``; the others are the short ones,
    for :func:`short_reason`)."""
    want = only(constraints, ("cp",))
    out = tuple(c for c in context_degrees(dp, seq, batch)
                if allowed(ParallelConfig(dp=c, cp=c), want))
    short: tuple[int, ...] = ()
    if not want or allowed(ParallelConfig(), want):
        short = tuple(c for c in out if c > 1 and seq // c < MIN_TOKENS_PER_RANK)
        out = tuple(c for c in out if c not in short)
    return out, short


def plain_config(family: Family, rung: tuple[int, str], cp: int, batch: int, seq: int | None,
                 layers: int) -> ParallelConfig:
    """The configuration ``family`` is tested at ``cp`` with (``cp*``, module docstring): one
    sequence per microbatch (``m = batch·cp/dp``), no recompute, ``layers`` split evenly over
    ``pp`` stages, sequence parallelism where ``tp > 1`` and ``tp·cp | s``, 1F1B unless
    ``m < pp`` (then GPipe), at ``rung`` (ZeRO stage, offload)."""
    m = batch // (family.dp // cp)
    sp = family.tp > 1 and (seq is None or seq % (family.tp * cp) == 0)
    return ParallelConfig(dp=family.dp, tp=family.tp, pp=family.pp, microbatch_size=1,
                          num_microbatches=m,
                          schedule=Schedule("1f1b" if family.pp == 1 or m >= family.pp
                                            else "gpipe"),
                          zero_stage=rung[0], offload=rung[1], sequence_parallel=sp, cp=cp,
                          stage_layers=balanced_counts(layers, family.pp))


def offered_cps(family: Family, possible: tuple[int, ...],
                fits: Callable[[int], bool]) -> tuple[tuple[int, ...], Dropped | None]:
    """``(offered degrees, what was left out or None)`` (module docstring); ``possible`` in
    increasing order, ``fits(cp)`` the no-recompute memory test."""
    if len(possible) <= 1:
        return possible, None          # nothing to choose: no memory test
    star = next((cp for cp in possible if fits(cp)), None)
    if star is None:
        return possible, None
    offered = tuple(cp for cp in possible if cp <= star)
    dropped = possible[len(offered):]
    return offered, ((family, dropped, star) if dropped else None)


def short_reason(seq: int, cps: tuple[int, ...]) -> Reason:
    """Why the degrees ``cps`` (all > 1) were not offered to any family: ``seq/cp`` below
    :data:`MIN_TOKENS_PER_RANK`."""
    return Reason(
        f"cp={'|'.join(map(str, cps))} not offered: seq={seq} leaves fewer than "
        f"{MIN_TOKENS_PER_RANK} tokens per rank ({seq}/{cps[0]} = {seq // cps[0]}), too short a "
        f"chunk for its attention to amortise the K/V all-gather (context parallelism is for "
        f"long sequences; --constrain cp=… asks for it anyway)", CONTEXT, bound=True)


def context_reasons(dropped: list[Dropped]) -> list[Reason]:
    """One reason per ``cp*`` for the families whose larger degrees were left out."""
    by_star: dict[int, list[Dropped]] = {}
    for item in dropped:
        by_star.setdefault(item[2], []).append(item)
    out = []
    for star, items in sorted(by_star.items()):
        named = "; ".join(f"{fam} (cp={'|'.join(map(str, cps))})"
                          for fam, cps, _ in items[:SHOW_FAMILIES])
        more = f"; … {len(items) - SHOW_FAMILIES} more" if len(items) > SHOW_FAMILIES else ""
        out.append(Reason(
            f"cp > {star} not offered to {len(items)} famil{'y' if len(items) == 1 else 'ies'} "
            f"({named}{more}): at cp={star} one sequence per microbatch already fits without "
            f"recompute, and a larger cp runs the same tokens per rank with more K/V traffic",
            CONTEXT, bound=True))
    return out
