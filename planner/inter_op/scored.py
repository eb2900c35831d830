"""A candidate placed and scored by the closed form ``T̂`` (:mod:`fxplan.inter_op.surrogate`),
as the inter-op search ranks it (:mod:`fxplan.inter_op.driver`, steps 3–4)."""

from __future__ import annotations

from dataclasses import dataclass

from fxplan.core.config import ParallelConfig

__all__ = ["ROUND_OFF", "Scored"]

#: Relative margin within which two closed-form times are a round-off tie (the same seconds
#: summed in different orders): a bound against the ``K``-th best ``T̂``, a per-rank choice
#: (:mod:`~fxplan.inter_op.stage_zero`) or a joint split (:mod:`~fxplan.inter_op.joint_split`)
#: against the time it must beat; a tie keeps what was there.
ROUND_OFF = 1e-9


@dataclass
class Scored:
    """A placed candidate and its ``T̂``, seconds."""

    config: ParallelConfig
    surrogate_s: float
