"""fxplan's planner: ``search`` a captured graph on a cluster for a :class:`Plan`.

``planner.plan(model, cluster, …)`` (capture, search and rewrite in one call) lives in
:func:`planner.api.plan` and is imported on first call. ``planner.plan`` and
``planner.search`` are also the packages/modules of those names (``planner.plan.Plan``,
``planner.search.partition``); both module objects are callable, so ``planner.plan(...)`` and
``planner.search(...)`` call the functions the architecture contract names.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import planner.search as search  # callable package: planner.search(...) → search.search
from planner.plan import Plan, load_plan

__all__ = ["Plan", "load_plan", "plan", "search"]


class _CallablePlanModule(types.ModuleType):
    """``planner.plan(...)`` calls :func:`planner.api.plan` (imported on first call)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from planner.api import plan as run_plan

        return run_plan(*args, **kwargs)


sys.modules["planner.plan"].__class__ = _CallablePlanModule
plan = sys.modules["planner.plan"]
