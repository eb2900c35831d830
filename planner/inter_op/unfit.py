"""Why a family's candidates did not fit: the search's record of them and its reason text.

A candidate *does not fit* when at none of its allowed memory rungs (:mod:`fxplan.inter_op.
offload`) some rank's memory stays within its limit, ``M_s + H_s ≤ C_s`` for every pipeline rank
``s``. How far a rank is from fitting is its *overflow* ``M_s + H_s − C_s`` (:func:`overflow`;
negative: room left), which on one kind of device orders ranks as their totals do. Per family
the search keeps the number of ranked variants that did not fit and the lightest of them, the
one whose worst rank overflows least (:func:`record_unfit`), and states one reason per family
(:func:`unfit_reasons`):

* some variant of the family fit: "N … did not fit; the lightest of them …";
* none of the ranked ones fit and neither does the family's lightest variant (the search's
  ``lightest``, which the ranking may never have reached): "none of N … fits; the family's
  lightest … needs X GiB" (a claim about the whole family);
* none of the ranked ones fit but the family's lightest does: the lighter variants were not
  ranked (the compute lower bound or the time budget stopped the search before them), and the
  reason says so with the lightest's memory: the family is not "too big", it was slower than
  the plans found.
"""

from __future__ import annotations

from typing import Callable

from fxplan.core.config import ParallelConfig
from fxplan.cost_model.memory.breakdown import GIB, MemoryBreakdown
from fxplan.inter_op.reasons import MEMORY, Reason
from fxplan.inter_op.space import Family
from fxplan.inter_op.stage_memory import limit_text

__all__ = ["Unfit", "overflow", "record_unfit", "unfit_reasons"]

#: family → (variants that fit at no allowed rung, the lightest of them as (its heaviest
#: rank's breakdown, its config)).
Unfit = dict[Family, tuple[int, MemoryBreakdown, ParallelConfig]]


def overflow(m: MemoryBreakdown) -> float:
    """Bytes over the rank's own capacity less its headroom (negative: room left); on one
    kind of device the order of the totals."""
    return m.total + m.headroom - m.capacity


def record_unfit(unfit: Unfit, family: Family, worst: MemoryBreakdown,
                 config: ParallelConfig) -> None:
    """Count one more variant of ``family`` that fit nowhere (``config``, its heaviest rank
    ``worst``), keeping the lightest."""
    count, least, which = unfit.get(family, (0, None, config))
    if least is None or overflow(worst) < overflow(least):
        least, which = worst, config
    unfit[family] = (count + 1, least, which)


def unfit_reasons(unfit: Unfit, fitted: set[Family],
                  lightest: Callable[[Family], tuple[ParallelConfig, MemoryBreakdown] | None],
                  stopped: str) -> list[Reason]:
    """One reason per family of ``unfit`` (module docstring); ``fitted`` the families with a
    variant that fit, ``lightest(family)`` the family's lightest candidate the constraints allow
    and its heaviest rank's memory (``None`` when they allow none), ``stopped`` why the ranking
    stopped before the end of its queue (``""`` when it reached the end)."""
    out: list[Reason] = []
    for fam, (count, least, which) in sorted(unfit.items()):
        # the device of the rank that overflows most
        cap, limit = (least.capacity - least.headroom) / GIB, limit_text(least.capacity,
                                                                         least.headroom)
        variant = dict(kind=MEMORY, capacity_gib=cap, needed_gib=least.total / GIB,
                       config=which.to_string())
        needs = f"needs {least.total / GIB:.1f} GiB > {limit}"
        found = None if fam in fitted else lightest(fam)
        if fam in fitted:
            out.append(Reason(
                f"{fam}: {count} microbatch/recompute/schedule variants did not fit at any "
                f"allowed ZeRO stage; the lightest of them ({which.summary()}, even "
                f"split) {needs}", **variant))
        elif found is None or overflow(found[1]) > 0:
            c, m = found if found is not None else (which, least)
            out.append(Reason(
                f"{fam}: none of {count} microbatch/recompute/schedule variants fits at any "
                f"allowed ZeRO stage; the family's lightest ({c.summary()}, even split) "
                f"needs {m.total / GIB:.1f} GiB > {limit}", MEMORY, capacity_gib=cap,
                needed_gib=m.total / GIB, config=c.to_string(), family_wide=True))
        else:
            why = stopped or "they were not ranked"
            out.append(Reason(
                f"{fam}: the {count} microbatch/recompute/schedule variants ranked did not "
                f"fit at any allowed ZeRO stage (the lightest of them, {which.summary()} "
                f"with an even split, {needs}); lighter variants fit ({found[0].summary()} "
                f"needs {found[1].total / GIB:.1f} GiB) but {why}", **variant))
    return out
