"""fxplan: an auto-parallel planner and distributed-graph compiler for PyTorch.

    import fxplan
    plan = fxplan.search("gpt-1.7b", "dgx-a100-80g:nodes=4", batch=512)   # -> Plan
    sharded = fxplan.plan(model, "local-cpu:devices=4", inputs=..., batch=16)
    plan = fxplan.load_plan("plan.json")

* :func:`capture` — a model spec or module as an annotated fx graph (:mod:`fxplan.passes`);
* :func:`search` — the search of a model on a cluster for a :class:`Plan` (:mod:`fxplan.inter_op`,
  with the intra-op placement solver in :mod:`fxplan.intra_op`);
* :func:`plan` — capture, search and apply in one call (:mod:`fxplan.api`);
* :class:`Plan` and :func:`load_plan` — the plan and its versioned JSON (:mod:`fxplan.core.plan`);
* :class:`UserError` — the root of every error a user can fix.

The repository's folders are the sub-packages: ``planner/`` is this package itself,
``cluster_specs/``, ``passes/``, ``cost_model/`` and ``examples/`` are mapped to
:mod:`fxplan.cluster_specs`, :mod:`fxplan.passes`, :mod:`fxplan.cost_model` and
:mod:`fxplan.examples`. The public names are imported on first use, so importing a leaf
package (``fxplan.cluster_specs``) does not pull in torch, OR-Tools or the search.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fxplan.core.errors import UserError
from fxplan.core.lazy_names import lazy_names

__version__ = "0.1.0"

#: public name -> module that defines it
_PUBLIC: dict[str, str] = {
    "capture": "fxplan.api",
    "plan": "fxplan.api",
    "search": "fxplan.api",
    "Plan": "fxplan.core.plan",
    "PlanError": "fxplan.core.plan",
    "load_plan": "fxplan.core.plan",
}

__all__ = ["Plan", "PlanError", "UserError", "__version__", "capture", "load_plan", "plan",
           "search"]

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.api import capture, plan, search
    from fxplan.core.plan import Plan, PlanError, load_plan


__getattr__ = lazy_names(__name__, _PUBLIC, globals())
