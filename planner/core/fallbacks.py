"""Fallbacks: every deviation of a running program from its plan, recorded in one place.

The rewrite passes and the runtime both realise a plan, and both may realise a part of it
differently (a default placement, a name the model does not have, a style torch cannot apply).
Each such deviation is one readable line ``[where] what runs instead``, logged once on the
``fxplan.runtime`` logger and kept, in order and without repeats, in the list the launch and
the report show.
"""

from __future__ import annotations

import logging

__all__ = ["record_fallback"]

logger = logging.getLogger("fxplan.runtime")


def record_fallback(fallbacks: list[str] | None, line: str) -> bool:
    """Record one fallback, a deviation of the running program from its plan (``[where]
    what runs instead``): logged as a warning and appended to ``fallbacks`` (the lines the
    launch and the report show, in order, without repeats) unless it is already there;
    ``fallbacks=None`` logs only. Returns whether the line was new."""
    if fallbacks is not None and line in fallbacks:
        return False
    logger.warning("fxplan runtime fallback: %s", line)
    if fallbacks is not None:
        fallbacks.append(line)
    return True
