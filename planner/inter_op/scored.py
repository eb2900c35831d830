"""A candidate placed and scored by the closed form ``T̂`` (:mod:`fxplan.inter_op.surrogate`),
as the inter-op search ranks it (:mod:`fxplan.inter_op.driver`, steps 3–4)."""

from __future__ import annotations

from dataclasses import dataclass

from fxplan.core.config import ParallelConfig

__all__ = ["ROUND_OFF", "Scored"]

#: Relative margin of the pipeline bound against the ``K``-th best ``T̂``: the two sum the same
#: seconds in different orders.
ROUND_OFF = 1e-9


@dataclass
class Scored:
    """A placed candidate and its ``T̂``, seconds."""

    config: ParallelConfig
    surrogate_s: float
