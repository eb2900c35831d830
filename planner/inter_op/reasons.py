"""Pruning reasons with their kind and numbers: text a person reads, fields a program checks.

A :class:`Reason` *is* the reason's text (a ``str``), so ``plan.pruned`` stays a list of
sentences, and carries what the text states as data:

* ``kind``: one of :data:`KINDS` (memory, the time bound, a duplicate finalist, the cost
  model's refusal, a degree that does not divide, more stages than layers, the runtime's
  refusal to apply it to this model);
* ``needed_gib`` / ``capacity_gib``: for memory reasons, what the named configuration needs on
  its heaviest rank and what a device holds (``needed_gib`` is a lower bound when ``bound``);
* ``config``: the configuration the text names, in :meth:`ParallelConfig.to_string` form
  (stages included), so ``estimate`` can price exactly it;
* ``family_wide``: the text claims that *no* variant of the mesh family fits (at the ZeRO
  stage it names, for a bound), so the family's lightest variant must not fit either;
* ``layout``: the layout the config was priced with, where not the default Megatron layout.

:meth:`Reason.detail` is the JSON form kept in ``Plan.pruned_detail`` (one object per entry
of ``Plan.pruned``, same order).
"""

from __future__ import annotations

from typing import Any

__all__ = ["KINDS", "MEMORY", "TIME_BOUND", "DUPLICATE", "REFUSED", "DIVIDE", "STAGES",
           "CONTEXT", "RUNTIME", "Reason"]

MEMORY = "does not fit in memory"
TIME_BOUND = "cannot beat the best found (time bound)"
DUPLICATE = "same plan as another finalist"
REFUSED = "refused by the cost model"
DIVIDE = "degree does not divide"
STAGES = "more stages than layers"
CONTEXT = "more context parallelism than memory needs"
RUNTIME = "the runtime cannot apply it to this model"
#: Every kind, most useful first (the order the report groups them in).
KINDS: tuple[str, ...] = (MEMORY, TIME_BOUND, DUPLICATE, REFUSED, DIVIDE, STAGES, CONTEXT,
                          RUNTIME)


class Reason(str):
    """A pruning reason: its text, and the kind and numbers it states (module docstring)."""

    kind: str
    needed_gib: float | None
    capacity_gib: float | None
    config: str | None
    family_wide: bool
    bound: bool
    layout: str | None

    def __new__(cls, text: str, kind: str, *, needed_gib: float | None = None,
                capacity_gib: float | None = None, config: str | None = None,
                family_wide: bool = False, bound: bool = False,
                layout: str | None = None) -> "Reason":
        if kind not in KINDS:
            raise ValueError(f"unknown pruning kind {kind!r}; kinds: {KINDS}")
        self = super().__new__(cls, text)
        self.kind, self.needed_gib, self.capacity_gib = kind, needed_gib, capacity_gib
        self.config, self.family_wide, self.bound, self.layout = config, family_wide, bound, layout
        return self

    def detail(self) -> dict[str, Any]:
        """The fields that are set, as JSON (``kind`` always)."""
        out: dict[str, Any] = {"kind": self.kind}
        for key in ("needed_gib", "capacity_gib", "config", "layout"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.family_wide:
            out["family_wide"] = True
        if self.bound:
            out["bound"] = True
        return out
