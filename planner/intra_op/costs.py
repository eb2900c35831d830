"""The prices the intra-op solver needs, as a protocol: any object with these two methods can
drive :func:`~fxplan.intra_op.solve.solve_intra_op` (tests use synthetic ones).

* ``node_price(op, strategy, …)`` — seconds of the op's own work under a strategy (forward
  and, when training, backward), seconds of the communication the strategy implies (the op's
  collectives, the gradient sync of the parameters it owns), and the bytes it keeps resident
  (its parameter shards with their gradient and optimizer state, its saved activations).
* ``edge_price(tensor, src, dst, consumer_split, requires_grad)`` — seconds to bring a tensor
  produced with placements ``src`` to the placements ``dst`` its consumer needs, and, when
  training, to bring the gradient back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from fxplan.sharding.api import NodeStrategies
from fxplan.sharding.context import Operand
from fxplan.core.placements import Placements
from fxplan.sharding.strategy import OpStrategy

__all__ = ["NodePrice", "CostModel"]


@dataclass(frozen=True)
class NodePrice:
    """One node under one strategy: seconds of compute and of communication, bytes held."""

    compute_s: float
    comm_s: float
    memory_bytes: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s


class CostModel(Protocol):
    """What :func:`~fxplan.intra_op.solve.solve_intra_op` asks about prices."""

    def node_price(self, op: NodeStrategies, strategy: OpStrategy, *, requires_grad: bool,
                   owned_params: Sequence[int]) -> NodePrice:
        """Price ``op`` under ``strategy``; ``owned_params`` are the operand indices of the
        parameters whose memory and gradient sync this node pays (a tied alias pays once)."""

    def edge_price(self, tensor: Operand, src: Placements, dst: Placements,
                   consumer_split: Sequence[bool], requires_grad: bool) -> float:
        """Seconds of the reshard ``src → dst`` of ``tensor`` (and of its gradient back)."""
