"""What one rank trains: the plan as applied on this rank and everything its loop needs
(:func:`fxplan.rank.prepare.prepare_run` makes it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Run"]


@dataclass
class Run:
    """What one rank trains: the plan as applied here and everything the loop needs."""

    rank: int
    events: Any
    plan: Any
    replanned: Any
    bundle: Any
    cluster: Any
    identity: tuple[str, str]          # (model spec, fingerprint): in every manifest
    precision: Any
    sharded: Any
    resume: Any                        # the located checkpoint (``--resume``), or None
    config: Any
    optimizer: Any
    data: Any
    flops: Any
    no_flops: str | None
    loss: Any                          # the loss the steps minimise (rank.loss.training_loss)
