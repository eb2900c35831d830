"""fxplan's planner.

* :func:`search` — the inter-op search of a captured graph on a cluster for a :class:`Plan`
  (:mod:`planner.inter_op`, with the intra-op placement solver in :mod:`planner.intra_op`);
* :func:`plan` — capture, search and apply in one call, returning a sharded module when
  torch.distributed is initialised (:mod:`planner.api`);
* :class:`Plan` and :func:`load_plan` — the plan and its versioned JSON (:mod:`planner.plan_spec`).
"""

from __future__ import annotations

from planner.api import plan
from planner.inter_op import search
from planner.plan_spec import Plan, PlanError, load_plan

__all__ = ["Plan", "PlanError", "load_plan", "plan", "search"]
