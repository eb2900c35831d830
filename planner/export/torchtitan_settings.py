"""``Settings``: what a plan asks of torchtitan, in the keys of one torchtitan version.

:func:`fxplan.export.torchtitan.settings` derives it from a plan; the release TOML
(:mod:`fxplan.export.torchtitan`) and current torchtitan's config function
(:mod:`fxplan.export.torchtitan_recipe`) are two ways of writing it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Settings"]


@dataclass
class Settings:
    """``training``/``parallelism``: key → value in ``version``'s names; ``model`` torchtitan's
    model and flavor (``None``: it has none for the plan); ``recompute`` fxplan's policy;
    ``notes`` what differs from the plan, ``changes`` the same as ParallelConfig fields (for
    the price note)."""

    version: str
    model: tuple[str, str] | None
    training: dict[str, Any] = field(default_factory=dict)
    parallelism: dict[str, Any] = field(default_factory=dict)
    recompute: str = "none"
    fp8: bool = False
    notes: list[str] = field(default_factory=list)
    changes: dict[str, Any] = field(default_factory=dict)
